# shellcheck shell=bash
# The real node of hack/cluster.sh (REAL_NODE=1): containerd + runc + CNI (Debian's packages),
# kubelet and kube-proxy (kube-node, built from the control plane's module), CoreDNS, a
# NetworkPolicy engine (kube-network-policies, hack/controlplane/netpol), and the images of hack/images.sh.
# Sourced by cluster.sh; uses its start/wait_for/kctl/stop_components.
#
# Layout under DIR/real-node/: containerd/{config.toml,root,state,containerd.sock}, cni/{net.d,ipam},
# kubelet/{config.yaml,root,pod-logs}, kube-proxy.yaml, Corefile, node.env, sysctl.before.
#
# Host-global things a kubelet and kube-proxy touch (iptables KUBE-* chains, the kubepods cgroups,
# a few sysctls, /var/run/netns, /var/lib/kubelet/device-plugins/kubelet.sock), and the
# NetworkPolicy engine's chain and NFQUEUE number, allow ONE real node per host at a time: `up` takes
# REAL_NODE_LOCK and refuses a second one; `down` puts back what it changed.

REAL_NODE_NAME="${REAL_NODE_NAME:-real-node}"
REAL_NODE_TAINT="memcached-operator.dev/real-node"
REAL_NODE_LOCK=/run/memcached-operator-real-node.owner
# python3-pymemcache: a real client library for the real-node tests (tests/real_node/pymemcache_app.py).
REAL_NODE_PACKAGES=(containerd runc containernetworking-plugins iptables umoci memcached busybox-static python3-pymemcache)
REAL_NODE_CNI_BIN=/usr/lib/cni
# Bridge and pod range of the real node; 10.96.0.0/16 (Services) and 10.112-255.x (kwok's fake
# pod ranges) are only API objects, but the bridge range gets a host route, so it must be free.
REAL_NODE_BRIDGE="${REAL_NODE_BRIDGE:-mcop0}"
REAL_NODE_POD_CIDR="${REAL_NODE_POD_CIDR:-10.244.0.0/24}"
# The kube-dns Service's ClusterIP (kube-proxy DNATs it to CoreDNS on the bridge's gateway).
REAL_NODE_DNS_IP="${REAL_NODE_DNS_IP:-10.96.0.10}"
# NetworkPolicies: the kernel queues the first packet of each new connection forwarded to or from a
# pod (bridged pod-to-pod included, through bridge-nf-call-iptables) to this NFQUEUE, where
# kube-network-policies accepts or drops it. The jump is in the mangle table so that an accepted
# packet still meets kube-proxy's filter rules (an NFQUEUE accept ends the table it was queued
# from). --queue-bypass: packets pass while no engine listens (starting, restarting, stopped).
# Host-to-pod and pod-to-host traffic is not forwarded, so not policed: as the NetworkPolicy
# API says, traffic between a pod and its node is always allowed (kubelet probes, the host's
# Prometheus, CoreDNS and the apiserver on the gateway).
REAL_NODE_NETPOL_QUEUE=100
REAL_NODE_NETPOL_CHAIN=MCOP-NETPOL
# Host sysctls that the kubelet (setupKernelTunables), kube-proxy and the bridge need or set;
# saved at `up` and put back at `down`.
REAL_NODE_SYSCTLS=(net.ipv4.ip_forward net.bridge.bridge-nf-call-iptables net.bridge.bridge-nf-call-ip6tables
	net.ipv4.conf.all.route_localnet vm.overcommit_memory vm.panic_on_oom kernel.panic kernel.panic_on_oops
	kernel.keys.root_maxkeys kernel.keys.root_maxbytes)

rn_dir() { printf '%s/real-node' "${CLUSTER_DIR}"; }
rn_sock() { printf '%s/real-node/containerd/containerd.sock' "${CLUSTER_DIR}"; }
rn_ctr() { ctr --address "$(rn_sock)" -n k8s.io "$@"; }

# The gateway (first address) of the pod range, e.g. 10.244.0.1.
rn_gateway() {
	python3 -c 'import ipaddress,sys; print(ipaddress.ip_network(sys.argv[1])[1])' "${REAL_NODE_POD_CIDR}"
}

# ---------------------------------------------------------------- host checks and lock

real_node_preflight() {
	[[ "$(id -u)" -eq 0 ]] || die "REAL_NODE=1 needs root (containerd, runc, bridges, iptables)"
	local owner=""
	[[ -f "${REAL_NODE_LOCK}" ]] && owner="$(cat "${REAL_NODE_LOCK}")"
	if [[ -n "${owner}" && "${owner}" != "${CLUSTER_DIR}" && -d "${owner}/real-node" ]]; then
		real_node_running "${owner}" &&
			die "a real node already runs on this host (cluster ${owner}); one at a time: kube-proxy's iptables chains and the kubepods cgroups are host-wide"
		# Killed without a `down` (a killed run): take down what it left (bridge, iptables, mounts).
		log "the real node of ${owner} is not running but left its state; taking it down"
		real_node_down "${owner}"
	fi
	if ip link show "${REAL_NODE_BRIDGE}" >/dev/null 2>&1; then
		die "network interface ${REAL_NODE_BRIDGE} exists already (a cluster not taken down? run: $0 down DIR)"
	fi
	local overlap
	overlap="$(ip -4 route show | python3 -c '
import ipaddress, sys
mine = ipaddress.ip_network(sys.argv[1])
for line in sys.stdin:
    dst = line.split()[0]
    if dst == "default":
        continue
    try:
        net = ipaddress.ip_network(dst, strict=False)
    except ValueError:
        continue
    if net.overlaps(mine):
        print(line.strip())
' "${REAL_NODE_POD_CIDR}")"
	[[ -z "${overlap}" ]] || die "REAL_NODE_POD_CIDR ${REAL_NODE_POD_CIDR} overlaps a host route: ${overlap}"
	if grep -q '^:KUBE-SERVICES' <<<"$(iptables-save 2>/dev/null)"; then
		die "iptables already has KUBE-SERVICES chains: another kube-proxy on this host? (clean with: kube-node kube-proxy --cleanup)"
	fi
	if netpol_queue_bound; then
		die "NFQUEUE ${REAL_NODE_NETPOL_QUEUE} already has a listener (another NetworkPolicy engine on this host?)"
	fi
	ensure_packages "${REAL_NODE_PACKAGES[@]}"
	printf '%s\n' "${CLUSTER_DIR}" >"${REAL_NODE_LOCK}"
}

# real_node_running DIR : a containerd or kubelet of DIR's cluster is alive.
real_node_running() {
	local dir="$1" c pid
	for c in containerd kubelet; do
		[[ -f "${dir}/pids/${c}.pid" ]] || continue
		pid="$(tr -dc '0-9' <"${dir}/pids/${c}.pid")"
		[[ -n "${pid}" ]] && pid_alive "${pid}" && pid_matches "${pid}" "${c}" "${dir}" && return 0
	done
	return 1
}

save_sysctls() {
	local s
	for s in "${REAL_NODE_SYSCTLS[@]}"; do
		[[ -e "/proc/sys/${s//.//}" ]] && printf '%s=%s\n' "${s}" "$(cat "/proc/sys/${s//.//}")"
	done >"$(rn_dir)/sysctl.before"
}

restore_sysctls() {
	local f="$1/real-node/sysctl.before" line key
	[[ -f "${f}" ]] || return 0
	while IFS= read -r line; do
		key="${line%%=*}"
		printf '%s\n' "${line#*=}" >"/proc/sys/${key//.//}" 2>/dev/null || log "could not restore ${line}"
	done <"${f}"
	rm -f "${f}"
}

# ---------------------------------------------------------------- configuration files

write_containerd_config() {
	local d
	d="$(rn_dir)/containerd"
	mkdir -p "${d}/root" "${d}/state"
	render "${TEMPLATES}/containerd.toml" DIR="${d}" PAUSE_IMAGE="${PAUSE_IMAGE}" \
		CNI_BIN="${REAL_NODE_CNI_BIN}" CNI_CONF_DIR="$(rn_dir)/cni/net.d" >"${d}/config.toml"
}

# real_node_registry_hosts CLUSTER_DIR REGISTRY CA [HOST...] : the real node's containerd pulls
# REGISTRY (host:port on 127.0.0.1) over HTTPS trusting the certificate file CA (or, CA empty,
# over plain HTTP), and each HOST (e.g. docker.io) from REGISTRY as its mirror, the way a
# disconnected cluster mirrors public registries. Read at each pull: no restart needed.
real_node_registry_hosts() {
	local dir="$1/real-node/containerd/certs.d" registry="$2" ca="$3" host scheme=http entry
	shift 3
	[[ -z "${ca}" ]] || scheme=https
	entry="$(printf '[host."%s://%s"]\n  capabilities = ["pull", "resolve"]\n' "${scheme}" "${registry}")"
	[[ -z "${ca}" ]] || entry+="$(printf '\n  ca = "%s"' "${ca}")"
	mkdir -p "${dir}/${registry}"
	printf 'server = "%s://%s"\n\n%s\n' "${scheme}" "${registry}" "${entry}" >"${dir}/${registry}/hosts.toml"
	for host in "$@"; do
		mkdir -p "${dir}/${host}"
		printf '%s\n' "${entry}" >"${dir}/${host}/hosts.toml"
	done
}

write_cni_config() {
	local d
	d="$(rn_dir)/cni"
	mkdir -p "${d}/net.d" "${d}/ipam"
	render "${TEMPLATES}/cni.conflist" BRIDGE="${REAL_NODE_BRIDGE}" POD_CIDR="${REAL_NODE_POD_CIDR}" \
		GATEWAY="$(rn_gateway)" IPAM_DIR="${d}/ipam" >"${d}/net.d/10-real-node.conflist"
}

# real_node_bridge_up : before the apiserver starts (it listens on the bridge's gateway): saves the
# sysctls, then creates the bridge.
real_node_bridge_up() {
	save_sysctls
	create_bridge
}

# The bridge exists before the apiserver and the first pod, so they (and CoreDNS) can listen on its
# gateway address.
create_bridge() {
	local gw prefix
	gw="$(rn_gateway)"
	prefix="${REAL_NODE_POD_CIDR#*/}"
	ip link add "${REAL_NODE_BRIDGE}" type bridge
	ip addr add "${gw}/${prefix}" dev "${REAL_NODE_BRIDGE}"
	ip link set "${REAL_NODE_BRIDGE}" up
	# Service traffic between pods on one bridge must pass iptables (kube-proxy's DNAT).
	printf '1\n' >/proc/sys/net/bridge/bridge-nf-call-iptables
	if [[ -e /proc/sys/net/bridge/bridge-nf-call-ip6tables ]]; then printf '1\n' >/proc/sys/net/bridge/bridge-nf-call-ip6tables; fi
	printf '1\n' >/proc/sys/net/ipv4/ip_forward
}

write_kubelet_config() { # PORT HEALTHZ_PORT
	local d
	d="$(rn_dir)/kubelet"
	mkdir -p "${d}/root" "${d}/pod-logs" "${d}/volume-plugins"
	render "${TEMPLATES}/kubelet.yaml" SOCKET="$(rn_sock)" GATEWAY="$(rn_gateway)" PORT="$1" \
		HEALTHZ_PORT="$2" DNS_IP="${REAL_NODE_DNS_IP}" TAINT="${REAL_NODE_TAINT}" DIR="${d}" >"${d}/config.yaml"
}

write_kube_proxy_config() { # HEALTHZ_PORT METRICS_PORT
	render "${TEMPLATES}/kube-proxy.yaml" KUBECONFIG="${CLUSTER_DIR}/kubeconfig-kube-proxy" \
		NODE_NAME="${REAL_NODE_NAME}" POD_CIDR="${REAL_NODE_POD_CIDR}" HEALTHZ_PORT="$1" METRICS_PORT="$2" \
		GATEWAY="$(rn_gateway)" >"$(rn_dir)/kube-proxy.yaml"
}

write_corefile() { # HEALTH_PORT READY_PORT
	render "${TEMPLATES}/Corefile" GATEWAY="$(rn_gateway)" HEALTH_PORT="$1" READY_PORT="$2" \
		KUBECONFIG="${CLUSTER_DIR}/kubeconfig-coredns" >"$(rn_dir)/Corefile"
}

dns_manifest() {
	render "${TEMPLATES}/coredns.yaml" DNS_IP="${REAL_NODE_DNS_IP}" GATEWAY="$(rn_gateway)"
}

# real_node_tokens : tokens.csv lines for the kubelet (a proper node identity, so the Node
# authorizer applies), kube-proxy (bound to system:node-proxier by default RBAC) and CoreDNS.
# Sets RN_*_TOKEN for real_node_kubeconfigs.
real_node_tokens() {
	RN_KUBELET_TOKEN="$(gen_token)"
	RN_PROXY_TOKEN="$(gen_token)"
	RN_COREDNS_TOKEN="$(gen_token)"
	RN_NETPOL_TOKEN="$(gen_token)"
	printf '%s,system:node:%s,system:node:%s,"system:nodes"\n' "${RN_KUBELET_TOKEN}" "${REAL_NODE_NAME}" "${REAL_NODE_NAME}"
	printf '%s,system:kube-proxy,system:kube-proxy\n' "${RN_PROXY_TOKEN}"
	printf '%s,system:coredns,system:coredns\n' "${RN_COREDNS_TOKEN}"
	printf '%s,system:kube-network-policies,system:kube-network-policies\n' "${RN_NETPOL_TOKEN}"
}

real_node_kubeconfigs() { # SERVER CA
	write_kubeconfig "${CLUSTER_DIR}/kubeconfig-kubelet" "$1" "$2" "system:node:${REAL_NODE_NAME}" "${RN_KUBELET_TOKEN}"
	write_kubeconfig "${CLUSTER_DIR}/kubeconfig-kube-proxy" "$1" "$2" system:kube-proxy "${RN_PROXY_TOKEN}"
	write_kubeconfig "${CLUSTER_DIR}/kubeconfig-coredns" "$1" "$2" system:coredns "${RN_COREDNS_TOKEN}"
	write_kubeconfig "${CLUSTER_DIR}/kubeconfig-kube-network-policies" "$1" "$2" system:kube-network-policies "${RN_NETPOL_TOKEN}"
}

# netpol_rules_up : the NFQUEUE rules of REAL_NODE_NETPOL_CHAIN (replacing any a crashed run left).
netpol_rules_up() {
	delete_iptables_chains iptables "${REAL_NODE_NETPOL_CHAIN}"
	local q=(-j NFQUEUE --queue-num "${REAL_NODE_NETPOL_QUEUE}" --queue-bypass)
	iptables -t mangle -N "${REAL_NODE_NETPOL_CHAIN}"
	iptables -t mangle -A "${REAL_NODE_NETPOL_CHAIN}" -d "${REAL_NODE_POD_CIDR}" "${q[@]}"
	iptables -t mangle -A "${REAL_NODE_NETPOL_CHAIN}" -s "${REAL_NODE_POD_CIDR}" "${q[@]}"
	# Only a connection's first packet: a verdict holds for the connection (conntrack).
	iptables -t mangle -I FORWARD 1 -m conntrack --ctstate NEW \
		-m comment --comment "memcached-operator real node: NetworkPolicy verdicts" -j "${REAL_NODE_NETPOL_CHAIN}"
}

# netpol_queue_bound : the engine listens on its NFQUEUE (it binds after its caches synced).
netpol_queue_bound() {
	awk -v q="${REAL_NODE_NETPOL_QUEUE}" '$1 == q {found = 1} END {exit !found}' /proc/net/netfilter/nfnetlink_queue
}

node_ready() {
	[[ "$(kctl get node "${REAL_NODE_NAME}" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}')" == True ]]
}

# ---------------------------------------------------------------- up

# real_node_up : after the control plane is ready. Starts containerd, imports the images,
# starts CoreDNS, the NetworkPolicy engine (and its NFQUEUE rules), the kubelet and kube-proxy,
# waits for the node to be Ready.
real_node_up() {
	local t0=${SECONDS}
	local KUBE_NODE_BIN COREDNS_BIN KUBE_NETWORK_POLICIES_BIN MEMCACHED_IMAGE MEMCACHED_SID_IMAGE PAUSE_IMAGE EXPORTER_IMAGE
	eval "$("${HACK_DIR}/build-controlplane.sh" --print-env | grep -E '^(KUBE_NODE_BIN|COREDNS_BIN|KUBE_NETWORK_POLICIES_BIN)=')"
	eval "$("${HACK_DIR}/images.sh" --print-env | grep -E '^(MEMCACHED_IMAGE|MEMCACHED_SID_IMAGE|PAUSE_IMAGE|EXPORTER_IMAGE)=')"
	local ports kubelet_port kubelet_healthz proxy_healthz proxy_metrics dns_health dns_ready netpol_metrics
	ports="$(free_ports 7)"
	read -r kubelet_port kubelet_healthz proxy_healthz proxy_metrics dns_health dns_ready netpol_metrics <<<"${ports}"
	cat >"$(rn_dir)/node.env" <<-EOF
		REAL_NODE_NAME=${REAL_NODE_NAME}
		REAL_NODE_BRIDGE=${REAL_NODE_BRIDGE}
		REAL_NODE_POD_CIDR=${REAL_NODE_POD_CIDR}
		REAL_NODE_GATEWAY=$(rn_gateway)
		REAL_NODE_DNS_IP=${REAL_NODE_DNS_IP}
		REAL_NODE_CONTAINERD_SOCKET=$(rn_sock)
		KUBELET_PORT=${kubelet_port}
		KUBELET_HEALTHZ_PORT=${kubelet_healthz}
		KUBE_PROXY_HEALTHZ_PORT=${proxy_healthz}
		KUBE_PROXY_METRICS_PORT=${proxy_metrics}
		COREDNS_HEALTH_PORT=${dns_health}
		COREDNS_READY_PORT=${dns_ready}
		KUBE_NETWORK_POLICIES_METRICS_PORT=${netpol_metrics}
		KUBE_NETWORK_POLICIES_QUEUE=${REAL_NODE_NETPOL_QUEUE}
		MEMCACHED_IMAGE=${MEMCACHED_IMAGE}
		MEMCACHED_SID_IMAGE=${MEMCACHED_SID_IMAGE}
		PAUSE_IMAGE=${PAUSE_IMAGE}
		EXPORTER_IMAGE=${EXPORTER_IMAGE}
	EOF
	write_containerd_config
	write_cni_config
	write_kubelet_config "${kubelet_port}" "${kubelet_healthz}"
	write_kube_proxy_config "${proxy_healthz}" "${proxy_metrics}"
	write_corefile "${dns_health}" "${dns_ready}"

	start containerd containerd --config="$(rn_dir)/containerd/config.toml" --log-level=warn
	wait_for "containerd socket" containerd rn_ctr version
	"${HACK_DIR}/images.sh" import "$(rn_sock)"

	kctl apply --server-side --force-conflicts -f - >/dev/null <<<"$(dns_manifest)"
	start coredns "${COREDNS_BIN}" -conf="$(rn_dir)/Corefile"
	wait_for "coredns /ready" coredns http_ok "http://127.0.0.1:${dns_ready}/ready"

	# Enforcing before the node is Ready, so no pod runs before NetworkPolicies apply.
	kctl apply --server-side --force-conflicts -f "${TEMPLATES}/kube-network-policies.yaml" >/dev/null
	netpol_rules_up
	start kube-network-policies "${KUBE_NETWORK_POLICIES_BIN}" \
		--kubeconfig="${CLUSTER_DIR}/kubeconfig-kube-network-policies" \
		--hostname-override="${REAL_NODE_NAME}" \
		--nfqueue-id="${REAL_NODE_NETPOL_QUEUE}" \
		--metrics-bind-address="127.0.0.1:${netpol_metrics}" \
		--v=1
	wait_for "kube-network-policies on NFQUEUE ${REAL_NODE_NETPOL_QUEUE}" kube-network-policies netpol_queue_bound

	start kubelet "${KUBE_NODE_BIN}" kubelet \
		--config="$(rn_dir)/kubelet/config.yaml" \
		--kubeconfig="${CLUSTER_DIR}/kubeconfig-kubelet" \
		--root-dir="$(rn_dir)/kubelet/root" \
		--cert-dir="$(rn_dir)/kubelet/root/pki" \
		--hostname-override="${REAL_NODE_NAME}" \
		--node-ip="$(rn_gateway)" \
		--node-labels="type=real,${REAL_NODE_TAINT}=true" \
		--v=1
	wait_for "node ${REAL_NODE_NAME} registered" kubelet kctl get node "${REAL_NODE_NAME}"
	start kube-proxy "${KUBE_NODE_BIN}" kube-proxy --config="$(rn_dir)/kube-proxy.yaml" --v=1
	wait_for "node ${REAL_NODE_NAME} Ready" kubelet node_ready
	wait_for "kube-proxy /healthz" kube-proxy http_ok "http://127.0.0.1:${proxy_healthz}/healthz"
	REAL_NODE_READY_AFTER=$((SECONDS - t0))
	log "real node ${REAL_NODE_NAME} Ready ${REAL_NODE_READY_AFTER}s after its start (images ${MEMCACHED_IMAGE}, ${PAUSE_IMAGE})"
}

# ---------------------------------------------------------------- down

# drain_real_node DIR : with the scheduler and controller-manager stopped (nothing recreates or
# binds pods), delete the node's pods and let the kubelet stop them: CNI DEL, netns and
# mounts removed by their owners. Best effort, bounded.
drain_real_node() {
	local dir="$1" kc="$1/kubeconfig" name
	name="$(sed -n 's/^REAL_NODE_NAME=//p' "${dir}/real-node/node.env" 2>/dev/null)"
	[[ -n "${name}" ]] || name="${REAL_NODE_NAME}"
	real_node_running "${dir}" || return 0
	kubectl --kubeconfig "${kc}" --request-timeout=10s delete pods --all-namespaces \
		--field-selector "spec.nodeName=${name}" --grace-period=0 --force --wait=false >/dev/null 2>&1 || return 0
	local sock="${dir}/real-node/containerd/containerd.sock" deadline=$((SECONDS + 40))
	while [[ ${SECONDS} -lt ${deadline} ]]; do
		[[ -z "$(ctr --address "${sock}" -n k8s.io tasks ls -q 2>/dev/null)" ]] && break
		sleep 0.5
	done
}

# kill_cgroup_tree PATH : SIGKILL every process in the cgroup tree, then remove its directories.
kill_cgroup_tree() {
	local root="$1" procs pid
	[[ -d "${root}" ]] || return 0
	local _
	for _ in 1 2 3 4 5; do
		procs="$(find "${root}" -name cgroup.procs -exec cat {} + 2>/dev/null | sort -u)"
		[[ -n "${procs}" ]] || break
		for pid in ${procs}; do kill -KILL "${pid}" 2>/dev/null || true; done
		sleep 0.3
	done
	find "${root}" -depth -type d -exec rmdir {} + 2>/dev/null || true
	[[ ! -d "${root}" ]] || log "could not remove cgroup ${root}"
}

# kill_shims SOCKET : containerd-shim-runc-v2 processes serving the containerd at SOCKET.
kill_shims() {
	local sock="$1" p
	for p in /proc/[0-9]*; do
		[[ "$(readlink "${p}/exe" 2>/dev/null)" == */containerd-shim-runc-v2 ]] || continue
		tr '\0' ' ' <"${p}/cmdline" 2>/dev/null | grep -qF -- "-address ${sock} " || continue
		kill -KILL "${p#/proc/}" 2>/dev/null || true
	done
}

# delete_iptables_chains TOOL PREFIX_REGEX : remove rules jumping to matching chains and the chains.
delete_iptables_chains() {
	local tool="$1" re="$2" table chain rule
	command -v "${tool}-save" >/dev/null || return 0
	for table in filter nat mangle raw; do
		{ "${tool}-save" -t "${table}" 2>/dev/null || true; } | { grep -E -- "^-A .* -j (${re})" || true; } |
			while IFS= read -r rule; do
				eval "${tool} -t ${table} ${rule/#-A/-D}" 2>/dev/null || true
			done
		for chain in $("${tool}-save" -t "${table}" 2>/dev/null | sed -n 's/^:\([^ ]*\) .*/\1/p' | grep -E "^(${re})"); do
			"${tool}" -t "${table}" -F "${chain}" 2>/dev/null || true
		done
		for chain in $("${tool}-save" -t "${table}" 2>/dev/null | sed -n 's/^:\([^ ]*\) .*/\1/p' | grep -E "^(${re})"); do
			"${tool}" -t "${table}" -X "${chain}" 2>/dev/null || true
		done
	done
}

# rn_bridge_of DIR : the bridge of the real node of the cluster in DIR (as it was started).
rn_bridge_of() {
	local bridge
	bridge="$(sed -n 's/^REAL_NODE_BRIDGE=//p' "$1/real-node/node.env" 2>/dev/null)"
	printf '%s\n' "${bridge:-${REAL_NODE_BRIDGE}}"
}

# real_node_left DIR : after real_node_down, one line for each thing of a real node still on the
# host (kubepods cgroups, its bridge, network namespaces, KUBE-/CNI- chains); nothing without one.
real_node_left() {
	[[ -d "$1/real-node" ]] || return 0
	local p bridge
	bridge="$(rn_bridge_of "$1")"
	for p in /sys/fs/cgroup/*/kubepods /sys/fs/cgroup/kubepods; do [[ ! -d "${p}" ]] || echo "cgroup ${p}"; done
	if ip link show "${bridge}" >/dev/null 2>&1; then echo "bridge ${bridge}"; fi
	for p in /var/run/netns/*; do [[ ! -e "${p}" ]] || echo "network namespace ${p}"; done
	{ iptables-save; ip6tables-save; } 2>/dev/null | grep -oE "^:(KUBE-|CNI-|${REAL_NODE_NETPOL_CHAIN})[^ ]*" | sed 's/^:/iptables chain /' || true
}

# real_node_down DIR : stop the node components and undo what `up` did on the host. Runs after
# the scheduler, controller-manager and kwok are stopped, before the apiserver.
real_node_down() {
	local dir="$1" rn="$1/real-node"
	[[ -d "${rn}" ]] || return 0
	local bridge kube_node=""
	bridge="$(rn_bridge_of "${dir}")"
	if [[ -f "${dir}/logs/kubelet.cmdline" ]]; then
		kube_node="$(sed 's/ .*//' "${dir}/logs/kubelet.cmdline")"
	fi
	drain_real_node "${dir}"
	stop_components "${dir}" 20 kube-proxy kubelet coredns kube-network-policies
	local sock="${rn}/containerd/containerd.sock" netns=()
	if [[ -S "${sock}" ]]; then
		# Network namespaces of sandboxes still there (CRI keeps them in /var/run/netns).
		mapfile -t netns < <(ctr --address "${sock}" -n k8s.io containers ls -q 2>/dev/null |
			while read -r id; do ctr --address "${sock}" -n k8s.io containers info "${id}" 2>/dev/null; done |
			python3 -c '
import json, sys
dec, buf = json.JSONDecoder(), sys.stdin.read()
i = 0
while True:
    while i < len(buf) and buf[i].isspace():
        i += 1
    if i >= len(buf):
        break
    obj, i = dec.raw_decode(buf, i)
    for ns in ((obj.get("Spec") or {}).get("linux") or {}).get("namespaces") or []:
        if ns.get("type") == "network" and ns.get("path", "").startswith("/var/run/netns/"):
            print(ns["path"])
' 2>/dev/null | sort -u)
	fi
	# Also those libcni's cache names (when containerd is gone, e.g. after a crash).
	local cached
	cached="$(python3 - <<-'PY' 2>/dev/null || true
		import glob, json
		for f in glob.glob("/var/lib/cni/results/memcached-operator-real-node-*"):
		    try:
		        d = json.load(open(f))
		    except (OSError, ValueError):
		        continue
		    for i in (d.get("result") or {}).get("interfaces") or []:
		        if i.get("sandbox", "").startswith("/var/run/netns/"):
		            print(i["sandbox"])
		    cid = d.get("containerId", "")
		    if cid:
		        print("loopback-cache " + cid)
		PY
	)"
	local line
	while IFS= read -r line; do
		case "${line}" in
		"loopback-cache "*) rm -f "/var/lib/cni/results/cni-loopback-${line#loopback-cache }-lo" ;;
		/var/run/netns/*) netns+=("${line}") ;;
		esac
	done <<<"${cached}"
	stop_components "${dir}" 15 containerd
	kill_shims "${sock}"
	# Containers the shims left (e.g. after a SIGKILL): everything in the kubepods cgroups.
	local cg
	for cg in /sys/fs/cgroup/*/kubepods /sys/fs/cgroup/kubepods; do kill_cgroup_tree "${cg}"; done
	local n
	for n in "${netns[@]+"${netns[@]}"}"; do
		umount "${n}" 2>/dev/null || true
		rm -f "${n}"
	done
	# Mounts under DIR (overlay rootfs, shm, projected volumes), deepest first.
	local m
	while read -r m; do
		umount "${m}" 2>/dev/null || umount -l "${m}" 2>/dev/null || log "could not unmount ${m}"
	done < <(awk -v d="${dir}/" 'index($5, d) == 1 {print $5}' /proc/self/mountinfo | sort -r)
	# kube-proxy's and the kubelet's iptables chains, and CNI's (portmap, bridge).
	if [[ -n "${kube_node}" && -x "${kube_node}" ]]; then
		"${kube_node}" kube-proxy --cleanup >"${dir}/logs/kube-proxy-cleanup.log" 2>&1 || true
	fi
	delete_iptables_chains iptables 'KUBE-|CNI-'
	delete_iptables_chains ip6tables 'KUBE-|CNI-'
	delete_iptables_chains iptables "${REAL_NODE_NETPOL_CHAIN}"
	if ip link show "${bridge}" >/dev/null 2>&1; then ip link delete "${bridge}" || log "could not delete ${bridge}"; fi
	restore_sysctls "${dir}"
	# The kubelet's symlinks to our pod logs, libcni's cache of our network, and the empty
	# directories the kubelet, containerd and runc create at fixed host paths.
	find /var/log/containers -maxdepth 1 -type l -lname "${rn}/*" -delete 2>/dev/null || true
	find /var/lib/cni/results -maxdepth 1 -name 'memcached-operator-real-node-*' -delete 2>/dev/null || true
	# The device-plugin socket is at a fixed path, whatever --root-dir says.
	rm -f /var/lib/kubelet/device-plugins/kubelet.sock
	local d
	for d in /var/log/containers /var/run/netns /run/containerd/s /run/containerd/runc /var/lib/cni /var/lib/kubelet; do
		if [[ -d "${d}" ]]; then find "${d}" -depth -type d -empty -delete 2>/dev/null || true; fi
	done
	rmdir /run/containerd 2>/dev/null || true
	if [[ -f "${REAL_NODE_LOCK}" && "$(cat "${REAL_NODE_LOCK}")" == "${dir}" ]]; then rm -f "${REAL_NODE_LOCK}"; fi
	log "real node of ${dir} is down"
}
