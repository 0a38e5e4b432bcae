# shellcheck shell=bash
# The harness of the tests through real OLM (test-run-bundle.sh; test-olm and test-digests are Rust now, tests/olm): checks counted as
# PASS/FAIL, figures, processes started in the background and stopped on exit with the cluster,
# and OLM itself (its CRDs, the prometheus-operator's two CRDs the bundle needs, OLM's `olm` and
# `catalog` operators as processes). Sourced after setting:
#   DIR        the cluster directory (logs in DIR/logs)
#   TEST_NAME  prefix of the logs: DIR/logs/TEST_NAME-checks.log, DIR/logs/TEST_NAME-NAME.log
#   FIGURES    the file figure lines are kept in
#   REPO_ROOT, OLM_HACK_DIR, LOG_TAG
# KEEP=1 leaves the cluster and the processes running on exit, for inspection.

# shellcheck source=hack/lib.sh
source "${OLM_HACK_DIR}/../lib.sh"

PASSED=0 FAILED=0
pass() {
	PASSED=$((PASSED + 1))
	printf 'PASS  %s\n' "$*"
}
fail() {
	FAILED=$((FAILED + 1))
	printf 'FAIL  %s\n' "$*"
}
check() { # DESCRIPTION CMD... : pass if CMD succeeds (its output goes to DIR/logs/TEST_NAME-checks.log)
	local desc="$1"
	shift
	printf '== %s\n' "${desc}" >>"${DIR}/logs/${TEST_NAME}-checks.log"
	if "$@" >>"${DIR}/logs/${TEST_NAME}-checks.log" 2>&1; then pass "${desc}"; else fail "${desc}"; fi
}
# wait_until TIMEOUT CMD... : retry CMD every second until it succeeds or TIMEOUT seconds pass.
wait_until() {
	local deadline=$((SECONDS + $1))
	shift
	until "$@" >/dev/null 2>&1; do
		[[ ${SECONDS} -lt ${deadline} ]] || return 1
		sleep 1
	done
}
figure() { # TEXT : a measured figure, printed and kept in FIGURES
	printf 'FIGURE  %s\n' "$*" | tee -a "${FIGURES}"
}
now_ms() { date +%s%3N; }
secs_since() { # START_MS : seconds (one decimal) since START_MS
	local d=$(($(now_ms) - $1))
	printf '%d.%d' $((d / 1000)) $((d % 1000 / 100))
}

port_free() { python3 -c 'import socket,sys; s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(("", int(sys.argv[1]))); s.close()' "$1" 2>/dev/null; }

# ---------------------------------------------------------------- processes started here
PIDS=()
CLUSTER_UP=0
# Extra clean-up (e.g. a registry) run on exit before the cluster goes down.
ON_EXIT=()
cleanup() {
	local rc=$? pid c
	if [[ "${KEEP:-0}" == 1 ]]; then
		log "KEEP=1: leaving the cluster in ${DIR} and pids ${PIDS[*]:-} running (hack/cluster.sh down ${DIR})"
		return "${rc}"
	fi
	for pid in "${PIDS[@]}"; do kill "${pid}" 2>/dev/null || true; done
	for pid in "${PIDS[@]}"; do wait "${pid}" 2>/dev/null || true; done
	for c in "${ON_EXIT[@]}"; do eval "${c}" || true; done
	if [[ ${CLUSTER_UP} == 1 ]]; then "${REPO_ROOT}/hack/cluster.sh" down "${DIR}" >&2 || true; fi
	return "${rc}"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM HUP

start() { # NAME CMD... : run CMD in the background, output to DIR/logs/TEST_NAME-NAME.log; pid in REPLY
	local name="$1"
	shift
	"$@" >>"${DIR}/logs/${TEST_NAME}-${name}.log" 2>&1 &
	REPLY=$!
	PIDS+=("${REPLY}")
	log "started ${name} (pid ${REPLY}, log ${DIR}/logs/${TEST_NAME}-${name}.log)"
}
stop() { # PID : stop one process started here
	kill "$1" 2>/dev/null || true
	wait "$1" 2>/dev/null || true
}

kctl() { kubectl --request-timeout=20s "$@"; }
jp() { kctl get "$@" 2>/dev/null; } # RESOURCE... -o jsonpath=... : empty on error

# ---------------------------------------------------------------- OLM

# olm_ports_free : OLM's operators bind :8080 (olm) and :8443 (catalog, health over TLS); their
# ports are fixed upstream.
olm_ports_free() {
	local p
	for p in 8080 8443; do port_free "${p}" || die "port ${p} is in use (OLM's operators bind it; stop whatever holds it)"; done
}

# start_olm OLM_NS [CATALOG_FLAG...] : OLM's CRDs (the module's deploy/chart/crds), the
# prometheus-operator's ServiceMonitor and PrometheusRule CRDs, then OLM's `olm` and `catalog`
# operators out of cluster with the flags of its quickstart Deployments (plus CATALOG_FLAGs).
# Needs KUBECONFIG and OLM_DIR; sets MONITORING_CRDS (the CRDs' file). OLM_CLUSTER_DNS (root):
# the catalog operator resolves names with that DNS server (see below).
start_olm() {
	local olm_ns="$1"
	shift
	log "applying OLM's CRDs"
	kctl apply --server-side --field-manager="${TEST_NAME}" -f "${OLM_DIR}/crds.yaml" >/dev/null
	check "OLM CRDs established" \
		kctl wait --for=condition=Established --timeout="${TIMEOUT}s" -f "${OLM_DIR}/crds.yaml"
	kctl create namespace "${olm_ns}" >/dev/null
	# The bundle since 0.2.0 holds a ServiceMonitor and a PrometheusRule: OLM fails an InstallPlan
	# whose objects' kinds the cluster does not serve, so the cluster gets the prometheus-operator's
	# CRDs first, as a user's would (docs/monitoring.md).
	MONITORING_CRDS="$("${REPO_ROOT}/hack/monitoring-crds.sh")"
	kctl apply --server-side --field-manager="${TEST_NAME}" -f "${MONITORING_CRDS}" >/dev/null
	check "ServiceMonitor and PrometheusRule CRDs established" \
		kctl wait --for=condition=Established --timeout="${TIMEOUT}s" -f "${MONITORING_CRDS}"
	# The catalog operator gets a TLS pair so that it serves health on :8443 and does not collide
	# with olm's :8080.
	openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj "/CN=localhost" \
		-keyout "${DIR}/olm-tls.key" -out "${DIR}/olm-tls.crt" 2>/dev/null
	start olm env OPERATOR_NAMESPACE="${olm_ns}" OPERATOR_NAME=olm-operator \
		"${OLM_DIR}/olm" --namespace "${olm_ns}" --writeStatusName "" --writePackageServerStatusName ""
	# In a cluster the catalog operator dials a catalog image's pod by its Service's DNS name
	# (NAME.NS.svc:50051). Out of cluster it resolves with the cluster's DNS (OLM_CLUSTER_DNS, the
	# kube-dns Service's IP) through a resolv.conf of its own, bind-mounted in a mount namespace.
	local -a wrap=()
	if [[ -n "${OLM_CLUSTER_DNS:-}" ]]; then
		printf 'nameserver %s\nsearch %s.svc.cluster.local svc.cluster.local cluster.local\noptions ndots:5\n' \
			"${OLM_CLUSTER_DNS}" "${olm_ns}" >"${DIR}/olm-resolv.conf"
		# shellcheck disable=SC2016 # expanded by the inner shell
		wrap=(unshare --mount --propagation private sh -c 'mount --bind "$0" /etc/resolv.conf && exec "$@"' "${DIR}/olm-resolv.conf")
	fi
	start catalog "${wrap[@]}" "${OLM_DIR}/catalog" --namespace "${olm_ns}" --writeStatusName "" \
		--tls-cert "${DIR}/olm-tls.crt" --tls-key "${DIR}/olm-tls.key" "$@"
	check "olm operator healthy (:8080/healthz)" wait_until 60 curl -sf http://127.0.0.1:8080/healthz
	check "catalog operator healthy (:8443/healthz)" wait_until 60 curl -sfk https://127.0.0.1:8443/healthz
}

# finish : on failures, what OLM and the test namespace NS hold and the logs' tails; then the
# summary line, and the exit status.
finish() {
	if [[ ${FAILED} -gt 0 ]]; then
		log "diagnostics:"
		kctl get catalogsource,subscription,installplan,csv -A >&2 || true
		kctl get deployment,pods,jobs -n "${NS}" -o wide >&2 || true
		tail -n 20 "${DIR}/logs/${TEST_NAME}"-*.log >&2 || true
	fi
	log "${TEST_NAME} took $((SECONDS - T0))s after the control plane was up"
	echo "${PASSED} passed, ${FAILED} failed"
	[[ ${FAILED} -eq 0 ]]
}

# stop_if_failed WHAT : after a step the rest depends on, end here (finish) if anything failed.
stop_if_failed() {
	[[ ${FAILED} -eq 0 ]] && return 0
	log "${1} failed: the checks after it would only time out"
	finish
	exit 1
}

