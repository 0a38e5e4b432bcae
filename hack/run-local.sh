#!/usr/bin/env bash
# Runs the operator on the embedded local control plane in DIR (started by `make cluster-up`):
# installs the CRD and RBAC, then runs the image's binary (built once per source) in the
# foreground as its own ServiceAccount, exactly as it would run in a cluster.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DIR="${1:?usage: hack/run-local.sh CLUSTER_DIR}"
# shellcheck source=hack/lib.sh
source "${ROOT}/hack/lib.sh"
NS=memcached-operator-system
SA=memcached-operator-controller-manager

# shellcheck disable=SC1091
source "${DIR}/env"
export KUBECONFIG

# config/local is config/default without the operator's Deployment: it runs here, as a process.
kubectl apply --server-side --field-manager=run-local -k "${ROOT}/config/local" >/dev/null
kubectl wait --for=condition=Established crd/memcacheds.cache.example.com --timeout=60s >/dev/null

# With a real node (`make run-local REAL_NODE=1`), the Memcacheds in `default` run there as real
# containers (Debian's memcached; the agent, the operator's image); elsewhere, on kwok's nodes.
where="kwok's fake nodes (no containers)"
if [[ -n "${REAL_NODE_NAME:-}" ]]; then
	RELATED_IMAGE_AGENT="$("${ROOT}/hack/images.sh" import-operator "${REAL_NODE_CONTAINERD_SOCKET}")"
	export RELATED_IMAGE_MEMCACHED="${MEMCACHED_IMAGE}" RELATED_IMAGE_MEMCACHED_EXPORTER="${EXPORTER_IMAGE}" RELATED_IMAGE_AGENT
	kubectl annotate --overwrite namespace default \
		scheduler.alpha.kubernetes.io/node-selector=type=real \
		'scheduler.alpha.kubernetes.io/defaultTolerations=[{"key": "memcached-operator.dev/real-node", "operator": "Equal", "value": "true", "effect": "NoSchedule"}]' >/dev/null
	where="the real node ${REAL_NODE_NAME}, as real memcached containers (${MEMCACHED_IMAGE}); try: memcached at the pod IPs, port 11211"
fi

operator_binary="$("${ROOT}/hack/images.sh" operator-binary)"
operator_kubeconfig="${DIR}/operator.kubeconfig"
write_sa_kubeconfig "${NS}" "${SA}" "${operator_kubeconfig}" 24h

cat <<MSG

  The local control plane is up, with the CRD and RBAC installed. In another terminal:

    export KUBECONFIG=${DIR}/kubeconfig
    kubectl apply -k config/samples
    kubectl get memcached,pods -o wide
    kubectl wait --for=condition=Available memcached/memcached-sample

  Memcacheds in namespace default run on ${where}.

  Metrics: curl -s 127.0.0.1:8080/metrics   Health: curl -s 127.0.0.1:8081/readyz
  Stop the operator with Ctrl-C; stop the control plane with: make cluster-down

MSG
KUBECONFIG="${operator_kubeconfig}" POD_NAMESPACE="${NS}" exec "${operator_binary}" \
	--metrics-bind-address=127.0.0.1:8080 --health-probe-bind-address=127.0.0.1:8081 --leader-elect
