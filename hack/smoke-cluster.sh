#!/usr/bin/env bash
# Smoke test of a cluster started by hack/cluster.sh:
#   hack/smoke-cluster.sh DIR
# Checks: nodes Ready, default namespace, a service-account token authenticates (403, not 401),
# a Deployment's pods become Running/Ready on kwok nodes, deleting it garbage-collects its
# ReplicaSet and pods. Leaves nothing behind in the cluster (uses its own namespace).
set -euo pipefail

[[ $# -eq 1 ]] || {
	echo "usage: $0 DIR" >&2
	exit 2
}
DIR="$(cd "$1" && pwd -P)"
# shellcheck disable=SC1091
source "${DIR}/env"
export KUBECONFIG
NS="smoke-$$"
PASS=0
FAIL=0

ok() {
	PASS=$((PASS + 1))
	echo "ok: $*"
}
fail() {
	FAIL=$((FAIL + 1))
	echo "FAIL: $*"
}
k() { kubectl --request-timeout=10s "$@"; }

# poll SECONDS CMD... : retry CMD every 0.25 s.
poll() {
	local deadline=$((SECONDS + $1))
	shift
	until "$@" >/dev/null 2>&1; do
		[[ ${SECONDS} -lt ${deadline} ]] || return 1
		sleep 0.25
	done
}

cleanup() { k delete namespace "${NS}" --wait=false >/dev/null 2>&1 || true; }
trap cleanup EXIT

if k wait --for=condition=Ready node -l type=kwok --timeout=30s >/dev/null; then
	ok "$(k get nodes -l type=kwok --no-headers | wc -l) kwok nodes Ready"
else
	fail "nodes not Ready"
fi
if k get namespace default >/dev/null; then ok "namespace default exists"; else fail "namespace default missing"; fi

k create namespace "${NS}" >/dev/null
poll 30 k get serviceaccount default -n "${NS}" || fail "serviceaccount ${NS}/default not created"

# Service-account tokens: authenticated (whoami works, RBAC denies = 403), bogus token = 401.
k create serviceaccount smoke -n "${NS}" >/dev/null
token="$(k create token smoke -n "${NS}")"
anon=(kubectl --kubeconfig=/dev/null --server "${KUBE_APISERVER}" --certificate-authority "${KUBE_CA_FILE}" --request-timeout=10s)
if out="$("${anon[@]}" --token "${token}" get --raw "/api/v1/namespaces/${NS}/pods" 2>&1)"; then
	fail "service-account token unexpectedly allowed to list pods"
elif grep -q Forbidden <<<"${out}"; then
	ok "service-account token authenticates (403 RBAC denial)"
else
	fail "service-account token: ${out}"
fi
if out="$("${anon[@]}" --token not-a-token get --raw /api 2>&1)"; then
	fail "bogus token accepted"
elif grep -q Unauthorized <<<"${out}"; then
	ok "bogus token rejected (401)"
else
	fail "bogus token: ${out}"
fi

# Deployment -> ReplicaSet -> Pods Running 1/1 on kwok nodes.
k create deployment smoke -n "${NS}" --image=memcached:1.6 --replicas=3 >/dev/null
if k rollout status deployment/smoke -n "${NS}" --timeout=60s >/dev/null; then
	running="$(k get pods -n "${NS}" -l app=smoke --no-headers | awk '$2=="1/1" && $3=="Running"' | wc -l)"
	if [[ "${running}" -eq 3 ]]; then ok "deployment pods Running 1/1"; else fail "only ${running}/3 pods Running 1/1"; fi
	nodes="$(k get pods -n "${NS}" -l app=smoke -o jsonpath='{range .items[*]}{.spec.nodeName}{"\n"}{end}' | sort -u | tr '\n' ' ')"
	if [[ "${nodes}" == *kwok-node-* ]]; then ok "pods scheduled on ${nodes}"; else fail "pods not on kwok nodes: ${nodes}"; fi
else
	fail "deployment did not roll out"
	k get pods -n "${NS}" -o wide || true
fi

# Garbage collection of ReplicaSet and pods.
k delete deployment smoke -n "${NS}" --wait=true >/dev/null
gone() { [[ -z "$(k get replicasets,pods -n "${NS}" -l app=smoke -o name)" ]]; }
if poll 60 gone; then ok "ReplicaSet and pods garbage-collected"; else fail "ReplicaSet/pods left after deleting deployment"; fi

echo "smoke: ${PASS} passed, ${FAIL} failed"
[[ ${FAIL} -eq 0 ]]
