# shellcheck shell=bash
# Shell helpers shared by the hack/ scripts. Source it; it defines functions only.
#   LOG_TAG     prefix of log lines (set it before sourcing or any time after)
#   BIN_ROOT    cache directory the build helpers work in
#   GO          go binary (module_field)

log() { printf '[%s] %s\n' "${LOG_TAG:-hack}" "$*" >&2; }
die() {
	log "ERROR: $*"
	exit 1
}

# Configuration files with ${KEY} placeholders, rendered by render.
TEMPLATES="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/templates"

# render TEMPLATE KEY=VALUE... : print TEMPLATE with each ${KEY} filled in (Python's
# string.Template); a ${KEY} without a value is an error, not an empty string.
render() {
	python3 -c 'import string, sys
print(string.Template(open(sys.argv[1]).read()).substitute(dict(a.split("=", 1) for a in sys.argv[2:])), end="")' "$@"
}

timed() { # LABEL CMD... : run CMD, log its wall time.
	local label="$1" start rc=0
	shift
	start=$(date +%s)
	"$@" || rc=$?
	log "${label}: $(($(date +%s) - start))s (exit ${rc})"
	return "${rc}"
}

# is_fresh DIR STAMP FILE... : DIR holds a build with this stamp and every FILE, non-empty.
is_fresh() {
	local dir="$1" want="$2"
	shift 2
	[[ -f "${dir}/.stamp" && "$(cat "${dir}/.stamp")" == "${want}" ]] || return 1
	local f
	for f in "$@"; do [[ -s "${dir}/${f}" ]] || return 1; done
}

# new_tmp PREFIX NAME : a fresh build directory inside BIN_ROOT (same file system, so installing
# it is a rename). Each builder uses its own PREFIX and clears only its own leftovers.
new_tmp() {
	local d
	d="$(mktemp -d "${BIN_ROOT}/$1.$2.XXXXXX")"
	chmod 755 "${d}"
	printf "%s" "${d}"
}

# install_dir PREFIX TMP DEST : replace DEST with TMP by renames within one file system.
install_dir() {
	local prefix="$1" tmp="$2" dest="$3" old=""
	if [[ -e "${dest}" ]]; then
		old="$(mktemp -d "${BIN_ROOT}/${prefix}.XXXXXX")"
		mv "${dest}" "${old}/"
	fi
	mv "${tmp}" "${dest}"
	if [[ -n "${old}" ]]; then rm -rf "${old}"; fi
}

# module_field MODULE@VERSION FIELD : a string field of `go mod download -json` (or its Origin).
module_field() {
	(cd "${BIN_ROOT}" && GOFLAGS="" "${GO}" mod download -json "$1") |
		python3 -c 'import json,sys; d=json.load(sys.stdin); f=sys.argv[1]
if "Error" in d: sys.exit("go mod download: " + d["Error"])
print(d.get(f) or (d.get("Origin") or {}).get(f) or "")' "$2"
}

# free_ports N : N distinct TCP ports that are free on 127.0.0.1, chosen below the
# kernel's ephemeral range (so outgoing connections made while the cluster starts
# cannot grab them) and away from the well-known Kubernetes defaults.
free_ports() {
	python3 - "$1" <<'PY'
import random, socket, sys
n = int(sys.argv[1])
try:
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        eph_lo = int(f.read().split()[0])
except OSError:
    eph_lo = 32768
lo, hi = 20000, max(20000 + 4 * n, min(eph_lo, 32768)) - 1
out = []
for _ in range(20000):
    if len(out) == n:
        break
    p = random.randint(lo, hi)
    if p in out:
        continue
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.bind(("127.0.0.1", p))
    except OSError:
        continue
    finally:
        s.close()
    out.append(p)
if len(out) != n:
    sys.exit("could not find %d free ports" % n)
print(" ".join(map(str, out)))
PY
}

# write_kubeconfig FILE SERVER CA_FILE USER TOKEN [NAMESPACE] : a kubeconfig at FILE (mode 600).
write_kubeconfig() {
	(
		umask 077
		render "${TEMPLATES}/kubeconfig.yaml" SERVER="$2" CA_DATA="$(base64 -w0 <"$3")" USER="$4" TOKEN="$5" \
			NAMESPACE="${6:-default}" >"$1"
	)
}

# write_sa_kubeconfig NS SA OUT DURATION : a kubeconfig at OUT for ServiceAccount SA in NS, with a
# token of DURATION, against the cluster of the current KUBECONFIG.
write_sa_kubeconfig() {
	local ns="$1" sa="$2" out="$3" duration="$4" token server
	token="$(kubectl --request-timeout=20s -n "${ns}" create token "${sa}" --duration="${duration}")"
	server="$(kubectl config view --raw -o jsonpath='{.clusters[0].cluster.server}')"
	write_kubeconfig "${out}" "${server}" <(kubectl config view --raw -o jsonpath='{.clusters[0].cluster.certificate-authority-data}' | base64 -d) \
		"${sa}" "${token}" "${ns}"
}

# ensure_packages PKG... : install the Debian packages that are missing (apt-get, as root,
# --no-install-recommends), and log what was installed. Installed ones are left alone. Services
# the packages ship (containerd, memcached) are kept from starting by a temporary policy-rc.d.
ensure_packages() {
	local p missing=()
	for p in "$@"; do
		dpkg-query -W -f='${Status}' "${p}" 2>/dev/null | grep -q 'install ok installed' || missing+=("${p}")
	done
	[[ ${#missing[@]} -gt 0 ]] || return 0
	[[ "$(id -u)" -eq 0 ]] || die "missing Debian packages: ${missing[*]} (run as root, or apt-get install them)"
	command -v apt-get >/dev/null || die "missing packages ${missing[*]} and no apt-get"
	log "installing Debian packages: ${missing[*]}"
	local policy=/usr/sbin/policy-rc.d own_policy=0
	if [[ ! -e "${policy}" ]]; then
		printf '#!/bin/sh\nexit 101\n' >"${policy}"
		chmod 755 "${policy}"
		own_policy=1
	fi
	local rc=0
	local -a apt=(env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600) # make tools' too
	{
		"${apt[@]}" install -y --no-install-recommends "${missing[@]}" ||
			{ "${apt[@]}" update -qq && "${apt[@]}" install -y --no-install-recommends "${missing[@]}"; }
	} >&2 || rc=$?
	if [[ ${own_policy} -eq 1 ]]; then rm -f "${policy}"; fi
	[[ ${rc} -eq 0 ]] || die "apt-get install ${missing[*]} failed (exit ${rc})"
	for p in "${missing[@]}"; do log "installed ${p} $(dpkg-query -W -f='${Version}' "${p}")"; done
}

# oci_image ARCHIVE TAG ROOTFS_FN CONFIG_ARGS... : an OCI layout with one layer made by
# ROOTFS_FN DIR (it fills DIR), configured with umoci config CONFIG_ARGS, tarred to ARCHIVE
# (built in a .tmp.image.* beside it). Needs umoci.
oci_image() {
	local archive="$1" tag="$2" fill="$3"
	shift 3
	local work layout bundle
	work="$(mktemp -d "$(dirname "${archive}")/.tmp.image.XXXXXX")"
	layout="${work}/layout"
	bundle="${work}/bundle"
	umoci init --layout "${layout}"
	umoci new --image "${layout}:${tag}"
	umoci unpack --image "${layout}:${tag}" "${bundle}" >/dev/null
	"${fill}" "${bundle}/rootfs"
	umoci repack --image "${layout}:${tag}" "${bundle}"
	umoci config --image "${layout}:${tag}" --os linux --architecture amd64 "$@"
	umoci gc --layout "${layout}"
	tar -C "${layout}" -cf "${work}/image.tar" .
	mv "${work}/image.tar" "${archive}"
	rm -rf "${work}"
	log "built ${archive} ($(du -h "${archive}" | cut -f1))"
}
