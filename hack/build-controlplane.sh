#!/usr/bin/env bash
# Builds the hermetic local control plane from Go modules (no container runtime):
#   kube-controlplane  multi-call kube-apiserver / kube-controller-manager / kube-scheduler
#   etcd               etcd server
#   kwok               fake kubelet (node and pod status), plus its stages.yaml
#   cert-manager       cert-manager's controllers and CRDs, for the tests of spec.tls.issuerRef
#                      (only with --cert-manager, which the test kit runs: the quick start needs none)
# into ${MEMCACHED_OPERATOR_CACHE:-$HOME/.cache/memcached-operator}/bin/<name>-<version>/.
#
# Usage:
#   hack/build-controlplane.sh                   build whatever is missing or stale
#   hack/build-controlplane.sh --print-env       print BIN paths (shell-sourceable), build nothing
#   hack/build-controlplane.sh --update-modules  regenerate hack/{controlplane,etcd,certmanager}/go.{mod,sum}
#                                                from hack/versions.env (needs the module proxy)
#   hack/build-controlplane.sh --node            build only the real node's binaries (REAL_NODE=1):
#                                                kube-node (multi-call kubelet / kube-proxy, from
#                                                hack/controlplane/node), coredns (.../coredns) and
#                                                kube-network-policies (.../netpol)
#
# A cached build is reused when its stamp (version + hash of the wrapper's go.mod,
# go.sum, main.go and the build recipe) matches; otherwise it is rebuilt. Builds go to
# a temporary directory that is renamed into place only on success.
set -euo pipefail

HACK_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck disable=SC1091 # plain KEY=VALUE pins
source "${HACK_DIR}/versions.env"

CACHE_DIR="${MEMCACHED_OPERATOR_CACHE:-${HOME}/.cache/memcached-operator}"
BIN_ROOT="${CACHE_DIR}/bin"
GO="${GO:-go}"
if ! command -v "${GO}" >/dev/null && [[ -x /usr/local/go/bin/go ]]; then GO=/usr/local/go/bin/go; fi

# Bump to force a rebuild of everything when the recipe below changes.
RECIPE_VERSION=1

KUBE_CONTROLPLANE_DIR="${BIN_ROOT}/kube-controlplane-${KUBE_VERSION}"
ETCD_DIR="${BIN_ROOT}/etcd-${ETCD_VERSION}"
KWOK_DIR="${BIN_ROOT}/kwok-${KWOK_VERSION}"
KUBE_NODE_DIR="${BIN_ROOT}/kube-node-${KUBE_VERSION}"
COREDNS_DIR="${BIN_ROOT}/coredns-${COREDNS_VERSION}"
NETPOL_DIR="${BIN_ROOT}/kube-network-policies-${KUBE_NETWORK_POLICIES_VERSION}"
CERT_MANAGER_DIR="${BIN_ROOT}/cert-manager-${CERT_MANAGER_VERSION}"

LOG_TAG="build-controlplane"
# shellcheck source=hack/lib.sh
source "${HACK_DIR}/lib.sh"

print_env() {
	printf 'KUBE_CONTROLPLANE_BIN=%q\n' "${KUBE_CONTROLPLANE_DIR}/kube-controlplane"
	printf 'ETCD_BIN=%q\n' "${ETCD_DIR}/etcd"
	printf 'KWOK_BIN=%q\n' "${KWOK_DIR}/kwok"
	printf 'KWOK_STAGES=%q\n' "${KWOK_DIR}/stages.yaml"
	printf 'KUBE_VERSION=%q\nETCD_VERSION=%q\nKWOK_VERSION=%q\n' "${KUBE_VERSION}" "${ETCD_VERSION}" "${KWOK_VERSION}"
	printf 'KUBE_NODE_BIN=%q\n' "${KUBE_NODE_DIR}/kube-node"
	printf 'COREDNS_BIN=%q\nCOREDNS_VERSION=%q\n' "${COREDNS_DIR}/coredns" "${COREDNS_VERSION}"
	printf 'KUBE_NETWORK_POLICIES_BIN=%q\nKUBE_NETWORK_POLICIES_VERSION=%q\n' \
		"${NETPOL_DIR}/kube-network-policies" "${KUBE_NETWORK_POLICIES_VERSION}"
	printf 'CERT_MANAGER_BIN=%q\nCERT_MANAGER_CRDS=%q\n' "${CERT_MANAGER_DIR}/cert-manager" "${CERT_MANAGER_DIR}/crds"
}

# stamp NAME VERSION FILES... : identifies one build (version, recipe, wrapper sources).
stamp() {
	local name="$1" version="$2"
	shift 2
	{
		printf '%s %s recipe=%s\n' "${name}" "${version}" "${RECIPE_VERSION}"
		if [[ $# -gt 0 ]]; then cat "$@"; fi
	} | sha256sum | cut -c1-16
}

kube_ldflags() {
	local commit build_date major minor ldflags pkg
	commit="$(module_field "k8s.io/kubernetes@${KUBE_VERSION}" Hash)"
	build_date="$(module_field "k8s.io/kubernetes@${KUBE_VERSION}" Time)"
	major="${KUBE_VERSION#v}"
	major="${major%%.*}"
	minor="${KUBE_VERSION#v*.}"
	minor="${minor%%.*}"
	ldflags="-s -w"
	for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
		ldflags+=" -X ${pkg}.gitVersion=${KUBE_VERSION}"
		ldflags+=" -X ${pkg}.gitMajor=${major}"
		ldflags+=" -X ${pkg}.gitMinor=${minor}"
		ldflags+=" -X ${pkg}.gitCommit=${commit:-unknown}"
		ldflags+=" -X ${pkg}.gitTreeState=clean"
		ldflags+=" -X ${pkg}.buildDate=${build_date:-1970-01-01T00:00:00Z}"
	done
	printf '%s' "${ldflags}"
}

# build_go NAME VERSION DEST BUILD [FILE...] : unless DEST's stamp (NAME, VERSION, the recipe and
# the FILEs) is current, runs `BUILD TMP`, which writes TMP/NAME, and installs TMP as DEST.
build_go() {
	local name="$1" version="$2" dest="$3" build="$4" want tmp
	shift 4
	want="$(stamp "${name}" "${version}" "$@")"
	if is_fresh "${dest}" "${want}" "${name}"; then
		log "${name} ${version} up to date (${dest})"
		return 0
	fi
	[[ -z "${FRESH_ONLY:-}" ]] || return 1
	log "building ${name} ${version}"
	rm -rf "${BIN_ROOT}/.tmp.${name}".* # an interrupted build's (the set's lock is held)
	tmp="$(new_tmp .tmp "${name}")"
	timed "${name} build" "${build}" "${tmp}" || {
		rm -rf "${tmp}"
		die "${name} build failed"
	}
	printf '%s\n' "${want}" >"${tmp}/.stamp"
	install_dir .old "${tmp}" "${dest}"
	log "${name}: $(du -h "${dest}/${name}" | cut -f1)"
}

# wrapper_build MODULE_DIR OUT PACKAGE LDFLAGS : a main package of one of our wrapper modules.
wrapper_build() {
	(cd "$1" && env CGO_ENABLED=0 GOFLAGS="-mod=mod -buildvcs=false" "${GO}" build -trimpath -ldflags "$4" -o "$2" "$3")
}

# requires MODULE_DIR MODULE VERSION : the wrapper's go.mod pins what versions.env says.
requires() {
	grep -q "^require $2 $3\$\|^[[:space:]]$2 $3\$" "$1/go.mod" ||
		die "$1/go.mod does not require $2 $3; run $0 --update-modules"
}

kube_controlplane() { wrapper_build "${HACK_DIR}/controlplane" "$1/kube-controlplane" . "$(cd "${HACK_DIR}/controlplane" && kube_ldflags)"; }
# kube-node: kubelet and kube-proxy, a second main package of the same wrapper module.
kube_node() { wrapper_build "${HACK_DIR}/controlplane" "$1/kube-node" ./node "$(cd "${HACK_DIR}/controlplane" && kube_ldflags)"; }
etcd() { wrapper_build "${HACK_DIR}/etcd" "$1/etcd" . "-s -w -X go.etcd.io/etcd/api/v3/version.GitSHA=${ETCD_VERSION}"; }
# kube-network-policies: the real node's NetworkPolicy engine (upstream's main reads in-cluster
# credentials only), a main of the control plane's module: one client-go, compiled once for both.
kube_network_policies() { wrapper_build "${HACK_DIR}/controlplane" "$1/kube-network-policies" ./netpol "-s -w"; }
# cert-manager: its controllers (hack/certmanager) and the cert-manager.io CRDs of its module.
cert_manager() {
	wrapper_build "${HACK_DIR}/certmanager" "$1/cert-manager" . "-s -w -X github.com/cert-manager/cert-manager/pkg/util.AppVersion=${CERT_MANAGER_VERSION}" &&
		mkdir "$1/crds" && cp "$(module_field "github.com/cert-manager/cert-manager@${CERT_MANAGER_VERSION}" Dir)"/deploy/crds/cert-manager.io_*.yaml "$1/crds/"
}
# go_install OUT MODULE@VERSION : for modules without replace directives (kwok), run
# outside any module so that no go.mod of ours is consulted.
go_install() {
	(cd "$1" && env GOBIN="$1" CGO_ENABLED=0 GOFLAGS= GO111MODULE=on "${GO}" install -trimpath -ldflags "-s -w" "$2")
}
# CoreDNS with the real node's plugins only (hack/controlplane/coredns), on the control plane's client-go.
coredns() { wrapper_build "${HACK_DIR}/controlplane" "$1/coredns" ./coredns "-s -w"; }
# kwok, and its fast stages (node and pod status) rendered from its module.
kwok() {
	local src
	go_install "$1" "sigs.k8s.io/kwok/cmd/kwok@${KWOK_VERSION}" || return
	src="$(cd "$1" && module_field "sigs.k8s.io/kwok@${KWOK_VERSION}" Dir)"
	kubectl kustomize "${src}/kustomize/stage/fast" >"$1/stages.yaml"
}

# Cold: 15-30 min on 2 cores.
build_kube_controlplane() { build_wrapper kube-controlplane "${KUBE_VERSION}" "${KUBE_CONTROLPLANE_DIR}" kube_controlplane k8s.io/kubernetes controlplane; }
build_kube_node() { build_wrapper kube-node "${KUBE_VERSION}" "${KUBE_NODE_DIR}" kube_node k8s.io/kubernetes controlplane/node; }

build_coredns() { build_wrapper coredns "${COREDNS_VERSION}" "${COREDNS_DIR}" coredns github.com/coredns/coredns controlplane/coredns; }

# build_wrapper NAME VERSION DEST BUILD MODULE DIR : build_go of the main package hack/DIR, whose
# wrapper module (hack/DIR's first component) must pin MODULE at VERSION.
build_wrapper() {
	local mod="${HACK_DIR}/${6%%/*}"
	requires "${mod}" "$5" "$2"
	build_go "$1" "$2" "$3" "$4" "${mod}"/{go.mod,go.sum} "${HACK_DIR}/$6/main.go"
}
build_netpol() { build_wrapper kube-network-policies "${KUBE_NETWORK_POLICIES_VERSION}" "${NETPOL_DIR}" kube_network_policies sigs.k8s.io/kube-network-policies controlplane/netpol; }
build_etcd() { build_wrapper etcd "${ETCD_VERSION}" "${ETCD_DIR}" etcd go.etcd.io/etcd/server/v3 etcd; }
build_cert_manager() { build_wrapper cert-manager "${CERT_MANAGER_VERSION}" "${CERT_MANAGER_DIR}" cert_manager github.com/cert-manager/cert-manager certmanager; }
build_kwok() { build_go kwok "${KWOK_VERSION}" "${KWOK_DIR}" kwok; }

# wrapper_mod DIR MODULE VERSION WHAT : DIR's go.mod requires MODULE at VERSION with upstream's go
# version; tidied against DIR's main package.
wrapper_mod() {
	{
		echo "// Wrapper module: $4"
		echo "// Generated by hack/build-controlplane.sh --update-modules; pins live in hack/versions.env."
		echo "module memcached-operator/hack/$(basename "$1")"
		echo
		echo "go $(awk '$1=="go"{print $2; exit}' "$(module_field "$2@$3" GoMod)")"
		echo
		echo "require $2 $3"
	} >"$1/go.mod"
	rm -f "$1/go.sum"
	(cd "$1" && GOFLAGS=-mod=mod "${GO}" mod tidy)
}

# --update-modules: regenerate the wrapper go.mod/go.sum files from versions.env.
update_modules() {
	local cp="${HACK_DIR}/controlplane" et="${HACK_DIR}/etcd" modfile staging_version required m
	staging_version="v0.${KUBE_VERSION#v1.}"
	modfile="$(module_field "k8s.io/kubernetes@${KUBE_VERSION}" GoMod)"
	# Staging modules that k8s.io/kubernetes requires (it also replaces a couple of
	# sample-* modules it never requires; those are left out as they may not be published).
	required="$(awk '/^require \(/{r=1; next} r && /^\)/{r=0} r{print $1}' "${modfile}" | sort -u)"
	{
		echo "// Wrapper module: kube-apiserver, kube-controller-manager and kube-scheduler from"
		echo "// k8s.io/kubernetes as one multi-call binary; kubelet and kube-proxy (node/); the NetworkPolicy"
		echo "// engine (netpol/); CoreDNS (coredns/). One set of versions: Go's build cache compiles each once."
		echo "// Generated by hack/build-controlplane.sh --update-modules; pins live in hack/versions.env."
		echo "module memcached-operator/hack/controlplane"
		echo
		echo "go $(awk '$1=="go"{print $2; exit}' "${modfile}")"
		echo
		# Only the main module's godebug settings count: mirror upstream's.
		awk '$1=="godebug"{print; found=1} END{if(!found) print "godebug default=go1.25"}' "${modfile}"
		echo
		echo "require k8s.io/kubernetes ${KUBE_VERSION}"
		echo "require sigs.k8s.io/kube-network-policies ${KUBE_NETWORK_POLICIES_VERSION}"
		echo "require github.com/coredns/coredns ${COREDNS_VERSION}"
		echo
		echo "replace ("
		grep '=> ./staging/' "${modfile}" | awk '{print $1}' | sort -u | while read -r m; do
			if grep -qx "${m}" <<<"${required}"; then printf '\t%s => %s %s\n' "${m}" "${m}" "${staging_version}"; fi
		done
		echo ")"
	} >"${cp}/go.mod"
	rm -f "${cp}/go.sum"
	(cd "${cp}" && GOFLAGS=-mod=mod "${GO}" mod tidy)
	wrapper_mod "${et}" go.etcd.io/etcd/server/v3 "${ETCD_VERSION}" "builds etcd's server from go.etcd.io/etcd/server/v3."
	wrapper_mod "${HACK_DIR}/certmanager" github.com/cert-manager/cert-manager "${CERT_MANAGER_VERSION}" \
		"runs cert-manager's CA and SelfSigned issuers and its Certificate controllers."
	log "updated the go.mod of ${cp}, ${et} and ${HACK_DIR}/certmanager"
}

main() {
	case "${1:-}" in
	--print-env) print_env && return 0 ;;
	--update-modules) update_modules && return 0 ;;
	--node) NODE_ONLY=1 ;;
	--cert-manager) CERT_MANAGER_ONLY=1 ;;
	"") ;;
	*) die "unknown argument: $1 (see header of $0)" ;;
	esac
	command -v "${GO}" >/dev/null || die "go not found (set GO=/path/to/go)"
	command -v kubectl >/dev/null || die "kubectl not found (needed to render kwok stages)"
	command -v python3 >/dev/null || die "python3 not found"
	local start=${SECONDS} builds=(build_etcd build_kwok build_kube_controlplane) b set=""
	if [[ "${NODE_ONLY:-0}" == 1 ]]; then builds=(build_kube_node build_coredns build_netpol) set=.node; fi
	if [[ "${CERT_MANAGER_ONLY:-0}" == 1 ]]; then builds=(build_cert_manager) set=.cert-manager; fi
	# All fresh: no lock to wait for (`make tools` may hold it, building something else).
	if (for b in "${builds[@]}"; do FRESH_ONLY=1 "${b}" || exit 1; done); then return 0; fi
	mkdir -p "${BIN_ROOT}"
	# One builder of a set at a time (two `cluster.sh up` started together would both build); the
	# sets apart, so that the tests never wait on `make tools` building a set they do not need.
	if command -v flock >/dev/null; then
		exec 9>"${BIN_ROOT}/.build${set}.lock"
		flock 9
	fi
	for b in "${builds[@]}"; do "${b}"; done
	log "$(IFS=' '; echo "${builds[*]#build_}") ready in $((SECONDS - start))s"
}

main "$@"
