#!/usr/bin/env bash
# `make deploy-local`: the operator as a pod, from its own image, on the real node of the embedded
# cluster in DIR (started by `make cluster-up-real`), deploying the local memcached image; the
# pods of NAMESPACE... (default: default) go to the real node as well.
#
# Usage: hack/deploy-local.sh DIR [NAMESPACE...]
set -euo pipefail

HACK_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
LOG_TAG=deploy-local
# shellcheck source=hack/lib.sh
source "${HACK_DIR}/lib.sh"
DIR="${1:?usage: hack/deploy-local.sh CLUSTER_DIR [NAMESPACE...]}"
shift
namespaces=("$@")
[[ ${#namespaces[@]} -gt 0 ]] || namespaces=(default)

[[ -f "${DIR}/env" ]] || die "no cluster in ${DIR} (make cluster-up-real)"
# shellcheck disable=SC1091
source "${DIR}/env"
export KUBECONFIG
[[ -n "${REAL_NODE_CONTAINERD_SOCKET:-}" ]] || die "the cluster in ${DIR} has no real node (make cluster-down cluster-up-real)"

OPERATOR_IMAGE="$("${HACK_DIR}/images.sh" import-operator "${REAL_NODE_CONTAINERD_SOCKET}")"

# Pods of these namespaces go to the real node (PodNodeSelector and PodTolerationRestriction
# admission): the node selector and the toleration of its taint. `make deploy`'s server-side
# apply of the operator's Namespace leaves these annotations alone.
for ns in memcached-operator-system "${namespaces[@]}"; do
	kubectl get namespace "${ns}" >/dev/null 2>&1 || kubectl create namespace "${ns}" >/dev/null
	kubectl annotate namespace "${ns}" --overwrite >/dev/null \
		scheduler.alpha.kubernetes.io/node-selector=type=real \
		scheduler.alpha.kubernetes.io/defaultTolerations='[{"key": "memcached-operator.dev/real-node", "operator": "Equal", "value": "true", "effect": "NoSchedule"}]'
done

IMG="${OPERATOR_IMAGE}" MEMCACHED_IMG="${MEMCACHED_IMAGE}" "${HACK_DIR}/deploy.sh" apply
kubectl rollout status -n memcached-operator-system deployment/memcached-operator-controller-manager --timeout=120s

cat <<MSG

  The operator runs as a pod on ${REAL_NODE_NAME} (image ${OPERATOR_IMAGE}); Memcacheds in
  ${namespaces[*]} become real memcached pods (${MEMCACHED_IMAGE}):

    export KUBECONFIG=${KUBECONFIG}
    kubectl apply -k config/samples
    kubectl wait --for=condition=Available memcached/memcached-sample --timeout=60s
    kubectl get memcached,pods -o wide
    kubectl logs -n memcached-operator-system deployment/memcached-operator-controller-manager

  Remove it with: make undeploy; stop the cluster with: make cluster-down

MSG
