#!/usr/bin/env bash
# Runs the end-to-end suite (tests/e2e) on a fresh local control plane and always tears it down.
# Set E2E_KEEP=1 to keep the cluster directory (logs, kubeconfig) after a failure.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dir="$(mktemp -d "${TMPDIR:-/tmp}/memcached-operator-e2e.XXXXXX")"
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

start=${SECONDS}
"${ROOT}/hack/cluster.sh" up "${dir}"
echo "control plane up in $((SECONDS - start))s"

export E2E_CLUSTER_DIR="${dir}"
cd "${ROOT}"
# One test at a time: each runs its own operator processes, and two cores are shared with the
# control plane.
cargo test --locked --features e2e --test e2e -- --test-threads=1 "$@"
status=0
