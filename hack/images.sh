#!/usr/bin/env bash
# Container images for the real node (REAL_NODE=1), built without Docker from Debian's packages
# with umoci, cached as OCI archives, and imported into a containerd's k8s.io namespace.
#
#   localhost/memcached:<upstream version>-debian   Debian's memcached: /usr/bin/memcached and
#                                                   exactly the shared libraries ldd lists, an
#                                                   /etc/passwd and /etc/group with 11211,
#                                                   User 11211:11211, Entrypoint /usr/bin/memcached
#   localhost/pause:busybox-<version>                the pod sandbox ("pause") image: Debian's
#                                                   static busybox running `sleep`
#
# Usage:
#   hack/images.sh build                 build the archives that are missing (needs root for apt-get
#                                        when packages are missing)
#   hack/images.sh import SOCKET         build if needed, then import both into the containerd at
#                                        SOCKET, namespace k8s.io (where the kubelet's CRI looks)
#   hack/images.sh --print-env           MEMCACHED_IMAGE, PAUSE_IMAGE and the archive paths
#
# Image references: containerd's CRI normalizes names as Docker does. `memcached:1.6.18-debian`
# would mean docker.io/library/memcached:1.6.18-debian; `localhost/...` is taken as a registry
# host, so it stays `localhost/memcached:...` and never collides with a Docker Hub image. The
# kubelet finds these with imagePullPolicy IfNotPresent (or Never); nothing is pulled.
set -euo pipefail

HACK_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CACHE_DIR="${MEMCACHED_OPERATOR_CACHE:-${HOME}/.cache/memcached-operator}"
BIN_ROOT="${CACHE_DIR}/images"
LOG_TAG=images
# shellcheck source=hack/lib.sh
source "${HACK_DIR}/lib.sh"

# Bump when the recipe below changes: the cache key includes it.
RECIPE_VERSION=1
IMAGE_PACKAGES=(memcached busybox-static umoci)

pkg_version() { dpkg-query -W -f='${Version}' "$1" 2>/dev/null; }
# Debian version -> its upstream part, e.g. 1:1.35.0-4+deb12u1+b1 -> 1.35.0
upstream_version() {
	local v="${1#*:}"
	printf '%s' "${v%%-*}"
}

# Names are derived from the installed packages. Before they are installed, fall back to the
# candidate apt would install, so --print-env works on a fresh machine.
candidate_version() {
	local v
	v="$(pkg_version "$1")"
	[[ -n "${v}" ]] || v="$(apt-cache policy "$1" 2>/dev/null | awk '/Candidate:/{print $2; exit}')"
	printf '%s' "${v}"
}

image_names() {
	MEMCACHED_IMAGE="localhost/memcached:$(upstream_version "$(candidate_version memcached)")-debian"
	PAUSE_IMAGE="localhost/pause:busybox-$(upstream_version "$(candidate_version busybox-static)")"
}

# Files the memcached image carries: the binary and what ldd resolves (the loader included).
memcached_files() {
	printf '%s\n' /usr/bin/memcached
	ldd /usr/bin/memcached | awk '$2=="=>" && $3 ~ /^\// {print $3} $1 ~ /^\// {print $1}'
}

# The cache key of an archive: recipe plus the Debian package (and version) of every file in it.
files_key() {
	local f pkg
	{
		printf 'recipe=%s\n' "${RECIPE_VERSION}"
		for f in "$@"; do
			pkg="$(dpkg -S "$(readlink -f "${f}")" 2>/dev/null | head -n1 | cut -d: -f1)" || pkg=""
			[[ -n "${pkg}" ]] || pkg="$(dpkg -S "${f}" 2>/dev/null | head -n1 | cut -d: -f1)" || pkg=""
			printf '%s %s %s\n' "${f}" "${pkg:-?}" "$(pkg_version "${pkg:-none}")"
		done
	} | sha256sum | cut -c1-12
}

archive_paths() {
	local mkey pkey
	local -a files
	mapfile -t files < <(memcached_files)
	mkey="$(files_key "${files[@]}")"
	pkey="$(files_key /bin/busybox)"
	MEMCACHED_ARCHIVE="${BIN_ROOT}/memcached-$(upstream_version "$(pkg_version memcached)")-${mkey}.oci.tar"
	PAUSE_ARCHIVE="${BIN_ROOT}/pause-busybox-$(upstream_version "$(pkg_version busybox-static)")-${pkey}.oci.tar"
}

print_env() {
	image_names
	printf 'MEMCACHED_IMAGE=%q\nPAUSE_IMAGE=%q\n' "${MEMCACHED_IMAGE}" "${PAUSE_IMAGE}"
	if [[ -n "$(pkg_version memcached)" && -n "$(pkg_version busybox-static)" ]]; then
		archive_paths
		printf 'MEMCACHED_ARCHIVE=%q\nPAUSE_ARCHIVE=%q\n' "${MEMCACHED_ARCHIVE}" "${PAUSE_ARCHIVE}"
	fi
}

# oci_image ARCHIVE TAG ROOTFS_FN CONFIG_ARGS... : an OCI layout with one layer made by
# ROOTFS_FN DIR (it fills DIR), configured with umoci config CONFIG_ARGS, tarred to ARCHIVE.
oci_image() {
	local archive="$1" tag="$2" fill="$3"
	shift 3
	local work layout bundle
	work="$(mktemp -d "${BIN_ROOT}/.tmp.image.XXXXXX")"
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

passwd_files() { # ROOTFS
	mkdir -p "$1/etc"
	printf 'root:x:0:0:root:/:/sbin/nologin\nmemcache:x:11211:11211:memcached:/nonexistent:/sbin/nologin\n' >"$1/etc/passwd"
	printf 'root:x:0:\nmemcache:x:11211:\n' >"$1/etc/group"
}

fill_memcached() { # ROOTFS
	local root="$1" f
	while read -r f; do
		mkdir -p "${root}$(dirname "${f}")"
		cp -L "${f}" "${root}${f}"
	done < <(memcached_files)
	passwd_files "${root}"
	mkdir -p "${root}/tmp"
	chmod 1777 "${root}/tmp"
}

fill_pause() { # ROOTFS
	mkdir -p "$1/bin"
	cp -L /bin/busybox "$1/bin/busybox"
	passwd_files "$1"
}

build_images() {
	mkdir -p "${BIN_ROOT}"
	ensure_packages "${IMAGE_PACKAGES[@]}"
	image_names
	archive_paths
	exec 8>"${BIN_ROOT}/.build.lock"
	flock 8
	rm -rf "${BIN_ROOT}"/.tmp.image.*
	if [[ -s "${MEMCACHED_ARCHIVE}" ]]; then
		log "${MEMCACHED_IMAGE} cached (${MEMCACHED_ARCHIVE})"
	else
		oci_image "${MEMCACHED_ARCHIVE}" "${MEMCACHED_IMAGE##*:}" fill_memcached \
			--config.user 11211:11211 \
			--config.entrypoint /usr/bin/memcached \
			--config.cmd=-m --config.cmd=64 \
			--config.env PATH=/usr/local/bin:/usr/bin:/bin \
			--config.exposedports 11211/tcp \
			--config.label "org.opencontainers.image.title=memcached" \
			--config.label "org.opencontainers.image.version=$(pkg_version memcached)" \
			--config.label "org.opencontainers.image.description=Debian's memcached package, binary and libraries only"
	fi
	if [[ -s "${PAUSE_ARCHIVE}" ]]; then
		log "${PAUSE_IMAGE} cached (${PAUSE_ARCHIVE})"
	else
		# PID 1 of the sandbox only has to exist; containerd stops sandboxes with SIGKILL.
		oci_image "${PAUSE_ARCHIVE}" "${PAUSE_IMAGE##*:}" fill_pause \
			--config.user 65535:65535 \
			--config.entrypoint /bin/busybox \
			--config.cmd=sleep --config.cmd=2147483647 \
			--config.label "org.opencontainers.image.title=pause (busybox sleep)"
	fi
	flock -u 8
}

import_images() { # SOCKET
	local sock="$1"
	build_images
	ctr --address "${sock}" -n k8s.io images import --base-name "${MEMCACHED_IMAGE%:*}" "${MEMCACHED_ARCHIVE}" >/dev/null
	ctr --address "${sock}" -n k8s.io images import --base-name "${PAUSE_IMAGE%:*}" "${PAUSE_ARCHIVE}" >/dev/null
	local ref refs
	# (The list first: `ctr ... | grep -q` fails under pipefail when grep exits early.)
	refs="$(ctr --address "${sock}" -n k8s.io images ls -q)"
	for ref in "${MEMCACHED_IMAGE}" "${PAUSE_IMAGE}"; do
		grep -qx "${ref}" <<<"${refs}" || die "${ref} not in containerd after import"
	done
	log "imported ${MEMCACHED_IMAGE} and ${PAUSE_IMAGE} into ${sock} (namespace k8s.io)"
}

main() {
	case "${1:-}" in
	--print-env) print_env ;;
	build) build_images ;;
	import)
		[[ $# -eq 2 ]] || die "usage: $0 import SOCKET"
		import_images "$2"
		;;
	*) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//' >&2 && exit 2 ;;
	esac
}

main "$@"
