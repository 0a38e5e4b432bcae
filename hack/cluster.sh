#!/usr/bin/env bash
# Hermetic local Kubernetes control plane without a container runtime:
# etcd + kube-apiserver + kube-controller-manager + kube-scheduler + kwok (fake nodes),
# all as plain processes on 127.0.0.1 on free ports, so several clusters can
# run side by side.
#
# Usage:
#   hack/cluster.sh up   DIR   build binaries if needed, start a cluster whose state lives in DIR
#   hack/cluster.sh down DIR   stop the processes listed in DIR/pids, remove DIR/env (idempotent;
#                              logs, etcd data and kubeconfigs stay for inspection)
#   hack/cluster.sh env  DIR   print DIR/env (KUBECONFIG=..., KUBE_APISERVER=..., CLUSTER_DIR=...)
#
# Environment (optional; hack/README.md lists them): NODES (3 kwok nodes), KCM_* and SCHEDULER_*
# limits, *_EXTRA_ARGS, UP_TIMEOUT, REAL_NODE=1 (root: a real node too, hack/real-node.sh) and its
# REAL_NODE_POD_CIDR, REAL_NODE_BRIDGE, REAL_NODE_DNS_IP, MEMCACHED_OPERATOR_CACHE (the cache root).
set -euo pipefail

HACK_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

# Components in start order (the last five only with REAL_NODE=1).
COMPONENTS=(etcd kube-apiserver kube-controller-manager kube-scheduler kwok containerd coredns kube-network-policies kubelet kube-proxy)

# log, die (as "[cluster] ..."), ensure_packages.
LOG_TAG=cluster
# shellcheck source=hack/lib.sh
source "${HACK_DIR}/lib.sh"
# shellcheck source=hack/real-node.sh
source "${HACK_DIR}/real-node.sh"

usage() {
	sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//' >&2
	exit 2
}

# abs_dir DIR [create] : absolute, symlink-free path of DIR.
abs_dir() {
	if [[ "${2:-}" == create ]]; then mkdir -p "$1"; fi
	[[ -d "$1" ]] || die "no such directory: $1"
	(cd "$1" && pwd -P)
}

# ---------------------------------------------------------------- process bookkeeping

# pid_alive PID : running and not a zombie.
pid_alive() {
	local state
	[[ -r "/proc/$1/stat" ]] || return 1
	state="$(sed 's/^.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f1)" || return 1
	[[ -n "${state}" && "${state}" != Z && "${state}" != X ]]
}

# pid_matches PID COMPONENT DIR : /proc/PID/cmdline is COMPONENT of the cluster in DIR.
pid_matches() {
	local pid="$1" component="$2" dir="$3"
	local -a argv=()
	[[ -r "/proc/${pid}/cmdline" ]] || return 1
	mapfile -d '' -t argv <"/proc/${pid}/cmdline" 2>/dev/null || return 1
	[[ ${#argv[@]} -ge 2 ]] || return 1
	case "${component}" in
	etcd | kwok | containerd | coredns | kube-network-policies) [[ "$(basename "${argv[0]}")" == "${component}" ]] || return 1 ;;
	kubelet | kube-proxy) [[ "$(basename "${argv[0]}")" == kube-node && "${argv[1]}" == "${component}" ]] || return 1 ;;
	*) [[ "$(basename "${argv[0]}")" == kube-controlplane && "${argv[1]}" == "${component}" ]] || return 1 ;;
	esac
	# Every component gets at least one flag pointing into DIR: never touch another cluster.
	local a
	for a in "${argv[@]}"; do
		[[ "${a}" == *"=${dir}/"* ]] && return 0
	done
	return 1
}

# stop_supervisor DIR COMPONENT : ends COMPONENT's hack/supervise.sh (not the component itself).
stop_supervisor() {
	local dir="$1" component="$2" pidfile pid cmdline
	pidfile="${dir}/pids/${component}.supervisor.pid"
	[[ -f "${pidfile}" ]] || return 0
	pid="$(tr -dc '0-9' <"${pidfile}")"
	if [[ -n "${pid}" ]] && pid_alive "${pid}"; then
		cmdline="$(tr '\0' ' ' <"/proc/${pid}/cmdline" 2>/dev/null)" || cmdline=""
		if [[ "${cmdline}" == *"supervise.sh ${dir} ${component} "* ]]; then
			kill -TERM "${pid}" 2>/dev/null || true
		fi
	fi
	rm -f "${pidfile}"
}

# stop_components DIR GRACE COMPONENT... : SIGTERM, wait up to GRACE s, SIGKILL.
stop_components() {
	local dir="$1" grace="$2"
	shift 2
	local component pidfile pid
	local -a pids=()
	# Their supervisors first, so that nothing restarts what is being stopped.
	touch "${dir}/pids/stopping"
	for component in "$@"; do
		stop_supervisor "${dir}" "${component}"
	done
	for component in "$@"; do
		pidfile="${dir}/pids/${component}.pid"
		[[ -f "${pidfile}" ]] || continue
		pid="$(tr -dc '0-9' <"${pidfile}")"
		if [[ -n "${pid}" ]] && pid_alive "${pid}" && pid_matches "${pid}" "${component}" "${dir}"; then
			log "stopping ${component} (pid ${pid})"
			kill -TERM "${pid}" 2>/dev/null || true
			pids+=("${pid}:${component}")
		elif [[ -n "${pid}" ]] && pid_alive "${pid}"; then
			log "pid ${pid} from ${pidfile} is no longer ${component} of ${dir}; not touching it"
		fi
	done
	local deadline=$((SECONDS + grace)) entry left
	while :; do
		left=0
		for entry in "${pids[@]+"${pids[@]}"}"; do
			pid_alive "${entry%%:*}" && left=1
		done
		[[ ${left} -eq 0 || ${SECONDS} -ge ${deadline} ]] && break
		sleep 0.2
	done
	for entry in "${pids[@]+"${pids[@]}"}"; do
		pid="${entry%%:*}"
		if pid_alive "${pid}" && pid_matches "${pid}" "${entry#*:}" "${dir}"; then
			log "${entry#*:} (pid ${pid}) did not exit in ${grace}s; SIGKILL"
			kill -KILL "${pid}" 2>/dev/null || true
		fi
	done
	for component in "$@"; do rm -f "${dir}/pids/${component}.pid"; done
}

cmd_down() {
	local dir
	[[ -d "$1" ]] || {
		log "nothing to stop: $1 does not exist"
		return 0
	}
	dir="$(abs_dir "$1")"
	[[ -d "${dir}/pids" ]] || return 0
	# The apiserver's clients first, then the apiserver; etcd last, so the apiserver stops cleanly.
	stop_components "${dir}" 20 kwok kube-scheduler kube-controller-manager
	# The real node (if any) next: its pods are deleted through the apiserver, which still runs.
	real_node_down "${dir}"
	# 5 s: the connections of pods whose network went with the real node never close (20 s lost).
	stop_components "${dir}" 5 kube-apiserver
	stop_components "${dir}" 10 etcd
	rm -f "${dir}/env"
	nothing_left "${dir}" || die "cluster in ${dir} is down, but it left the above behind"
	log "cluster in ${dir} is down"
}

# nothing_left DIR : fails, naming each, when a process of the cluster in DIR or a mount under it
# is still there, or what its real node leaves on the host (real_node_left), 10 s after down.
# (The components' supervisors exit after the components they wait for: a moment after them.)
nothing_left() {
	local dir="$1" p cmd left=() deadline=$((SECONDS + 10))
	while :; do
		left=()
		for p in /proc/[0-9]*; do
			[[ "${p#/proc/}" != "$$" && "${p#/proc/}" != "${PPID}" ]] || continue
			cmd="$(tr '\0' ' ' 2>/dev/null <"${p}/cmdline")" || continue
			[[ "${cmd}" != *"${dir}/"* ]] || left+=("process ${p#/proc/}: ${cmd:0:100}")
		done
		while read -r p; do left+=("mount ${p}"); done < <(awk -v d="${dir}/" 'index($5, d) == 1 {print $5}' /proc/self/mountinfo)
		while read -r p; do left+=("${p}"); done < <(real_node_left "${dir}")
		[[ ${#left[@]} -gt 0 && ${SECONDS} -lt ${deadline} ]] || break
		sleep 0.5
	done
	for p in "${left[@]+"${left[@]}"}"; do log "left behind: ${p}"; done
	[[ ${#left[@]} -eq 0 ]]
}

cmd_env() {
	local dir
	dir="$(abs_dir "$1")"
	[[ -f "${dir}/env" ]] || die "${dir}/env not found (is the cluster up?)"
	cat "${dir}/env"
}

# ---------------------------------------------------------------- up helpers

# http_ok URL : GET URL (no TLS verification needed: plain http for etcd).
http_ok() {
	python3 - "$1" <<'PY'
import sys, urllib.request
try:
    with urllib.request.urlopen(sys.argv[1], timeout=2) as r:
        sys.exit(0 if r.status == 200 else 1)
except Exception:
    sys.exit(1)
PY
}

gen_token() { openssl rand -hex 24; }

# gen_pki DIR [EXTRA_IP] : the CAs, the serving cert (EXTRA_IP added to its SANs) and the SA keys.
gen_pki() {
	local pki="$1"
	mkdir -p "${pki}"
	(
		cd "${pki}"
		umask 077
		openssl genrsa -out ca.key 2048 2>/dev/null
		openssl req -x509 -new -key ca.key -sha256 -days 3650 -out ca.crt \
			-subj "/CN=memcached-operator-local-ca" \
			-addext "basicConstraints=critical,CA:TRUE" \
			-addext "keyUsage=critical,keyCertSign,cRLSign,digitalSignature" \
			-addext "subjectKeyIdentifier=hash" 2>/dev/null
		openssl genrsa -out apiserver.key 2048 2>/dev/null
		openssl req -new -key apiserver.key -sha256 -out apiserver.csr -subj "/CN=kube-apiserver" 2>/dev/null
		cat >apiserver.ext <<-EOF
			basicConstraints=critical,CA:FALSE
			keyUsage=critical,digitalSignature,keyEncipherment
			extendedKeyUsage=serverAuth
			subjectKeyIdentifier=hash
			authorityKeyIdentifier=keyid,issuer
			subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local,IP:10.96.0.1${2:+,IP:$2}
		EOF
		openssl x509 -req -in apiserver.csr -CA ca.crt -CAkey ca.key -sha256 -days 3650 \
			-set_serial "0x$(openssl rand -hex 16)" -extfile apiserver.ext -out apiserver.crt 2>/dev/null
		openssl verify -CAfile ca.crt apiserver.crt >/dev/null
		# Front-proxy (request-header) CA and the apiserver's proxy client cert: lets
		# delegated authentication (controller-manager, scheduler, aggregated APIs) load
		# a complete extension-apiserver-authentication ConfigMap.
		openssl genrsa -out front-proxy-ca.key 2048 2>/dev/null
		openssl req -x509 -new -key front-proxy-ca.key -sha256 -days 3650 -out front-proxy-ca.crt \
			-subj "/CN=memcached-operator-local-front-proxy-ca" \
			-addext "basicConstraints=critical,CA:TRUE" \
			-addext "keyUsage=critical,keyCertSign,cRLSign,digitalSignature" \
			-addext "subjectKeyIdentifier=hash" 2>/dev/null
		openssl genrsa -out front-proxy-client.key 2048 2>/dev/null
		openssl req -new -key front-proxy-client.key -sha256 -out front-proxy-client.csr \
			-subj "/CN=front-proxy-client" 2>/dev/null
		cat >front-proxy-client.ext <<-EOF
			basicConstraints=critical,CA:FALSE
			keyUsage=critical,digitalSignature,keyEncipherment
			extendedKeyUsage=clientAuth
		EOF
		openssl x509 -req -in front-proxy-client.csr -CA front-proxy-ca.crt -CAkey front-proxy-ca.key \
			-sha256 -days 3650 -set_serial "0x$(openssl rand -hex 16)" -extfile front-proxy-client.ext \
			-out front-proxy-client.crt 2>/dev/null
		# Service-account token signing key pair.
		openssl genrsa -out sa.key 2048 2>/dev/null
		openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null
		rm -f ./*.csr ./*.ext
		chmod 644 ca.crt apiserver.crt front-proxy-ca.crt front-proxy-client.crt sa.pub
	)
}

# start COMPONENT CMD... : start CMD detached under hack/supervise.sh (restarted if it exits, as
# the kubelet restarts a static pod), output to logs/COMPONENT.log, pid to pids/.
start() {
	local component="$1"
	shift
	local logf="${CLUSTER_DIR}/logs/${component}.log" pidfile="${CLUSTER_DIR}/pids/${component}.pid"
	CURRENT_COMPONENT="${component}"
	printf '%q ' "$@" >"${CLUSTER_DIR}/logs/${component}.cmdline"
	: >"${logf}"
	rm -f "${pidfile}"
	# setsid: own session, so a Ctrl-C in the calling terminal does not kill the cluster.
	if command -v setsid >/dev/null; then
		setsid "${HACK_DIR}/supervise.sh" "${CLUSTER_DIR}" "${component}" "$@" </dev/null >/dev/null 2>&1 &
	else
		"${HACK_DIR}/supervise.sh" "${CLUSTER_DIR}" "${component}" "$@" </dev/null >/dev/null 2>&1 &
	fi
	printf '%s\n' "$!" >"${CLUSTER_DIR}/pids/${component}.supervisor.pid"
	local deadline=$((SECONDS + 10))
	until [[ -s "${pidfile}" ]]; do
		[[ ${SECONDS} -lt ${deadline} ]] || die "${component} did not start"
		sleep 0.05
	done
	STARTED+=("${component}")
	log "started ${component} (pid $(component_pid "${component}"))"
}

component_pid() { tr -dc '0-9' <"${CLUSTER_DIR}/pids/$1.pid"; }

# wait_for DESCRIPTION COMPONENT CMD... : retry CMD until success; fail if COMPONENT dies
# or UP_TIMEOUT passes.
wait_for() {
	local what="$1" component="$2"
	shift 2
	local deadline=$((SECONDS + UP_TIMEOUT))
	CURRENT_COMPONENT="${component}"
	until "$@" >/dev/null 2>&1; do
		pid_alive "$(component_pid "${component}")" || die "${component} exited while waiting for ${what}"
		[[ ${SECONDS} -lt ${deadline} ]] || die "timed out after ${UP_TIMEOUT}s waiting for ${what}"
		sleep 0.25
	done
}

all_alive() {
	local c
	for c in "${STARTED[@]}"; do
		pid_alive "$(component_pid "${c}")" || {
			CURRENT_COMPONENT="${c}"
			return 1
		}
	done
}

on_up_exit() {
	local rc=$?
	[[ ${UP_DONE:-0} -eq 1 ]] && return 0
	trap - EXIT
	[[ ${rc} -ne 0 ]] || rc=1
	log "up failed (exit ${rc}); tearing down"
	local c="${CURRENT_COMPONENT:-}"
	if [[ -n "${c}" && -s "${CLUSTER_DIR}/logs/${c}.log" ]]; then
		log "---- last 40 lines of ${CLUSTER_DIR}/logs/${c}.log ----"
		tail -n 40 "${CLUSTER_DIR}/logs/${c}.log" >&2
		log "---- end of ${c}.log ----"
	fi
	cmd_down "${CLUSTER_DIR}" || true
	exit "${rc}"
}

kctl() { kubectl --kubeconfig "${CLUSTER_DIR}/kubeconfig" --request-timeout=10s "$@"; }

node_manifest() { # INDEX
	local i="$1" name="kwok-node-$1"
	cat <<-EOF
		apiVersion: v1
		kind: Node
		metadata:
		  name: ${name}
		  annotations:
		    node.alpha.kubernetes.io/ttl: "0"
		    kwok.x-k8s.io/node: fake
		  labels:
		    type: kwok
		    kubernetes.io/arch: amd64
		    kubernetes.io/os: linux
		    kubernetes.io/hostname: ${name}
		spec:
		  podCIDR: 10.$((128 + i)).0.0/16
		  podCIDRs: [10.$((128 + i)).0.0/16]
		status:
		  allocatable: {cpu: "1000", memory: 4Ti, pods: "10000", ephemeral-storage: 10Ti}
		  capacity: {cpu: "1000", memory: 4Ti, pods: "10000", ephemeral-storage: 10Ti}
		  nodeInfo:
		    architecture: amd64
		    operatingSystem: linux
		    kubeletVersion: fake
		    kubeProxyVersion: fake
		    containerRuntimeVersion: kwok
		---
	EOF
}

cmd_up() {
	local t0=${SECONDS}
	CLUSTER_DIR="$(abs_dir "$1" create)"
	NODES="${NODES:-3}"
	UP_TIMEOUT="${UP_TIMEOUT:-180}"
	[[ "${NODES}" =~ ^[0-9]+$ && ${NODES} -le 127 ]] || die "NODES must be 0..127"
	local c pid
	for c in "${COMPONENTS[@]}"; do
		[[ -f "${CLUSTER_DIR}/pids/${c}.pid" ]] || continue
		pid="$(tr -dc '0-9' <"${CLUSTER_DIR}/pids/${c}.pid")"
		if [[ -n "${pid}" ]] && pid_alive "${pid}" && pid_matches "${pid}" "${c}" "${CLUSTER_DIR}"; then
			die "a cluster is already running in ${CLUSTER_DIR} (${c} pid ${pid}); run: $0 down ${CLUSTER_DIR}"
		fi
	done
	for tool in kubectl openssl python3 base64; do
		command -v "${tool}" >/dev/null || die "${tool} not found"
	done
	REAL_NODE="${REAL_NODE:-0}"
	if [[ "${REAL_NODE}" == 1 ]]; then
		real_node_preflight
		"${HACK_DIR}/build-controlplane.sh" --node
		"${HACK_DIR}/images.sh" build
	fi

	"${HACK_DIR}/build-controlplane.sh"
	local KUBE_CONTROLPLANE_BIN ETCD_BIN KWOK_BIN KWOK_STAGES
	eval "$("${HACK_DIR}/build-controlplane.sh" --print-env)"
	local t_start=${SECONDS}

	# Fresh state: only the paths this script owns.
	rm -rf "${CLUSTER_DIR:?}/etcd" "${CLUSTER_DIR}/pki" "${CLUSTER_DIR}/logs" "${CLUSTER_DIR}/pids" "${CLUSTER_DIR}/real-node"
	rm -f "${CLUSTER_DIR}"/kubeconfig* "${CLUSTER_DIR}/tokens.csv" "${CLUSTER_DIR}/env" "${CLUSTER_DIR}/ports.env"
	mkdir -p "${CLUSTER_DIR}/logs" "${CLUSTER_DIR}/pids"
	if [[ "${REAL_NODE}" == 1 ]]; then mkdir -p "${CLUSTER_DIR}/real-node"; fi
	STARTED=()
	CURRENT_COMPONENT=""
	UP_DONE=0
	trap on_up_exit EXIT
	trap 'exit 130' INT
	trap 'exit 143' TERM HUP

	local ports etcd_port etcd_peer_port api_port kcm_port sched_port kwok_port
	ports="$(free_ports 6)"
	read -r etcd_port etcd_peer_port api_port kcm_port sched_port kwok_port <<<"${ports}"
	cat >"${CLUSTER_DIR}/ports.env" <<-EOF
		ETCD_CLIENT_PORT=${etcd_port}
		ETCD_PEER_PORT=${etcd_peer_port}
		APISERVER_PORT=${api_port}
		KCM_PORT=${kcm_port}
		SCHEDULER_PORT=${sched_port}
		KWOK_PORT=${kwok_port}
	EOF

	# The apiserver listens on 127.0.0.1 only. With a real node it listens on the bridge's gateway
	# instead (one address: --bind-address takes one), so pods reach it through the `kubernetes`
	# Service and the host through the same local address; nothing listens on other interfaces.
	local pki="${CLUSTER_DIR}/pki" api_ip=127.0.0.1 extra_san=""
	if [[ "${REAL_NODE}" == 1 ]]; then
		api_ip="$(rn_gateway)"
		extra_san="${api_ip}"
		real_node_bridge_up
	fi
	local server="https://${api_ip}:${api_port}"
	gen_pki "${pki}" "${extra_san}"
	local admin_token kcm_token sched_token kwok_token
	admin_token="$(gen_token)"
	kcm_token="$(gen_token)"
	sched_token="$(gen_token)"
	kwok_token="$(gen_token)"
	(
		umask 077
		cat >"${CLUSTER_DIR}/tokens.csv" <<-EOF
			${admin_token},admin,admin,"system:masters"
			${kcm_token},system:kube-controller-manager,system:kube-controller-manager
			${sched_token},system:kube-scheduler,system:kube-scheduler
			${kwok_token},kwok,kwok,"system:masters"
		EOF
	)
	if [[ "${REAL_NODE}" == 1 ]]; then
		real_node_tokens >>"${CLUSTER_DIR}/tokens.csv"
		real_node_kubeconfigs "${server}" "${pki}/ca.crt"
	fi
	write_kubeconfig "${CLUSTER_DIR}/kubeconfig" "${server}" "${pki}/ca.crt" admin "${admin_token}"
	write_kubeconfig "${CLUSTER_DIR}/kubeconfig-controller-manager" "${server}" "${pki}/ca.crt" \
		system:kube-controller-manager "${kcm_token}"
	write_kubeconfig "${CLUSTER_DIR}/kubeconfig-scheduler" "${server}" "${pki}/ca.crt" system:kube-scheduler "${sched_token}"
	write_kubeconfig "${CLUSTER_DIR}/kubeconfig-kwok" "${server}" "${pki}/ca.crt" kwok "${kwok_token}"

	local -a extra
	# shellcheck disable=SC2206 # intentional word splitting of *_EXTRA_ARGS
	extra=(${ETCD_EXTRA_ARGS:-})
	start etcd "${ETCD_BIN}" \
		--name=node0 \
		--data-dir="${CLUSTER_DIR}/etcd" \
		--listen-client-urls="http://127.0.0.1:${etcd_port}" \
		--advertise-client-urls="http://127.0.0.1:${etcd_port}" \
		--listen-peer-urls="http://127.0.0.1:${etcd_peer_port}" \
		--initial-advertise-peer-urls="http://127.0.0.1:${etcd_peer_port}" \
		--initial-cluster="node0=http://127.0.0.1:${etcd_peer_port}" \
		--unsafe-no-fsync \
		--watch-progress-notify-interval=5s \
		--auto-compaction-retention=1 \
		--log-level=warn \
		"${extra[@]+"${extra[@]}"}"
	wait_for "etcd /health" etcd http_ok "http://127.0.0.1:${etcd_port}/health"

	local issuer=https://kubernetes.default.svc.cluster.local
	# shellcheck disable=SC2206
	extra=(${APISERVER_EXTRA_ARGS:-})
	# With a real node: namespaces can send their pods there by annotation (node selector and
	# default tolerations), for workloads whose pod template has no tolerations (the operator's).
	# Without a real node, the `kubernetes` Service has no endpoints (the reconciler refuses a
	# loopback address). With one, the apiserver publishes its bridge address as the endpoint, which
	# kube-proxy routes 10.96.0.1:443 to: in-cluster clients (the operator's pod) reach it.
	local -a endpoints=(--advertise-address=127.0.0.1 --endpoint-reconciler-type=none)
	if [[ "${REAL_NODE}" == 1 ]]; then
		extra=("--enable-admission-plugins=PodNodeSelector,PodTolerationRestriction" "${extra[@]+"${extra[@]}"}")
		endpoints=(--advertise-address="${api_ip}" --endpoint-reconciler-type=lease)
		# The node's Hostname address ("real-node") resolves nowhere: logs and exec go to its IP.
		extra=("--kubelet-preferred-address-types=InternalIP,Hostname" "${extra[@]}")
	fi
	start kube-apiserver "${KUBE_CONTROLPLANE_BIN}" kube-apiserver \
		--etcd-servers="http://127.0.0.1:${etcd_port}" \
		--bind-address="${api_ip}" \
		"${endpoints[@]}" \
		--secure-port="${api_port}" \
		--tls-cert-file="${pki}/apiserver.crt" \
		--tls-private-key-file="${pki}/apiserver.key" \
		--client-ca-file="${pki}/ca.crt" \
		--token-auth-file="${CLUSTER_DIR}/tokens.csv" \
		--authorization-mode=Node,RBAC \
		--service-account-issuer="${issuer}" \
		--service-account-key-file="${pki}/sa.pub" \
		--service-account-signing-key-file="${pki}/sa.key" \
		--api-audiences="${issuer}" \
		--service-cluster-ip-range=10.96.0.0/16 \
		--allow-privileged=true \
		--requestheader-client-ca-file="${pki}/front-proxy-ca.crt" \
		--requestheader-allowed-names=front-proxy-client \
		--requestheader-username-headers=X-Remote-User \
		--requestheader-group-headers=X-Remote-Group \
		--requestheader-extra-headers-prefix=X-Remote-Extra- \
		--proxy-client-cert-file="${pki}/front-proxy-client.crt" \
		--proxy-client-key-file="${pki}/front-proxy-client.key" \
		--profiling=false \
		"${extra[@]+"${extra[@]}"}"
	wait_for "kube-apiserver /readyz" kube-apiserver kctl get --raw /readyz
	local t_api=${SECONDS}

	# shellcheck disable=SC2206
	extra=(${KCM_EXTRA_ARGS:-})
	start kube-controller-manager "${KUBE_CONTROLPLANE_BIN}" kube-controller-manager \
		--kubeconfig="${CLUSTER_DIR}/kubeconfig-controller-manager" \
		--authentication-kubeconfig="${CLUSTER_DIR}/kubeconfig-controller-manager" \
		--authorization-kubeconfig="${CLUSTER_DIR}/kubeconfig-controller-manager" \
		--authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics \
		--service-account-private-key-file="${pki}/sa.key" \
		--root-ca-file="${pki}/ca.crt" \
		--use-service-account-credentials=true \
		--leader-elect=false \
		--bind-address=127.0.0.1 \
		--secure-port="${kcm_port}" \
		--kube-api-qps="${KCM_QPS:-20}" \
		--kube-api-burst="${KCM_BURST:-30}" \
		--concurrent-deployment-syncs="${KCM_CONCURRENT_DEPLOYMENT_SYNCS:-5}" \
		--concurrent-replicaset-syncs="${KCM_CONCURRENT_REPLICASET_SYNCS:-5}" \
		--concurrent-statefulset-syncs="${KCM_CONCURRENT_STATEFULSET_SYNCS:-5}" \
		--concurrent-gc-syncs="${KCM_CONCURRENT_GC_SYNCS:-20}" \
		--profiling=false \
		"${extra[@]+"${extra[@]}"}"

	# shellcheck disable=SC2206
	extra=(${SCHEDULER_EXTRA_ARGS:-})
	start kube-scheduler "${KUBE_CONTROLPLANE_BIN}" kube-scheduler \
		--kubeconfig="${CLUSTER_DIR}/kubeconfig-scheduler" \
		--authentication-kubeconfig="${CLUSTER_DIR}/kubeconfig-scheduler" \
		--authorization-kubeconfig="${CLUSTER_DIR}/kubeconfig-scheduler" \
		--authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics \
		--leader-elect=false \
		--bind-address=127.0.0.1 \
		--secure-port="${sched_port}" \
		--kube-api-qps="${SCHEDULER_QPS:-50}" \
		--kube-api-burst="${SCHEDULER_BURST:-100}" \
		--profiling=false \
		"${extra[@]+"${extra[@]}"}"

	# shellcheck disable=SC2206
	extra=(${KWOK_EXTRA_ARGS:-})
	start kwok "${KWOK_BIN}" \
		--kubeconfig="${CLUSTER_DIR}/kubeconfig-kwok" \
		--config="${KWOK_STAGES}" \
		--config="${HACK_DIR}/templates/kwok-in-place-restart.yaml" \
		--manage-nodes-with-label-selector=type=kwok \
		--node-lease-duration-seconds=40 \
		--cidr=10.112.0.0/16 \
		--node-ip=127.0.0.1 \
		--server-address="127.0.0.1:${kwok_port}" \
		"${extra[@]+"${extra[@]}"}"

	wait_for "namespace default" kube-apiserver kctl get namespace default
	if [[ ${NODES} -gt 0 ]]; then
		local i
		for ((i = 0; i < NODES; i++)); do node_manifest "${i}"; done >"${CLUSTER_DIR}/nodes.yaml"
		wait_for "creating ${NODES} nodes" kube-apiserver kctl apply -f "${CLUSTER_DIR}/nodes.yaml"
		wait_for "nodes Ready" kwok kctl wait --for=condition=Ready node -l type=kwok --timeout=5s
	fi
	# The serviceaccount controller (kube-controller-manager) creates this; pods need it.
	wait_for "serviceaccount default/default" kube-controller-manager kctl get serviceaccount default -n default
	if [[ "${REAL_NODE}" == 1 ]]; then real_node_up; fi
	all_alive || die "${CURRENT_COMPONENT} exited during startup"

	{
		printf 'KUBECONFIG=%q\n' "${CLUSTER_DIR}/kubeconfig"
		printf 'KUBE_APISERVER=%q\n' "${server}"
		printf 'CLUSTER_DIR=%q\n' "${CLUSTER_DIR}"
		printf 'KUBE_CA_FILE=%q\n' "${pki}/ca.crt"
		printf 'KUBE_ADMIN_TOKEN=%q\n' "${admin_token}"
		printf 'ETCD_ENDPOINT=%q\n' "http://127.0.0.1:${etcd_port}"
		if [[ "${REAL_NODE}" == 1 ]]; then cat "${CLUSTER_DIR}/real-node/node.env"; fi
	} >"${CLUSTER_DIR}/env"
	UP_DONE=1
	trap - EXIT INT TERM HUP
	log "apiserver ready after $((t_api - t_start))s; ${NODES} nodes Ready after $((SECONDS - t_start))s" \
		"(total incl. build check $((SECONDS - t0))s)"
	if [[ "${REAL_NODE}" == 1 ]]; then
		log "real node ${REAL_NODE_NAME} Ready ${REAL_NODE_READY_AFTER}s after the control plane; $((SECONDS - t_start))s after start"
	fi
	log "cluster up: ${server}  (source ${CLUSTER_DIR}/env; stop with: $0 down ${CLUSTER_DIR})"
}

main() {
	[[ $# -eq 2 ]] || usage
	case "$1" in
	up) cmd_up "$2" ;;
	down) cmd_down "$2" ;;
	env) cmd_env "$2" ;;
	*) usage ;;
	esac
}

main "$@"
