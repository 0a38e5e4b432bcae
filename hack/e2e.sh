#!/usr/bin/env bash
# Runs an end-to-end suite on a fresh local control plane and always tears it down:
#   hack/e2e.sh [FILTER...]              tests/e2e on fake (kwok) nodes
#   REAL_NODE=1 hack/e2e.sh [FILTER...]  tests/real_node: memcached and the operator as real
#                                        containers on a real node (root; skipped without root
#                                        unless REQUIRE_REAL_NODE=1, as in CI)
#   SUITE=olm hack/e2e.sh [FILTER...]    tests/olm on fake (kwok) nodes (`make test-olm`), or
#                                        with REAL_NODE=1 NODES=0 (`make test-run-bundle`)
# Set E2E_KEEP=1 to keep the cluster directory (logs, kubeconfig) after a failure.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
REAL_NODE="${REAL_NODE:-0}"
suite=e2e
if [[ "${SUITE:-}" == olm ]]; then
	suite=olm
fi
if [[ "${REAL_NODE}" == 1 ]]; then
	[[ "${suite}" == olm ]] || suite=real_node
	if [[ "$(id -u)" -ne 0 ]]; then
		echo "SKIPPED: the ${suite} suite on the real node needs root (containerd, runc, bridges, iptables)" >&2
		[[ -z "${REQUIRE_REAL_NODE:-}" ]] || exit 2
		exit 0
	fi
fi
dir="$(mktemp -d "${TMPDIR:-/tmp}/memcached-operator-${suite}.XXXXXX")"
status=1

cleanup() {
	[[ -z "${build:-}" ]] || kill "${build}" 2>/dev/null || true # the suite's build, if still going
	if [[ ${status} -ne 0 ]]; then
		for log in "${dir}"/logs/*.log "${dir}"/operators/*.log "${dir}"/operators/*/logs/*.log; do
			[[ -f "${log}" ]] || continue
			echo "----- tail of ${log}" >&2
			tail -n 30 "${log}" >&2
		done
		if [[ -f "${dir}/tests.out" ]]; then
			echo "----- the tests' failures, or the end of their output (all of it above the logs)" >&2
			if grep -q '^failures:$' "${dir}/tests.out"; then
				sed -n '/^failures:$/,$p' "${dir}/tests.out" | tail -n 60 >&2
			else
				tail -n 30 "${dir}/tests.out" >&2
			fi
		fi
	fi
	# Teardown is checked too: down fails when anything of the cluster is left on the host (its
	# output comes last, so that a CI log's tail shows what).
	if ! "${ROOT}/hack/cluster.sh" down "${dir}"; then
		echo "FAIL: hack/cluster.sh down (above)" >&2
		status=1
	fi
	if [[ ${status} -eq 0 || -z "${E2E_KEEP:-}" ]]; then
		rm -rf "${dir}"
	else
		echo "kept ${dir}" >&2
	fi
	[[ ${status} -eq 0 ]] || exit 1
}
trap cleanup EXIT

if [[ "${REAL_NODE}" == 1 ]]; then
	# The operator's image (the Dockerfile's stages, a static release build; cached) before the
	# cluster, so its build time is not the tests'; the tests import it into the node (or push it
	# to a registry). Prometheus scrapes the operator pod in tests/real_node/operator_pod.rs; curl
	# reads HTTPS /metrics. The OLM suite's tool images (opm, OLM's util, scorecard-test, busybox)
	# likewise.
	# shellcheck source=hack/lib.sh
	source "${ROOT}/hack/lib.sh"
	LOG_TAG=e2e-real-node
	ensure_packages curl
	if [[ "${suite}" == real_node ]]; then ensure_packages prometheus; fi
	timed "operator image" "${ROOT}/hack/images.sh" operator
	if [[ "${suite}" == olm ]]; then timed "OLM's tool images" "${ROOT}/hack/olm/images.sh" build >/dev/null; fi
fi

cd "${ROOT}"
# E2E_PROFILE: a cargo profile, e.g. bench-client for the data-path benchmark's optimized client.
tests=(cargo test --locked --features test-suites --test "${suite}")
[[ -z "${E2E_PROFILE:-}" ]] || tests+=(--profile "${E2E_PROFILE}")
# The suite (built with every suite's features, as `make test` builds) builds while the control
# plane comes up. Then one test at a time: each runs its own operator processes, and two cores are
# shared with the control plane. The output is kept for the summary at the end (cleanup).
"${tests[@]}" --no-run --quiet &
build=$!
start=${SECONDS}
REAL_NODE="${REAL_NODE}" "${ROOT}/hack/cluster.sh" up "${dir}"
echo "control plane up in $((SECONDS - start))s"
wait "${build}"
export E2E_CLUSTER_DIR="${dir}"
"${tests[@]}" -- --test-threads=1 "$@" 2>&1 | tee "${dir}/tests.out"
status=0
