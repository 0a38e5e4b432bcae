#!/usr/bin/env bash
# Runs the chaos suite (tests/chaos): each scenario on a fresh local control plane of its own (a
# fault can leave a fake-node cluster worse than a real one, and no scenario should inherit that),
# always torn down. Optional arguments filter scenarios by name.
# CHAOS_CRS (200), CHAOS_HANG_SECONDS (60), CHAOS_CHURN_SECONDS (90) size the scenarios.
# E2E_KEEP=1 keeps a failed scenario's cluster directory; CHAOS_KEEP_RUNNING=1 leaves it running.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "${ROOT}"
cargo test --locked --features test-suites --test chaos --no-run --quiet
mapfile -t scenarios < <(cargo test --locked --features test-suites --test chaos --quiet -- --list 2>/dev/null |
	sed -n 's/: test$//p')
failed=()
for scenario in "${scenarios[@]}"; do
	if [[ $# -gt 0 ]]; then
		wanted=0
		for filter in "$@"; do [[ "${scenario}" == *"${filter}"* ]] && wanted=1; done
		[[ ${wanted} -eq 1 ]] || continue
	fi
	dir="$(mktemp -d "${TMPDIR:-/tmp}/memcached-operator-chaos.XXXXXX")"
	echo "===== ${scenario} (cluster ${dir})"
	# A node the API server cannot hear from for the grace period is marked NotReady and so are
	# its pods; a kubelet marks them Ready again once it is heard, kwok does not, and a hung API
	# server would leave its pods unready for good. The grace period outlasts the faults here.
	KCM_QPS=200 KCM_BURST=400 SCHEDULER_QPS=200 SCHEDULER_BURST=400 \
		KCM_CONCURRENT_DEPLOYMENT_SYNCS=10 KCM_CONCURRENT_REPLICASET_SYNCS=10 KCM_CONCURRENT_STATEFULSET_SYNCS=10 \
		KCM_EXTRA_ARGS="--node-monitor-grace-period=3m" \
		hack/cluster.sh up "${dir}" >"${dir}.up.log" 2>&1 || {
		cat "${dir}.up.log" >&2
		exit 1
	}
	status=0
	E2E_CLUSTER_DIR="${dir}" cargo test --locked --features test-suites --test chaos -- \
		--exact "${scenario}" --nocapture || status=$?
	if [[ -f "${dir}/logs/restarts.log" ]]; then
		echo "----- control-plane restarts" >&2
		cat "${dir}/logs/restarts.log" >&2
	fi
	if [[ ${status} -ne 0 ]]; then
		failed+=("${scenario}")
		if [[ -n "${CHAOS_KEEP_RUNNING:-}" ]]; then
			echo "left running: source ${dir}/env; hack/cluster.sh down ${dir}" >&2
			continue
		fi
	fi
	hack/cluster.sh down "${dir}" >/dev/null 2>&1 || true
	if [[ ${status} -eq 0 || -z "${E2E_KEEP:-}" ]]; then
		rm -rf "${dir}" "${dir}.up.log"
	else
		echo "kept ${dir}" >&2
	fi
done
if [[ ${#failed[@]} -gt 0 ]]; then
	echo "chaos scenarios failed: ${failed[*]}" >&2
	exit 1
fi
echo "chaos: every scenario passed"
