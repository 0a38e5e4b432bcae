#!/usr/bin/env bash
# Runs the real-node suite (tests/real_node: memcached and the operator as real containers) on a
# fresh local control plane with REAL_NODE=1 (root), and always tears it down.
# Set E2E_KEEP=1 to keep the cluster directory (logs, kubeconfig) after a failure.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [[ "$(id -u)" -ne 0 ]]; then
	# CI sets REQUIRE_REAL_NODE=1, so there a missing root fails instead of skipping.
	echo "SKIPPED: the real-node suite needs root (containerd, runc, bridges, iptables)" >&2
	[[ -z "${REQUIRE_REAL_NODE:-}" ]] || exit 2
	exit 0
fi
dir="$(mktemp -d "${TMPDIR:-/tmp}/memcached-operator-real-node-e2e.XXXXXX")"
status=1

cleanup() {
	"${ROOT}/hack/cluster.sh" down "${dir}" || true
	if [[ ${status} -ne 0 ]]; then
		for log in "${dir}"/logs/*.log "${dir}"/operators/*.log; do
			[[ -f "${log}" ]] || continue
			echo "----- tail of ${log}" >&2
			tail -n 30 "${log}" >&2
		done
	fi
	if [[ ${status} -eq 0 || -z "${E2E_KEEP:-}" ]]; then
		rm -rf "${dir}"
	else
		echo "kept ${dir}" >&2
	fi
}
trap cleanup EXIT

# The operator's image (the Dockerfile's stages, a static release build; cached) before the
# cluster, so its build time is not the tests'; the tests import it into the node. Prometheus
# scrapes the operator pod in tests/real_node/operator_pod.rs; curl reads HTTPS /metrics.
# shellcheck source=hack/lib.sh
source "${ROOT}/hack/lib.sh"
LOG_TAG=e2e-real-node
ensure_packages prometheus curl
timed "operator image" "${ROOT}/hack/images.sh" operator

start=${SECONDS}
REAL_NODE=1 "${ROOT}/hack/cluster.sh" up "${dir}"
echo "control plane and real node up in $((SECONDS - start))s"

export E2E_CLUSTER_DIR="${dir}"
cd "${ROOT}"
cargo test --locked --features real-node --test real_node -- --test-threads=1 "$@"
status=0
