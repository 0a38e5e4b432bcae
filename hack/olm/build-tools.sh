#!/usr/bin/env bash
# Builds the OLM tooling from Go modules (no downloads of prebuilt binaries, no container runtime):
#   operator-sdk    github.com/operator-framework/operator-sdk/cmd/operator-sdk
#   scorecard-test  github.com/operator-framework/operator-sdk/images/scorecard-test (the program
#                   inside the scorecard-test image: the scorecard's built-in static tests)
#   opm             github.com/operator-framework/operator-registry/cmd/opm
#   olm             github.com/operator-framework/operator-lifecycle-manager/cmd/{olm,catalog} and
#                   util/cpb (the bundle unpack Job's copier, in OLM's util image)
#   grpc-health-probe  github.com/grpc-ecosystem/grpc-health-probe (OLM probes catalog pods with it;
#                   hack/olm/images.sh puts it in the opm image, as upstream's)
# into ${MEMCACHED_OPERATOR_CACHE:-$HOME/.cache/memcached-operator}/bin/<name>-<version>/.
# Pins: hack/olm/versions.env.
#
# Usage:
#   hack/olm/build-tools.sh [TOOL...]        build TOOLs (default: operator-sdk scorecard-test opm)
#                                            unless a fresh cached build exists
#   hack/olm/build-tools.sh --path TOOL      build TOOL if needed, print its binary's path on stdout
#                                            (olm: the directory holding olm, catalog and cpb)
#   hack/olm/build-tools.sh --print-env      print the binaries' paths (shell-sourceable), build nothing
#   hack/olm/build-tools.sh --previous-release [ARG...]  PREVIOUS_RELEASE's own hack/images.sh ARGs
#                      (operator-binary), on a cache of its own, and this tree's cargo target (shared crates)
#
# A cached build is reused when its stamp (tool, version, recipe) matches. Builds go to a
# temporary directory renamed into place only on success. Logs go to stderr.
set -euo pipefail

OLM_HACK_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck disable=SC1091 # plain KEY=VALUE pins
source "${OLM_HACK_DIR}/versions.env"

CACHE_DIR="${MEMCACHED_OPERATOR_CACHE:-${HOME}/.cache/memcached-operator}"
BIN_ROOT="${CACHE_DIR}/bin"
GO="${GO:-go}"
if ! command -v "${GO}" >/dev/null && [[ -x /usr/local/go/bin/go ]]; then GO=/usr/local/go/bin/go; fi

# Bump to force a rebuild of everything when the recipe below changes.
RECIPE_VERSION=1

SDK_MOD=github.com/operator-framework/operator-sdk
OPM_MOD=github.com/operator-framework/operator-registry
OLM_MOD=github.com/operator-framework/operator-lifecycle-manager
PROBE_MOD=github.com/grpc-ecosystem/grpc-health-probe

LOG_TAG=olm/build-tools
# shellcheck source=hack/lib.sh
source "${OLM_HACK_DIR}/../lib.sh"

tool_dir() { # TOOL
	case "$1" in
	operator-sdk) printf '%s' "${BIN_ROOT}/operator-sdk-${OPERATOR_SDK_VERSION}" ;;
	scorecard-test) printf '%s' "${BIN_ROOT}/scorecard-test-${OPERATOR_SDK_VERSION}" ;;
	opm) printf '%s' "${BIN_ROOT}/opm-${OPM_VERSION}" ;;
	olm) printf '%s' "${BIN_ROOT}/olm-${OLM_VERSION}" ;;
	grpc-health-probe) printf '%s' "${BIN_ROOT}/grpc-health-probe-${GRPC_HEALTH_PROBE_VERSION}" ;;
	*) die "unknown tool: $1 (operator-sdk, scorecard-test, opm, olm, grpc-health-probe)" ;;
	esac
}

tool_path() { # TOOL : what --path prints
	case "$1" in
	olm) tool_dir olm ;;
	*) printf '%s/%s' "$(tool_dir "$1")" "$1" ;;
	esac
}

print_env() {
	printf 'OPERATOR_SDK_BIN=%q\n' "$(tool_path operator-sdk)"
	printf 'SCORECARD_TEST_BIN=%q\n' "$(tool_path scorecard-test)"
	printf 'OPM_BIN=%q\n' "$(tool_path opm)"
	printf 'OLM_BIN=%q\n' "$(tool_dir olm)/olm"
	printf 'OLM_CATALOG_BIN=%q\n' "$(tool_dir olm)/catalog"
	printf 'OLM_CPB_BIN=%q\n' "$(tool_dir olm)/cpb"
	printf 'GRPC_HEALTH_PROBE_BIN=%q\n' "$(tool_path grpc-health-probe)"
	printf 'OPERATOR_SDK_VERSION=%q\nOPM_VERSION=%q\nOLM_VERSION=%q\n' \
		"${OPERATOR_SDK_VERSION}" "${OPM_VERSION}" "${OLM_VERSION}"
}

stamp() { # TOOL VERSION
	printf '%s %s recipe=%s\n' "$1" "$2" "${RECIPE_VERSION}" | sha256sum | cut -c1-16
}

# go_build SRC TMP LDFLAGS TAGS PKG... : build PKGs of the released module copied to SRC, as
# its own main module, with its own go.mod and go.sum (-mod=readonly: nothing re-resolved).
# `go install MOD/cmd/X@VERSION` cannot be used: it fetches the module's version list to look
# for deprecations, and the module proxy here answers 403 to list requests.
go_build() {
	local src="$1" tmp="$2" ldflags="$3" tags="$4" pkg
	shift 4
	for pkg in "$@"; do
		(cd "${src}" && env CGO_ENABLED=0 GOFLAGS="-mod=readonly -buildvcs=false" GO111MODULE=on GOWORK=off \
			"${GO}" build -trimpath -tags "${tags}" -ldflags "${ldflags}" -o "${tmp}/${pkg##*/}" "./${pkg}") || return 1
	done
}

# copy_src MODULE@VERSION TMP : a writable copy of the module's source in TMP/src.
copy_src() {
	local dir
	dir="$(module_field "$1" Dir)"
	[[ -n "${dir}" && -f "${dir}/go.mod" ]] || return 1
	cp -r "${dir}" "$2/src"
	chmod -R u+w "$2/src"
}

# drop_ansible_plugin CLI_GO : operator-sdk's CLI links the ansible scaffolding plugin from
# github.com/operator-framework/ansible-operator-plugins, whose source the module proxy here
# does not serve (403). Remove that one plugin (scaffolding for Ansible projects, unused here);
# every other command and plugin is unchanged. Fails unless each edit matches exactly once.
drop_ansible_plugin() {
	python3 - "$1" <<'EOF'
import re, sys
path = sys.argv[1]
src = open(path).read()
def sub(pattern, repl, s, flags=0):
    new, n = re.subn(pattern, repl, s, flags=flags)
    if n != 1:
        sys.exit(f"drop_ansible_plugin: expected one match for {pattern!r} in {path}, got {n}")
    return new
src = sub(r'\n\tansiblev1 "github\.com/operator-framework/ansible-operator-plugins/pkg/plugins/ansible/v1"', '', src)
src = sub(r'\n\tansibleBundle, _ := plugin\.NewBundleWithOptions\(.*?\n\t\)\n', '\n', src, re.S)
src = sub(r'\n\t\t\tansibleBundle,', '', src)
open(path, "w").write(src)
EOF
}

tool_stamp() { # TOOL
	case "$1" in
	operator-sdk | scorecard-test) stamp "$1" "${OPERATOR_SDK_VERSION}" ;;
	opm) stamp opm "${OPM_VERSION}" ;;
	olm) stamp olm "${OLM_VERSION}+chart-crds+cpb" ;;
	grpc-health-probe) stamp grpc-health-probe "${GRPC_HEALTH_PROBE_VERSION}" ;;
	esac
}

tool_bins() { # TOOL : the files a build of TOOL leaves in its directory
	case "$1" in
	olm) echo olm catalog cpb crds.yaml ;;
	*) echo "$1" ;;
	esac
}

is_fresh_tool() { # TOOL
	local bins
	read -r -a bins <<<"$(tool_bins "$1")"
	is_fresh "$(tool_dir "$1")" "$(tool_stamp "$1")" "${bins[@]}"
}

# build TOOL : build one tool if its cache entry is missing or stale.
build() {
	local tool="$1" dir want tmp ldflags commit src k8s bins=()
	dir="$(tool_dir "${tool}")"
	want="$(tool_stamp "${tool}")"
	case "${tool}" in
	olm) bins=(olm catalog cpb) ;;
	*) bins=("${tool}") ;;
	esac
	if is_fresh_tool "${tool}"; then
		log "${tool} up to date (${dir})"
		return 0
	fi
	log "building ${tool}"
	# Not ".tmp."/".old.": hack/build-controlplane.sh clears those under its own lock, which would
	# pull a directory from under a build running here.
	tmp="$(new_tmp .olm-tmp "${tool}")"
	case "${tool}" in
	operator-sdk | scorecard-test)
		# The same -X flags as upstream's Makefile (GO_BUILD_ARGS); the version lands in the
		# bundle's metrics annotations (operator-sdk-vX.Y.Z), so it must be set.
		commit="$(module_field "${SDK_MOD}@${OPERATOR_SDK_VERSION}" Hash)"
		src="$(module_field "${SDK_MOD}@${OPERATOR_SDK_VERSION}" Dir)"
		k8s="$(awk '$1=="export" && $2=="K8S_VERSION" {print $4}' "${src}/Makefile")"
		ldflags="-s -w"
		ldflags+=" -X ${SDK_MOD}/internal/version.Version=${OPERATOR_SDK_VERSION}"
		ldflags+=" -X ${SDK_MOD}/internal/version.GitVersion=${OPERATOR_SDK_VERSION}"
		ldflags+=" -X ${SDK_MOD}/internal/version.GitCommit=${commit:-unknown}"
		ldflags+=" -X ${SDK_MOD}/internal/version.KubernetesVersion=v${k8s:-unknown}"
		ldflags+=" -X ${SDK_MOD}/internal/version.ImageVersion=${OPERATOR_SDK_VERSION}"
		local pkg=cmd/operator-sdk
		[[ "${tool}" == scorecard-test ]] && pkg=images/scorecard-test
		if ! { copy_src "${SDK_MOD}@${OPERATOR_SDK_VERSION}" "${tmp}" &&
			drop_ansible_plugin "${tmp}/src/internal/cmd/operator-sdk/cli/cli.go" &&
			timed "${tool} build" go_build "${tmp}/src" "${tmp}" "${ldflags}" containers_image_openpgp "${pkg}"; }; then
			rm -rf "${tmp}"
			die "${tool} build failed"
		fi
		;;
	opm)
		# Upstream tags: json1 (sqlite, only for the deprecated sqlite index formats: without cgo
		# they fail at run time; file-based catalogs need no sqlite) and containers_image_openpgp.
		commit="$(module_field "${OPM_MOD}@${OPM_VERSION}" Hash)"
		ldflags="-s -w"
		ldflags+=" -X ${OPM_MOD}/cmd/opm/version.gitCommit=${commit:-unknown}"
		ldflags+=" -X ${OPM_MOD}/cmd/opm/version.opmVersion=${OPM_VERSION}"
		ldflags+=" -X ${OPM_MOD}/cmd/opm/version.buildDate=1970-01-01T00:00:00Z"
		if ! { copy_src "${OPM_MOD}@${OPM_VERSION}" "${tmp}" &&
			timed "opm build" go_build "${tmp}/src" "${tmp}" "${ldflags}" json1,containers_image_openpgp cmd/opm; }; then
			rm -rf "${tmp}"
			die "opm build failed"
		fi
		;;
	grpc-health-probe)
		# Upstream's release build: CGO_ENABLED=0, -s -w. Its main package is the module's root, so
		# `go build -o TMP/.` names the binary after the module: TMP/grpc-health-probe.
		if ! { copy_src "${PROBE_MOD}@${GRPC_HEALTH_PROBE_VERSION}" "${tmp}" &&
			timed "grpc-health-probe build" go_build "${tmp}/src" "${tmp}" "-s -w" "" . &&
			[[ -x "${tmp}/grpc-health-probe" ]]; }; then
			rm -rf "${tmp}"
			die "grpc-health-probe build failed"
		fi
		;;
	olm)
		commit="$(module_field "${OLM_MOD}@${OLM_VERSION}" Hash)"
		src="$(module_field "${OLM_MOD}@${OLM_VERSION}" Dir)"
		ldflags="-s -w -X ${OLM_MOD}/pkg/version.OLMVersion=${OLM_VERSION}"
		ldflags+=" -X ${OLM_MOD}/pkg/version.GitCommit=${commit:-unknown}"
		if ! { copy_src "${OLM_MOD}@${OLM_VERSION}" "${tmp}" &&
			timed "olm build" go_build "${tmp}/src" "${tmp}" "${ldflags}" json1 cmd/olm cmd/catalog util/cpb; }; then
			rm -rf "${tmp}"
			die "olm build failed"
		fi
		# OLM's CRDs: all of deploy/chart/crds. (deploy/upstream/quickstart/crds.yaml lacks
		# OLMConfig, whose informer the olm operator waits for before it handles OperatorGroups.)
		if ! compgen -G "${src}/deploy/chart/crds/*.yaml" >/dev/null; then
			rm -rf "${tmp}"
			die "OLM CRDs not found in ${src}/deploy/chart/crds"
		fi
		local f
		for f in "${src}"/deploy/chart/crds/*.yaml; do
			printf -- '---\n'
			cat "${f}"
		done >"${tmp}/crds.yaml"
		;;
	esac
	rm -rf "${tmp}/src"
	printf '%s\n' "${want}" >"${tmp}/.stamp"
	install_dir .olm-old "${tmp}" "${dir}"
	local b
	for b in "${bins[@]}"; do log "${b}: $(du -h "${dir}/${b}" | cut -f1) (${dir}/${b})"; done
}

build_all() { # TOOL...
	local t
	for t in "$@"; do build "${t}"; done
}

with_lock() { # CMD... : one OLM tool builder at a time.
	mkdir -p "${BIN_ROOT}"
	if command -v flock >/dev/null; then
		exec 9>"${BIN_ROOT}/.build.olm.lock"
		flock 9
		# Holding the lock: leftovers of interrupted builds are safe to remove.
		rm -rf "${BIN_ROOT}"/.olm-tmp.* "${BIN_ROOT}"/.olm-old.*
	fi
	"$@"
}

# The release the upgrade tests start from: src/ and git/ (that commit alone: its images.sh labels
# from git) under previous-release/<commit>/, the other releases' (800 MB each) removed.
PREVIOUS_DIR="${CACHE_DIR}/previous-release/${PREVIOUS_RELEASE_COMMIT}"
extract_previous_release() {
	local dir="${PREVIOUS_DIR}" repo tmp
	repo="$(cd "${OLM_HACK_DIR}/../.." && pwd)"
	if [[ ! -f "${dir}/src/Cargo.toml" || ! -f "${dir}/git/HEAD" ]]; then
		log "extracting ${PREVIOUS_RELEASE_COMMIT} (release ${PREVIOUS_RELEASE}) into ${dir}"
		tmp="${dir}/.tmp-$$" && rm -rf "${tmp}" && mkdir -p "${tmp}/src" && git init -q --bare "${tmp}/git"
		git -C "${repo}" archive "${PREVIOUS_RELEASE_COMMIT}" | tar -C "${tmp}/src" -x
		grep -qx "version = \"${PREVIOUS_RELEASE}\"" "${tmp}/src/Cargo.toml" ||
			die "${PREVIOUS_RELEASE_COMMIT} is not release ${PREVIOUS_RELEASE}"
		GIT_DIR="${tmp}/git" git fetch -q --depth=1 "${repo}" "${PREVIOUS_RELEASE_COMMIT}"
		GIT_DIR="${tmp}/git" git update-ref --no-deref HEAD "${PREVIOUS_RELEASE_COMMIT}"
		GIT_DIR="${tmp}/git" git config core.bare false
		GIT_DIR="${tmp}/git" GIT_WORK_TREE="${tmp}/src" git read-tree HEAD
		rm -rf "${dir}/src" "${dir}/git" && mv "${tmp}/src" "${tmp}/git" "${dir}/" && rm -rf "${tmp}"
	fi
	find "${dir%/*}" -mindepth 1 -maxdepth 1 ! -path "${dir}" -exec rm -rf {} +
}
previous_release() { # IMAGES_ARG...
	[[ $# -gt 0 ]] || set -- operator-binary
	env -u RUSTFLAGS MEMCACHED_OPERATOR_CACHE="${PREVIOUS_DIR}/cache" CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-${OLM_HACK_DIR%/hack/olm}/target}" \
		OPERATOR_IMAGE="localhost/memcached-operator:${PREVIOUS_RELEASE}" GIT_DIR="${PREVIOUS_DIR}/git" \
		GIT_WORK_TREE="${PREVIOUS_DIR}/src" "${PREVIOUS_DIR}/src/hack/images.sh" "$@"
}

main() {
	case "${1:-}" in
	--previous-release)
		shift
		with_lock extract_previous_release
		exec 9>&- # its images.sh locks its own builds
		previous_release "$@"
		return 0
		;;
	--print-env)
		print_env
		return 0
		;;
	--path)
		[[ $# -eq 2 ]] || die "usage: $0 --path TOOL"
		tool_dir "$2" >/dev/null
		# Fast path without the lock (another tool may be building): a fresh cached build.
		if ! is_fresh_tool "$2"; then
			command -v "${GO}" >/dev/null || die "go not found (set GO=/path/to/go)"
			with_lock build "$2"
		fi
		tool_path "$2"
		printf '\n'
		return 0
		;;
	-*) die "unknown flag: $1 (see the header of $0)" ;;
	esac
	command -v "${GO}" >/dev/null || die "go not found (set GO=/path/to/go)"
	command -v python3 >/dev/null || die "python3 not found"
	local tools=("$@") t
	[[ ${#tools[@]} -gt 0 ]] || tools=(operator-sdk scorecard-test opm)
	for t in "${tools[@]}"; do tool_dir "${t}" >/dev/null; done
	with_lock build_all "${tools[@]}"
}

main "$@"
