#!/usr/bin/env bash
# Runs the scorecard's built-in tests on bundle/ offline, without a cluster or a container runtime.
#
# `operator-sdk scorecard` runs each test listed in bundle/tests/scorecard/config.yaml as a pod of
# the scorecard-test image; the pod gets the bundle unpacked at /bundle and runs
# `scorecard-test <test>` (operator-sdk's images/scorecard-test program, whose checks live in its
# internal/scorecard/tests package). The built-in tests only read the bundle, so this script runs
# that same program, built from the same operator-sdk module version (hack/olm/build-tools.sh
# scorecard-test), in a throwaway chroot whose /bundle is a copy of the bundle: the path is a
# compile-time constant (scorecard.PodBundleRoot) and the package is internal, so neither a flag
# nor an import can point it elsewhere. The chroot needs root, or an unprivileged user namespace
# (unshare --map-root-user).
#
# Usage: hack/olm/scorecard-static.sh [BUNDLE_DIR]   (default: bundle)
# Prints one line per test (pass/fail, errors, suggestions) and "N passed, N failed"; exits 1 when
# a test does not pass. Environment: SCORECARD_TEST (path; built and cached when unset).
set -euo pipefail

OLM_HACK_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "${OLM_HACK_DIR}/../.." && pwd)"
BUNDLE_DIR="${1:-${REPO_ROOT}/bundle}"

log() { printf '[olm/scorecard-static] %s\n' "$*" >&2; }
die() {
	log "ERROR: $*"
	exit 1
}

CONFIG="${BUNDLE_DIR}/tests/scorecard/config.yaml"
[[ -f "${CONFIG}" ]] || die "${CONFIG} not found: run make bundle first"
if [[ -z "${SCORECARD_TEST:-}" ]]; then
	SCORECARD_TEST="$("${OLM_HACK_DIR}/build-tools.sh" --path scorecard-test)"
fi

ROOT="$(mktemp -d "${TMPDIR:-/tmp}/scorecard-root.XXXXXX")"
trap 'rm -rf "${ROOT}"' EXIT
mkdir -p "${ROOT}/tmp"
chmod 1777 "${ROOT}/tmp"
cp -r "${BUNDLE_DIR}" "${ROOT}/bundle"
cp "${SCORECARD_TEST}" "${ROOT}/scorecard-test"

if [[ ${EUID} -eq 0 ]]; then
	in_root() { chroot "${ROOT}" /scorecard-test "$@"; }
elif unshare --map-root-user true 2>/dev/null; then
	in_root() { unshare --map-root-user chroot "${ROOT}" /scorecard-test "$@"; }
else
	die "needs root or unprivileged user namespaces (for a chroot with the bundle at /bundle)"
fi

# The tests the bundle's scorecard config lists: entrypoint [scorecard-test, <test>].
mapfile -t TESTS < <(yq -r '.stages[].tests[] | select(.entrypoint[0] == "scorecard-test") | .entrypoint[1]' "${CONFIG}")
[[ ${#TESTS[@]} -gt 0 ]] || die "no scorecard-test tests in ${CONFIG}"

passed=0 failed=0
for test in "${TESTS[@]}"; do
	out="$(in_root "${test}" 2>&1)" || true
	if ! state="$(jq -r '.results[0].state' <<<"${out}" 2>/dev/null)"; then
		state="error"
		printf '%-26s %s\n' "${test}" "error: ${out}"
	else
		printf '%-26s %s\n' "${test}" "${state}"
		jq -r '.results[0] | ((.errors // [])[] | "    error: " + .), ((.suggestions // [])[] | "    suggestion: " + .)' <<<"${out}"
	fi
	if [[ "${state}" == pass ]]; then passed=$((passed + 1)); else failed=$((failed + 1)); fi
done
echo "${passed} passed, ${failed} failed"
[[ ${failed} -eq 0 ]]
