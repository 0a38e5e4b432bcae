#!/usr/bin/env bash
# The images OLM's tools run in a cluster, built without Docker from the binaries
# hack/olm/build-tools.sh builds (tests/olm/run_bundle.rs pushes them to a registry on
# 127.0.0.1 for the real node), cached as OCI archives under
# ${MEMCACHED_OPERATOR_CACHE:-$HOME/.cache/memcached-operator}/images:
#
#   operator-framework/opm:<OPM_VERSION>             /bin/opm, /bin/grpc_health_probe (OLM probes
#       catalog pods with it), Debian's static busybox as /bin/sh, cat, gzip..., an empty /configs
#       and the file-based-catalog label: `run bundle --index-image`
#       (its registry pod runs `sh -c "opm serve /configs ..."`), OLM's catalog operator's
#       --opmImage (the unpack Job's `opm alpha bundle extract`), catalog.Dockerfile's base image
#   operator-framework/olm-util:<OLM_VERSION>         /bin/cpb and busybox's cp: OLM's --util-image
#       (the unpack Job copies cpb into the bundle image's container, which runs it)
#   operator-framework/scorecard-test:<SDK_VERSION>   /usr/local/bin/scorecard-test, as
#       bundle/tests/scorecard/config.yaml names it
#   busybox:<busybox version>                         static busybox and its applets: scorecard's
#       untar and storage images, run bundle's decompression image (sh, cat, gzip, tar)
#
# and, with Debian's buildah (root; vfs storage, chroot isolation for catalog.Dockerfile's RUN):
#   bundle DIR ARCHIVE TAG    the image of DIR/bundle.Dockerfile, DIR its context
#   catalog ARCHIVE TAG       the image of the repository's catalog.Dockerfile (context: the
#                             repository, .dockerignore applied), its base the opm image above
#
# Usage:
#   hack/olm/images.sh build                  build the four tool images if missing; print
#                                             NAME_IMAGE=ref and NAME_ARCHIVE=path lines (sourceable)
#   hack/olm/images.sh bundle DIR ARCHIVE TAG
#   hack/olm/images.sh catalog ARCHIVE TAG
set -euo pipefail

OLM_HACK_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "${OLM_HACK_DIR}/../.." && pwd)"
CACHE_DIR="${MEMCACHED_OPERATOR_CACHE:-${HOME}/.cache/memcached-operator}"
IMAGES_DIR="${CACHE_DIR}/images"
LOG_TAG=olm/images
# shellcheck source=hack/lib.sh
source "${OLM_HACK_DIR}/../lib.sh"
# shellcheck disable=SC1091 # plain KEY=VALUE pins
source "${OLM_HACK_DIR}/versions.env"

# Bump when a recipe below changes: archive names include it.
RECIPE_VERSION=1
PACKAGES=(busybox-static umoci buildah)

busybox_version() {
	local v
	v="$(dpkg-query -W -f='${Version}' busybox-static)"
	v="${v#*:}"
	printf '%s' "${v%%-*}"
}

# shellcheck disable=SC2034 # build() prints them by name (${!var})
names() {
	local bb
	bb="$(busybox_version)"
	OPM_IMAGE="operator-framework/opm:${OPM_VERSION}"
	OLM_UTIL_IMAGE="operator-framework/olm-util:${OLM_VERSION}"
	SCORECARD_TEST_IMAGE="operator-framework/scorecard-test:${OPERATOR_SDK_VERSION}"
	BUSYBOX_IMAGE="busybox:${bb}"
	OPM_ARCHIVE="${IMAGES_DIR}/olm-opm-${OPM_VERSION}-probe-${GRPC_HEALTH_PROBE_VERSION}-busybox-${bb}-r${RECIPE_VERSION}.oci.tar"
	OLM_UTIL_ARCHIVE="${IMAGES_DIR}/olm-util-${OLM_VERSION}-busybox-${bb}-r${RECIPE_VERSION}.oci.tar"
	SCORECARD_TEST_ARCHIVE="${IMAGES_DIR}/olm-scorecard-test-${OPERATOR_SDK_VERSION}-r${RECIPE_VERSION}.oci.tar"
	BUSYBOX_ARCHIVE="${IMAGES_DIR}/olm-busybox-${bb}-r${RECIPE_VERSION}.oci.tar"
}

# Debian's static busybox with a link per applet in /bin, and a world-writable /tmp.
fill_busybox() { # ROOTFS
	local a
	mkdir -p "$1/bin" "$1/tmp"
	chmod 1777 "$1/tmp"
	cp -L /bin/busybox "$1/bin/busybox"
	for a in $(/bin/busybox --list); do
		[[ "${a}" == busybox || -e "$1/bin/${a}" ]] || ln -s busybox "$1/bin/${a}"
	done
	mkdir -p "$1/etc"
	printf 'root:x:0:0:root:/:/bin/sh\nnobody:x:65534:65534:nobody:/:/sbin/nologin\n' >"$1/etc/passwd"
}

fill_opm() { # ROOTFS
	fill_busybox "$1"
	cp "${OPM_BIN}" "$1/bin/opm"
	cp "${GRPC_HEALTH_PROBE_BIN}" "$1/bin/grpc_health_probe"
	mkdir -p "$1/configs"
}

fill_olm_util() { # ROOTFS
	fill_busybox "$1"
	cp "${OLM_CPB_BIN}" "$1/bin/cpb"
}

fill_scorecard_test() { # ROOTFS
	mkdir -p "$1/usr/local/bin" "$1/tmp"
	chmod 1777 "$1/tmp"
	cp "${SCORECARD_TEST_BIN}" "$1/usr/local/bin/scorecard-test"
}

build() {
	mkdir -p "${IMAGES_DIR}"
	ensure_packages "${PACKAGES[@]}"
	names
	eval "$("${OLM_HACK_DIR}/build-tools.sh" --print-env)"
	local need=0 a
	for a in "${OPM_ARCHIVE}" "${OLM_UTIL_ARCHIVE}" "${SCORECARD_TEST_ARCHIVE}" "${BUSYBOX_ARCHIVE}"; do
		[[ -s "${a}" ]] || need=1
	done
	if [[ ${need} == 1 ]]; then
		"${OLM_HACK_DIR}/build-tools.sh" opm olm scorecard-test grpc-health-probe >&2
		exec 8>"${IMAGES_DIR}/.olm-images.lock"
		flock 8
		rm -rf "${IMAGES_DIR}"/.tmp.image.*
		local path=PATH=/bin:/usr/bin:/usr/local/bin
		[[ -s "${OPM_ARCHIVE}" ]] || oci_image "${OPM_ARCHIVE}" "${OPM_VERSION}" fill_opm \
			--config.user 1001 --config.env "${path}" --config.workingdir / \
			--config.entrypoint /bin/opm --config.cmd=serve --config.cmd=/configs \
			--config.label "operators.operatorframework.io.index.configs.v1=/configs" \
			--config.label "org.opencontainers.image.title=opm" \
			--config.label "org.opencontainers.image.version=${OPM_VERSION}" >&2
		[[ -s "${OLM_UTIL_ARCHIVE}" ]] || oci_image "${OLM_UTIL_ARCHIVE}" "${OLM_VERSION}" fill_olm_util \
			--config.user 1001 --config.env "${path}" \
			--config.label "org.opencontainers.image.title=olm-util (cpb)" \
			--config.label "org.opencontainers.image.version=${OLM_VERSION}" >&2
		[[ -s "${SCORECARD_TEST_ARCHIVE}" ]] || oci_image "${SCORECARD_TEST_ARCHIVE}" "${OPERATOR_SDK_VERSION}" fill_scorecard_test \
			--config.user 1001 --config.env "${path}" \
			--config.entrypoint /usr/local/bin/scorecard-test \
			--config.label "org.opencontainers.image.title=scorecard-test" \
			--config.label "org.opencontainers.image.version=${OPERATOR_SDK_VERSION}" >&2
		[[ -s "${BUSYBOX_ARCHIVE}" ]] || oci_image "${BUSYBOX_ARCHIVE}" "$(busybox_version)" fill_busybox \
			--config.env "${path}" --config.cmd=sh \
			--config.label "org.opencontainers.image.title=busybox (Debian's busybox-static)" >&2
		flock -u 8
	fi
	local n
	for n in OPM OLM_UTIL SCORECARD_TEST BUSYBOX; do
		a="${n}_IMAGE"
		printf '%s_IMAGE=%q\n' "${n}" "${!a}"
		a="${n}_ARCHIVE"
		printf '%s_ARCHIVE=%q\n' "${n}" "${!a}"
	done
}

# buildah with its own storage in WORK (vfs: no overlay mounts left behind).
BUILDAH=()
buildah_in() { # WORK
	BUILDAH=(buildah --root "$1/storage/root" --runroot "$1/storage/run" --storage-driver vfs)
}

# bud_to_archive WORK ARCHIVE TAG BUD_ARGS... : buildah bud BUD_ARGS as image TAG, saved to ARCHIVE.
bud_to_archive() {
	local work="$1" archive="$2" tag="$3"
	shift 3
	"${BUILDAH[@]}" bud --quiet --identity-label=false --timestamp 0 --isolation chroot \
		-t "localhost/image:${tag}" "$@" >"${work}/bud.log" 2>&1 ||
		{
			cat "${work}/bud.log" >&2
			die "buildah bud $* failed"
		}
	"${BUILDAH[@]}" push --quiet "localhost/image:${tag}" "oci-archive:${work}/image.tar:${tag}" >/dev/null
	mv "${work}/image.tar" "${archive}"
	log "built ${archive##*/} ($(du -h "${archive}" | cut -f1)) from $*"
}

bundle_image() { # DIR ARCHIVE TAG
	local dir work
	dir="$(cd "$1" && pwd)"
	[[ -f "${dir}/bundle.Dockerfile" ]] || die "no ${dir}/bundle.Dockerfile"
	ensure_packages buildah
	work="$(mktemp -d "${TMPDIR:-/tmp}/olm-bundle-image.XXXXXX")"
	buildah_in "${work}"
	bud_to_archive "${work}" "$2" "$3" -f "${dir}/bundle.Dockerfile" "${dir}"
	rm -rf "${work}"
}

catalog_image() { # ARCHIVE TAG
	local work
	eval "$(build)"
	work="$(mktemp -d "${TMPDIR:-/tmp}/olm-catalog-image.XXXXXX")"
	buildah_in "${work}"
	# catalog.Dockerfile's FROM names the opm image by its short name; the local copy is found
	# without a pull (buildah keeps short names under localhost/).
	"${BUILDAH[@]}" pull --quiet "oci-archive:${OPM_ARCHIVE}" >/dev/null
	"${BUILDAH[@]}" tag "$("${BUILDAH[@]}" images -q | head -n1)" "${OPM_IMAGE}"
	bud_to_archive "${work}" "$1" "$2" --pull=false -f "${REPO_ROOT}/catalog.Dockerfile" "${REPO_ROOT}"
	rm -rf "${work}"
}

case "${1:-}" in
build) build ;;
bundle)
	[[ $# -eq 4 ]] || die "usage: $0 bundle DIR ARCHIVE TAG"
	bundle_image "$2" "$3" "$4"
	;;
catalog)
	[[ $# -eq 3 ]] || die "usage: $0 catalog ARCHIVE TAG"
	catalog_image "$2" "$3"
	;;
*) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//' >&2 && exit 2 ;;
esac
