#!/usr/bin/env bash
# `make deploy`: config/default with the operator's image set to IMG, as operator-sdk's Makefile
# does with `cd config/manager && kustomize edit set image controller=${IMG}`, but without editing
# config/manager: a kustomization in a temporary directory takes config/default as its resource
# and patches the manager container's image (and, when MEMCACHED_IMG / EXPORTER_IMG are set, its
# RELATED_IMAGE_MEMCACHED / RELATED_IMAGE_MEMCACHED_EXPORTER), so the git tree stays clean.
#
# Usage: IMG=image [MEMCACHED_IMG=image] [EXPORTER_IMG=image] [KUBECTL=kubectl] hack/deploy.sh apply|render
#   apply    kubectl apply --server-side -k the overlay (the cluster in KUBECONFIG)
#   render   print the manifests instead
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
KUBECTL="${KUBECTL:-kubectl}"
[[ -n "${IMG:-}" ]] || {
	echo "$0: IMG is not set (e.g. make deploy IMG=localhost/memcached-operator:0.1.0)" >&2
	exit 2
}
mode="${1:-apply}"
case "${mode}" in apply | render) ;; *)
	echo "usage: IMG=image [MEMCACHED_IMG=image] $0 apply|render" >&2
	exit 2
	;;
esac

overlay="$(mktemp -d "${TMPDIR:-/tmp}/memcached-operator-deploy.XXXXXX")"
trap 'rm -rf "${overlay}"' EXIT
# kustomize takes no absolute paths to other kustomizations: a relative one from the overlay.
base="$(python3 -c 'import os, sys; print(os.path.relpath(sys.argv[1], sys.argv[2]))' "${ROOT}/config/default" "${overlay}")"
env_patch=""
# The agent beside memcached (spec.auth) is the operator's own binary, so its image is IMG.
for pair in "RELATED_IMAGE_MEMCACHED=${MEMCACHED_IMG:-}" "RELATED_IMAGE_MEMCACHED_EXPORTER=${EXPORTER_IMG:-}" "RELATED_IMAGE_AGENT=${IMG}"; do
	[[ -n "${pair#*=}" ]] || continue
	[[ -n "${env_patch}" ]] || env_patch="            env:"
	env_patch+="$(printf '\n            - name: %s\n              value: "%s"' "${pair%%=*}" "${pair#*=}")"
done
cat >"${overlay}/kustomization.yaml" <<EOF
resources:
- ${base}
patches:
- patch: |-
    apiVersion: apps/v1
    kind: Deployment
    metadata:
      name: memcached-operator-controller-manager
      namespace: memcached-operator-system
    spec:
      template:
        spec:
          containers:
          - name: manager
            image: "${IMG}"
${env_patch}
EOF

if [[ "${mode}" == render ]]; then
	"${KUBECTL}" kustomize "${overlay}"
else
	"${KUBECTL}" apply --server-side -k "${overlay}"
fi
