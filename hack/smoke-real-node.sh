#!/usr/bin/env bash
# Smoke test of the real node (root only):
#   hack/smoke-real-node.sh [DIR]      (default: a fresh temporary directory)
# Brings a cluster up with REAL_NODE=1 in DIR, runs 3 memcached pods of the local image on the
# real node with the operator's restricted security context, checks readiness, CoreDNS
# (headless Service), kube-proxy (ClusterIP), the memcached protocol on every pod, the uid and
# confinement of the memcached processes, then takes the cluster down and checks that nothing is
# left on the host. Prints `N passed, N failed`; exit status 1 if any failed.
set -euo pipefail

HACK_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
[[ $# -le 1 ]] || {
	echo "usage: $0 [DIR]" >&2
	exit 2
}
[[ "$(id -u)" -eq 0 ]] || {
	echo "$0: needs root (containerd, runc, bridges, iptables)" >&2
	exit 2
}
if [[ $# -eq 1 ]]; then
	mkdir -p "$1"
	DIR="$(cd "$1" && pwd -P)"
else
	DIR="$(mktemp -d /tmp/memcached-operator-real-node.XXXXXX)"
fi
NS=smoke-real
MAXMEM_MIB=48
REPLICAS=3
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

# poll SECONDS CMD... : retry CMD every 0.5 s.
poll() {
	local deadline=$((SECONDS + $1))
	shift
	until "$@" >/dev/null 2>&1; do
		[[ ${SECONDS} -lt ${deadline} ]] || return 1
		sleep 0.5
	done
}

UP=0
down() {
	if [[ ${UP} -eq 1 ]]; then
		UP=0
		"${HACK_DIR}/cluster.sh" down "${DIR}" >"${DIR}/down.log" 2>&1 || fail "cluster.sh down (see ${DIR}/down.log)"
	fi
}
trap down EXIT

# A DNS query for A records, in Python's standard library only: dns_a SERVER NAME
dns_a() {
	python3 - "$1" "$2" <<'PY'
import random, socket, struct, sys
server, name = sys.argv[1], sys.argv[2]
qid = random.randint(0, 65535)
q = struct.pack(">HHHHHH", qid, 0x0100, 1, 0, 0, 0)
q += b"".join(bytes([len(p)]) + p.encode() for p in name.rstrip(".").split(".")) + b"\0"
q += struct.pack(">HH", 1, 1)
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(3)
s.sendto(q, (server, 53))
r, _ = s.recvfrom(4096)
rid, flags, qd, an, _, _ = struct.unpack(">HHHHHH", r[:12])
if rid != qid or flags & 0xF:
    sys.exit("rcode %d" % (flags & 0xF))
i = 12
def skip_name(i):
    while True:
        n = r[i]
        if n == 0:
            return i + 1
        if n & 0xC0 == 0xC0:
            return i + 2
        i += n + 1
for _ in range(qd):
    i = skip_name(i) + 4
for _ in range(an):
    i = skip_name(i)
    typ, _cls, _ttl, ln = struct.unpack(">HHIH", r[i:i + 10])
    i += 10
    if typ == 1:
        print(socket.inet_ntoa(r[i:i + 4]))
    i += ln
PY
}

# memcached text protocol: mc HOST PORT LINE... : send the lines (the last one a get, stats or
# other command answered with END), print the reply.
mc() {
	python3 - "$@" <<'PY'
import socket, sys
host, port, lines = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
s = socket.create_connection((host, port), timeout=5)
s.sendall(("\r\n".join(lines) + "\r\n").encode())
buf = b""
while not buf.endswith((b"END\r\n", b"ERROR\r\n")):
    d = s.recv(65536)
    if not d:
        break
    buf += d
sys.stdout.write(buf.decode())
PY
}

rss_kib() { awk '/^VmRSS:/{print $2}' "/proc/$1/status" 2>/dev/null || echo 0; }

# ---------------------------------------------------------------- up
t0=${SECONDS}
if REAL_NODE=1 "${HACK_DIR}/cluster.sh" up "${DIR}" >"${DIR}/up.log" 2>&1; then
	UP=1
	ok "cluster up with a real node in $((SECONDS - t0))s ($(grep -o 'real node real-node Ready [0-9]*s after the control plane' "${DIR}/up.log" || true))"
else
	cat "${DIR}/up.log"
	fail "REAL_NODE=1 cluster.sh up (log above)"
	echo "${PASS} passed, ${FAIL} failed"
	exit 1
fi
# shellcheck disable=SC1091
source "${DIR}/env"
export KUBECONFIG

if k wait --for=condition=Ready node/real-node --timeout=30s >/dev/null; then ok "node real-node Ready"; else fail "real-node not Ready"; fi
runtime="$(k get node real-node -o jsonpath='{.status.nodeInfo.containerRuntimeVersion} {.status.nodeInfo.kubeletVersion}')"
if [[ "${runtime}" == containerd://* ]]; then ok "real-node runs ${runtime}"; else fail "real-node runtime: ${runtime}"; fi
if k wait --for=condition=Ready node -l type=kwok --timeout=30s >/dev/null; then ok "kwok nodes still Ready"; else fail "kwok nodes not Ready"; fi

k create namespace "${NS}" >/dev/null
poll 30 k get serviceaccount default -n "${NS}" || fail "serviceaccount ${NS}/default not created"
k apply -n "${NS}" -f - >/dev/null <<EOF
apiVersion: apps/v1
kind: Deployment
metadata: {name: memcached}
spec:
  replicas: ${REPLICAS}
  selector: {matchLabels: {app: memcached}}
  template:
    metadata: {labels: {app: memcached}}
    spec:
      nodeSelector: {type: real}
      tolerations:
      - {key: memcached-operator.dev/real-node, operator: Equal, value: "true", effect: NoSchedule}
      securityContext:
        runAsNonRoot: true
        runAsUser: 11211
        runAsGroup: 11211
        seccompProfile: {type: RuntimeDefault}
      containers:
      - name: memcached
        image: ${MEMCACHED_IMAGE}
        imagePullPolicy: IfNotPresent
        command: [memcached]
        args: [-m, "${MAXMEM_MIB}", -p, "11211", -o, modern, -v]
        ports: [{name: memcached, containerPort: 11211, protocol: TCP}]
        readinessProbe: {tcpSocket: {port: memcached}, initialDelaySeconds: 1, periodSeconds: 2}
        securityContext:
          runAsNonRoot: true
          runAsUser: 11211
          allowPrivilegeEscalation: false
          readOnlyRootFilesystem: true
          capabilities: {drop: [ALL]}
          seccompProfile: {type: RuntimeDefault}
---
apiVersion: v1
kind: Service
metadata: {name: memcached}
spec:
  clusterIP: None
  selector: {app: memcached}
  ports: [{name: memcached, port: 11211, targetPort: memcached}]
---
apiVersion: v1
kind: Service
metadata: {name: memcached-vip}
spec:
  selector: {app: memcached}
  ports: [{name: memcached, port: 11211, targetPort: memcached}]
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: fake}
spec:
  replicas: 2
  selector: {matchLabels: {app: fake}}
  template:
    metadata: {labels: {app: fake}}
    spec:
      containers: [{name: c, image: memcached:1.6}]
EOF

t_pods=${SECONDS}
if k rollout status deployment/memcached -n "${NS}" --timeout=120s >/dev/null; then
	ok "${REPLICAS} memcached pods Ready $((SECONDS - t_pods))s after apply"
else
	fail "memcached rollout not complete"
	k get pods -n "${NS}" -o wide || true
	k describe pods -n "${NS}" -l app=memcached | tail -30 || true
fi
mapfile -t pods < <(k get pods -n "${NS}" -l app=memcached -o jsonpath='{range .items[*]}{.metadata.name} {.spec.nodeName} {.status.podIP} {.status.containerStatuses[0].ready} {.status.containerStatuses[0].containerID}{"\n"}{end}')
ips=()
cids=()
on_real=0
for p in "${pods[@]}"; do
	read -r _ node ip ready cid <<<"${p}"
	if [[ "${node}" == real-node && "${ready}" == true ]]; then on_real=$((on_real + 1)); fi
	ips+=("${ip}")
	cids+=("${cid#containerd://}")
done
if [[ ${on_real} -eq ${REPLICAS} ]]; then ok "${on_real} pods Ready on real-node"; else fail "${on_real}/${REPLICAS} pods Ready on real-node: ${pods[*]}"; fi
if python3 -c 'import ipaddress,sys; n=ipaddress.ip_network(sys.argv[1]); sys.exit(0 if sys.argv[2:] and all(ipaddress.ip_address(a) in n for a in sys.argv[2:]) else 1)' \
	"${REAL_NODE_POD_CIDR}" "${ips[@]}"; then
	ok "pod IPs ${ips[*]} from the CNI range ${REAL_NODE_POD_CIDR} (not kwok's)"
else
	fail "pod IPs ${ips[*]} not in ${REAL_NODE_POD_CIDR}"
fi
if k rollout status deployment/fake -n "${NS}" --timeout=60s >/dev/null &&
	[[ "$(k get pods -n "${NS}" -l app=fake -o jsonpath='{range .items[*]}{.spec.nodeName}{"\n"}{end}' | grep -c '^kwok-node-')" -eq 2 ]]; then
	ok "pods without the toleration still go to kwok nodes"
else
	fail "fake deployment not on kwok nodes"
fi

# A namespace whose pods go to the real node by annotation (PodNodeSelector and
# PodTolerationRestriction admission), for pod templates without tolerations (the operator's).
k apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Namespace
metadata:
  name: ${NS}-annotated
  annotations:
    scheduler.alpha.kubernetes.io/node-selector: type=real
    scheduler.alpha.kubernetes.io/defaultTolerations: '[{"key": "memcached-operator.dev/real-node", "operator": "Equal", "value": "true", "effect": "NoSchedule"}]'
EOF
poll 30 k get serviceaccount default -n "${NS}-annotated" || true
k create deployment plain -n "${NS}-annotated" --image="${MEMCACHED_IMAGE}" --replicas=1 -- memcached -m 8 >/dev/null
if k rollout status deployment/plain -n "${NS}-annotated" --timeout=60s >/dev/null &&
	[[ "$(k get pods -n "${NS}-annotated" -l app=plain -o jsonpath='{.items[0].spec.nodeName}')" == real-node ]]; then
	ok "a pod without tolerations in an annotated namespace runs on real-node"
else
	fail "annotated namespace: $(k get pods -n "${NS}-annotated" -o wide 2>&1 | tail -n +2)"
fi
k delete namespace "${NS}-annotated" --wait=false >/dev/null

# ---------------------------------------------------------------- memcached processes
pids=()
for cid in "${cids[@]}"; do
	pid="$(ctr --address "${REAL_NODE_CONTAINERD_SOCKET}" -n k8s.io tasks ls 2>/dev/null | awk -v c="${cid}" '$1==c {print $2}')"
	[[ -n "${pid}" ]] && pids+=("${pid}")
done
if [[ ${#pids[@]} -eq ${REPLICAS} ]]; then ok "containerd reports ${#pids[@]} memcached tasks"; else fail "found ${#pids[@]} memcached tasks"; fi
for pid in "${pids[@]}"; do
	st="/proc/${pid}/status"
	exe="$(readlink "/proc/${pid}/exe" || true)"
	uid="$(awk '/^Uid:/{print $2, $3, $4, $5}' "${st}")"
	capeff="$(awk '/^CapEff:/{print $2}' "${st}")"
	seccomp="$(awk '/^Seccomp:/{print $2}' "${st}")"
	nnp="$(awk '/^NoNewPrivs:/{print $2}' "${st}")"
	rootopts="$(awk '$5=="/" {print $6}' "/proc/${pid}/mountinfo")"
	if [[ "${exe}" == */usr/bin/memcached && "${uid}" == "11211 11211 11211 11211" && "${capeff}" == 0000000000000000 &&
		"${seccomp}" == 2 && "${nnp}" == 1 && "${rootopts}" == ro,* ]]; then
		ok "pid ${pid}: memcached as uid 11211, no capabilities, seccomp filter, no_new_privs, read-only root"
	else
		fail "pid ${pid}: exe=${exe} Uid=${uid} CapEff=${capeff} Seccomp=${seccomp} NoNewPrivs=${nnp} root=${rootopts}"
	fi
done
if [[ ${#pids[@]} -gt 0 ]]; then
	resolv="$(cat "/proc/${pids[0]}/root/etc/resolv.conf" 2>/dev/null || true)"
	if grep -q "^nameserver ${REAL_NODE_DNS_IP}\$" <<<"${resolv}" && grep -q "search ${NS}.svc.cluster.local" <<<"${resolv}"; then
		ok "pod resolv.conf: nameserver ${REAL_NODE_DNS_IP}, search ${NS}.svc.cluster.local"
	else
		fail "pod resolv.conf: ${resolv}"
	fi
fi

# ---------------------------------------------------------------- DNS and Services
name="memcached.${NS}.svc.cluster.local"
want="$(printf '%s\n' "${ips[@]}" | sort | tr '\n' ' ')"
got=""
for _ in $(seq 1 30); do
	got="$(dns_a "${REAL_NODE_DNS_IP}" "${name}" 2>/dev/null | sort | tr '\n' ' ')" || got=""
	[[ "${got}" == "${want}" ]] && break
	sleep 1
done
if [[ "${got}" == "${want}" ]]; then
	ok "host: ${name} via kube-dns ${REAL_NODE_DNS_IP} (kube-proxy -> CoreDNS) = ${got}"
else
	fail "host: ${name} resolved to '${got}', want '${want}'"
fi
if [[ ${#pids[@]} -gt 0 ]]; then
	got_pod="$(nsenter --net="/proc/${pids[0]}/ns/net" bash -c "$(declare -f dns_a); dns_a ${REAL_NODE_DNS_IP} ${name}" 2>&1 | sort | tr '\n' ' ')" || true
	if [[ "${got_pod}" == "${want}" ]]; then
		ok "inside a pod's network namespace: ${name} = ${got_pod}"
	else
		fail "inside a pod's network namespace: '${got_pod}'"
	fi
	# The apiserver from a pod: kubernetes.default.svc (10.96.0.1:443, kube-proxy -> the apiserver
	# on the bridge), its certificate checked against the pod's CA, the pod's ServiceAccount token.
	sa="/proc/${pids[0]}/root/var/run/secrets/kubernetes.io/serviceaccount"
	version="$(nsenter --net="/proc/${pids[0]}/ns/net" python3 - "${sa}" 2>&1 <<-'PY' || true
		import http.client, json, socket, ssl, sys
		sa = sys.argv[1]
		ctx = ssl.create_default_context(cafile=sa + "/ca.crt")
		# The host's resolver is not the pod's: connect to the ClusterIP, check the Service's name.
		conn = http.client.HTTPSConnection("kubernetes.default.svc", 443, context=ctx, timeout=5)
		conn.sock = ctx.wrap_socket(socket.create_connection(("10.96.0.1", 443), 5),
		                            server_hostname="kubernetes.default.svc")
		conn.request("GET", "/version", headers={"Authorization": "Bearer " + open(sa + "/token").read()})
		print(json.load(conn.getresponse())["gitVersion"])
		PY
	)"
	if [[ "${version}" == v1.* ]]; then
		ok "inside a pod's network namespace: GET https://kubernetes.default.svc/version with its token = ${version}"
	else
		fail "pod -> apiserver: ${version}"
	fi
	if k logs -n "${NS}" deployment/memcached --tail=1 >/dev/null 2>&1; then ok "kubectl logs reaches the kubelet"; else fail "kubectl logs: $(k logs -n "${NS}" deployment/memcached --tail=1 2>&1)"; fi
fi

i=0
for ip in "${ips[@]}"; do
	i=$((i + 1))
	reply="$(mc "${ip}" 11211 "set smoke-${i} 0 0 5" "v-${i}-x" "get smoke-${i}" 2>&1 || true)"
	if grep -q '^STORED' <<<"${reply}" && grep -q "^v-${i}-x" <<<"${reply}"; then
		ok "memcached ${ip}: set/get smoke-${i}"
	else
		fail "memcached ${ip}: ${reply}"
	fi
	limit="$(mc "${ip}" 11211 "stats settings" 2>&1 | awk '$2=="maxbytes" {print $3}' | tr -d '\r' || true)"
	if [[ "${limit}" == "$((MAXMEM_MIB * 1024 * 1024))" ]]; then
		ok "memcached ${ip}: stats settings maxbytes ${limit} (-m ${MAXMEM_MIB})"
	else
		fail "memcached ${ip}: maxbytes '${limit}', want $((MAXMEM_MIB * 1024 * 1024))"
	fi
	limit="$(mc "${ip}" 11211 "stats" 2>&1 | awk '$2=="limit_maxbytes" {print $3}' | tr -d '\r' || true)"
	if [[ "${limit}" == "$((MAXMEM_MIB * 1024 * 1024))" ]]; then
		ok "memcached ${ip}: stats limit_maxbytes ${limit}"
	else
		fail "memcached ${ip}: limit_maxbytes '${limit}', want $((MAXMEM_MIB * 1024 * 1024))"
	fi
done
vip="$(k get service memcached-vip -n "${NS}" -o jsonpath='{.spec.clusterIP}')"
reply=""
for _ in $(seq 1 20); do
	reply="$(mc "${vip}" 11211 "version" "get smoke-1" 2>/dev/null || true)"
	[[ "${reply}" == VERSION* ]] && break
	sleep 0.5
done
if [[ "${reply}" == VERSION* ]]; then ok "ClusterIP ${vip}:11211 answers through kube-proxy (${reply%%$'\r'*})"; else fail "ClusterIP ${vip}: '${reply}'"; fi

# ---------------------------------------------------------------- memory of the node components
mem=""
total=0
for c in containerd kubelet kube-proxy coredns; do
	kib="$(rss_kib "$(tr -dc '0-9' <"${DIR}/pids/${c}.pid")")"
	total=$((total + kib))
	mem+="${c} $((kib / 1024)) MiB, "
done
shims=0
for p in /proc/[0-9]*; do
	[[ "$(readlink "${p}/exe" 2>/dev/null)" == */containerd-shim-runc-v2 ]] || continue
	tr '\0' ' ' <"${p}/cmdline" 2>/dev/null | grep -qF -- "-address ${REAL_NODE_CONTAINERD_SOCKET} " || continue
	shims=$((shims + $(rss_kib "${p#/proc/}")))
done
mcmem=0
for pid in "${pids[@]}"; do mcmem=$((mcmem + $(rss_kib "${pid}"))); done
echo "memory (RSS): ${mem}total $((total / 1024)) MiB; ${REPLICAS} shims $((shims / 1024)) MiB; ${REPLICAS} memcached $((mcmem / 1024)) MiB"

# ---------------------------------------------------------------- down, and nothing left
t_down=${SECONDS}
down
ok "cluster.sh down in $((SECONDS - t_down))s"
left=""
for p in /proc/[0-9]*; do
	cmd="$(tr '\0' ' ' <"${p}/cmdline" 2>/dev/null)" || continue
	[[ "${cmd}" == *"${DIR}/"* ]] && left+="${p#/proc/}: ${cmd:0:80}; "
done
for pid in "${pids[@]}"; do
	if [[ -d "/proc/${pid}" ]]; then left+="memcached ${pid} still alive; "; fi
done
if [[ -z "${left}" ]]; then ok "no process of the cluster left"; else fail "processes left: ${left}"; fi
mounts="$(awk -v d="${DIR}/" 'index($5, d) == 1 {print $5}' /proc/self/mountinfo)"
if [[ -z "${mounts}" ]]; then ok "no mounts under ${DIR}"; else fail "mounts left: ${mounts}"; fi
cg="$(ls -d /sys/fs/cgroup/*/kubepods 2>/dev/null || true)"
if [[ -z "${cg}" ]]; then ok "no kubepods cgroups left"; else fail "cgroups left: ${cg}"; fi
if ! ip link show "${REAL_NODE_BRIDGE}" >/dev/null 2>&1; then ok "bridge ${REAL_NODE_BRIDGE} removed"; else fail "bridge ${REAL_NODE_BRIDGE} still there"; fi
netns="$(ls /var/run/netns 2>/dev/null || true)"
if [[ -z "${netns}" ]]; then ok "no network namespaces left in /var/run/netns"; else fail "netns left: ${netns}"; fi
chains="$({ iptables-save; ip6tables-save; } 2>/dev/null | grep -E '^:(KUBE|CNI)-' || true)"
if [[ -z "${chains}" ]]; then ok "no KUBE-/CNI- iptables chains left"; else fail "iptables chains left: ${chains//$'\n'/ }"; fi
echo "${PASS} passed, ${FAIL} failed"
[[ ${FAIL} -eq 0 ]]
