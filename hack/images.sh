#!/usr/bin/env bash
# Container images for the real node (REAL_NODE=1), built without Docker from Debian's packages
# with umoci, cached as OCI archives, and imported into a containerd's k8s.io namespace.
#
#   localhost/memcached:<version>-debian and -sid, localhost/pause:busybox-<version> (the sandbox),
#   localhost/memcached-operator:<Cargo version> (the Dockerfile) and
#   localhost/memcached-exporter:<version> (spec.monitoring): hack/README.md describes each.
#
# Usage:
#   hack/images.sh build                 build the archives that are missing (root when packages are)
#   hack/images.sh import SOCKET         build if needed, then import them (both memcacheds, pause,
#                                        exporter) into the containerd at SOCKET, namespace k8s.io
#   hack/images.sh exporter-binary       build the exporter binary (cached); print its path
#   hack/images.sh operator              build the operator image (cached): the Dockerfile's builder
#                                        stage's `cargo build` run here, then its runtime stage by
#                                        `buildah bud` (root; vfs storage) with the labels' arguments
#   hack/images.sh operator-binary       build the builder stage if needed; print the path of the
#                                        binary the image runs (what the benchmarks run)
#   hack/images.sh import-operator SOCKET  build if needed, import it as OPERATOR_IMAGE (printed)
#   hack/images.sh --print-env           the images, their archives, OPERATOR_BINARY and the operator
#                                        image's OPERATOR_VERSION, OPERATOR_REVISION, OPERATOR_CREATED
#
# The names start with localhost/, which containerd's CRI reads as a registry host: never Docker
# Hub's. The kubelet finds them with imagePullPolicy IfNotPresent (or Never); nothing is pulled.
set -euo pipefail

HACK_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CACHE_DIR="${MEMCACHED_OPERATOR_CACHE:-${HOME}/.cache/memcached-operator}"
BIN_ROOT="${CACHE_DIR}/images"
LOG_TAG=images
# shellcheck source=hack/lib.sh
source "${HACK_DIR}/lib.sh"
# shellcheck disable=SC1091 # plain KEY=VALUE pins
source "${HACK_DIR}/versions.env"
GO="${GO:-go}"
if ! command -v "${GO}" >/dev/null && [[ -x /usr/local/go/bin/go ]]; then GO=/usr/local/go/bin/go; fi

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
	EXPORTER_IMAGE="localhost/memcached-exporter:${MEMCACHED_EXPORTER_VERSION#v}"
}

# ---------------------------------------------------------------- the memcached exporter

EXPORTER_MODULE=github.com/prometheus/memcached_exporter
EXPORTER_RECIPE_VERSION=1

# The exporter's static binary, built once per version (and Go version) into the cache.
exporter_binary() {
	local dir="${CACHE_DIR}/bin/memcached-exporter-${MEMCACHED_EXPORTER_VERSION}" tmp stamp
	stamp="recipe=${EXPORTER_RECIPE_VERSION} $(${GO} env GOVERSION)"
	EXPORTER_BIN="${dir}/memcached_exporter"
	if is_fresh "${dir}" "${stamp}" memcached_exporter; then return 0; fi
	command -v "${GO}" >/dev/null || die "go not found (set GO=/path/to/go)"
	mkdir -p "${CACHE_DIR}/bin"
	local BIN_ROOT="${CACHE_DIR}/bin"
	rm -rf "${BIN_ROOT}"/.tmp.exporter.*
	tmp="$(new_tmp .tmp.exporter build)"
	log "building memcached_exporter ${MEMCACHED_EXPORTER_VERSION} from its Go module"
	# Built in the downloaded module with its own go.mod and go.sum, as released. Not `go install
	# module@version`: that also asks the proxy for the module's version list (for deprecations),
	# which the proxy refuses for this module (403), while the version itself is served.
	local src
	src="$(module_field "${EXPORTER_MODULE}@${MEMCACHED_EXPORTER_VERSION}" Dir)"
	[[ -d "${src}" ]] || die "go mod download ${EXPORTER_MODULE}@${MEMCACHED_EXPORTER_VERSION} failed"
	(
		cd "${src}"
		timed "memcached_exporter build" env CGO_ENABLED=0 GOFLAGS="-mod=readonly -buildvcs=false" \
			nice -n "${BUILD_NICE:-5}" "${GO}" build -trimpath -o "${tmp}/memcached_exporter" \
			-ldflags "-s -w -X github.com/prometheus/common/version.Version=${MEMCACHED_EXPORTER_VERSION#v}" \
			./cmd/memcached_exporter
	) || die "building ${EXPORTER_MODULE}@${MEMCACHED_EXPORTER_VERSION} failed"
	printf '%s' "${stamp}" >"${tmp}/.stamp"
	install_dir .tmp.exporter "${tmp}" "${dir}"
}

fill_exporter() { # ROOTFS
	mkdir -p "$1/bin"
	cp -L "${EXPORTER_BIN}" "$1/bin/memcached_exporter"
	passwd_files "$1"
	printf 'nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\n' >>"$1/etc/passwd"
	printf 'nogroup:x:65534:\n' >>"$1/etc/group"
}

# The configuration of both memcached images.
MEMCACHED_CONFIG=(--config.user 11211:11211 --config.entrypoint /usr/bin/memcached
	--config.cmd=-m --config.cmd=64 --config.env PATH=/usr/local/bin:/usr/bin:/bin
	--config.exposedports 11211/tcp --config.label "org.opencontainers.image.title=memcached")

# ---------------------------------------------------------------- memcached from Debian sid

# Bookworm has memcached 1.6.18; users' default image has 1.6.45. Sid's package runs on this
# host's kernel with sid's own libraries, so the real node runs both versions. Bump the recipe
# to take sid's current version (sid keeps only its newest package).
SID_RECIPE_VERSION=1
SID_PACKAGES=(memcached libc6 libevent-2.1-7t64 libsasl2-2 libssl3t64 liblua5.4-0 zlib1g libzstd1
	libstdc++6 libgcc-s1)
SID_LOADER=/lib64/ld-linux-x86-64.so.2

# The newest sid archive built: MEMCACHED_SID_ARCHIVE and MEMCACHED_SID_IMAGE, empty if none.
sid_archive() {
	local f v
	MEMCACHED_SID_ARCHIVE="" MEMCACHED_SID_IMAGE=""
	f="$(find "${BIN_ROOT}" -maxdepth 1 -name "memcached-sid-*-r${SID_RECIPE_VERSION}.oci.tar" 2>/dev/null | sort -V | tail -n1)"
	[[ -n "${f}" ]] || return 0
	v="${f##*/memcached-sid-}"
	MEMCACHED_SID_ARCHIVE="${f}"
	MEMCACHED_SID_IMAGE="localhost/memcached:${v%-r"${SID_RECIPE_VERSION}".oci.tar}-sid"
}

# apt-get against sid alone, with lists and downloads of its own: the host's sources, state and
# installed packages are not touched. Sid is on the mirror the host's Debian sources name.
sid_apt() {
	local dir="${CACHE_DIR}/apt-sid" mirror
	mirror="$(awk '/^URIs:/ {print $2; exit} /^deb / {print $2; exit}' /etc/apt/sources.list.d/debian.sources /etc/apt/sources.list 2>/dev/null)"
	[[ -n "${mirror}" ]] || die "no Debian mirror in the host's apt sources"
	mkdir -p "${dir}/lists/partial" "${dir}/cache/archives/partial"
	printf 'Types: deb\nURIs: %s\nSuites: sid\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' \
		"${mirror}" >"${dir}/sid.sources"
	apt-get -o "Dir::Etc::sourcelist=${dir}/sid.sources" -o Dir::Etc::sourceparts=/nonexistent \
		-o "Dir::State::Lists=${dir}/lists" -o "Dir::Cache=${dir}/cache" -o Dir::State::status=/dev/null \
		-o APT::Sandbox::User=root "$@"
}

# fill_sid_memcached ROOTFS: memcached and the libraries sid's loader resolves for it, from SID_ROOT.
fill_sid_memcached() {
	local rootfs="$1" lib path
	mkdir -p "${rootfs}/usr/bin" "${rootfs}/usr/lib/x86_64-linux-gnu" "${rootfs}$(dirname "${SID_LOADER}")"
	cp -L "${SID_ROOT}/usr/bin/memcached" "${rootfs}/usr/bin/memcached"
	cp -L "${SID_ROOT}/usr${SID_LOADER}" "${rootfs}${SID_LOADER}"
	while read -r lib path; do
		[[ "${path}" == "${SID_ROOT}"/* ]] || die "sid's memcached needs ${lib}, not in ${SID_PACKAGES[*]}"
		cp -L "${path}" "${rootfs}/usr/lib/x86_64-linux-gnu/${lib}"
	done < <("${SID_ROOT}/usr${SID_LOADER}" --library-path "${SID_ROOT}/usr/lib/x86_64-linux-gnu" \
		--list "${SID_ROOT}/usr/bin/memcached" | awk '$2 == "=>" && $1 !~ /^\// {print $1, $3}')
	passwd_files "${rootfs}"
	mkdir -p "${rootfs}/tmp"
	chmod 1777 "${rootfs}/tmp"
	chroot "${rootfs}" /usr/bin/memcached -V >/dev/null || die "sid's memcached does not run from its image root"
}

build_sid_memcached() {
	sid_archive
	if [[ -n "${MEMCACHED_SID_ARCHIVE}" ]]; then
		log "${MEMCACHED_SID_IMAGE} cached (${MEMCACHED_SID_ARCHIVE})"
		return 0
	fi
	local tmp deb version
	tmp="$(new_tmp .tmp.sid memcached)"
	sid_apt update -qq || die "apt-get update for Debian sid failed"
	(cd "${tmp}" && sid_apt download "${SID_PACKAGES[@]}" >/dev/null) || die "apt-get download from sid failed: ${SID_PACKAGES[*]}"
	for deb in "${tmp}"/*.deb; do dpkg-deb -x "${deb}" "${tmp}/root"; done
	version="$(dpkg-deb -f "${tmp}"/memcached_*.deb Version)"
	SID_ROOT="${tmp}/root"
	oci_image "${BIN_ROOT}/memcached-sid-$(upstream_version "${version}")-r${SID_RECIPE_VERSION}.oci.tar" \
		"$(upstream_version "${version}")-sid" fill_sid_memcached \
		"${MEMCACHED_CONFIG[@]}" \
		--config.label "org.opencontainers.image.version=${version}" \
		--config.label "org.opencontainers.image.description=Debian sid's memcached package, binary and libraries only"
	rm -rf "${tmp}"
	sid_archive
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
	EXPORTER_ARCHIVE="${BIN_ROOT}/memcached-exporter-${MEMCACHED_EXPORTER_VERSION#v}-r${EXPORTER_RECIPE_VERSION}-$(${GO} env GOVERSION 2>/dev/null || echo nogo).oci.tar"
	PAUSE_ARCHIVE="${BIN_ROOT}/pause-busybox-$(upstream_version "$(pkg_version busybox-static)")-${pkey}.oci.tar"
}

print_env() {
	image_names
	operator_paths
	printf 'MEMCACHED_IMAGE=%q\nPAUSE_IMAGE=%q\nEXPORTER_IMAGE=%q\n' "${MEMCACHED_IMAGE}" "${PAUSE_IMAGE}" "${EXPORTER_IMAGE}"
	printf 'OPERATOR_IMAGE=%q\nOPERATOR_ARCHIVE=%q\nOPERATOR_BINARY=%q\n' "${OPERATOR_IMAGE}" "${OPERATOR_ARCHIVE}" "${OPERATOR_BINARY}"
	printf 'OPERATOR_VERSION=%q\nOPERATOR_REVISION=%q\nOPERATOR_CREATED=%q\n' "${OPERATOR_VERSION}" "${OPERATOR_REVISION}" "${OPERATOR_CREATED}"
	if [[ -n "$(pkg_version memcached)" && -n "$(pkg_version busybox-static)" ]]; then
		archive_paths
		printf 'MEMCACHED_ARCHIVE=%q\nPAUSE_ARCHIVE=%q\nEXPORTER_ARCHIVE=%q\n' "${MEMCACHED_ARCHIVE}" "${PAUSE_ARCHIVE}" "${EXPORTER_ARCHIVE}"
	fi
	sid_archive
	if [[ -n "${MEMCACHED_SID_IMAGE}" ]]; then
		printf 'MEMCACHED_SID_IMAGE=%q\nMEMCACHED_SID_ARCHIVE=%q\n' "${MEMCACHED_SID_IMAGE}" "${MEMCACHED_SID_ARCHIVE}"
	fi
}

# ---------------------------------------------------------------- the operator image

ROOT="$(cd "${HACK_DIR}/.." && pwd)"
OPERATOR_RECIPE_VERSION=2
OPERATOR_PACKAGES=(buildah ca-certificates libc6-dev)

# OPERATOR_IMAGE (localhost/memcached-operator:<version in Cargo.toml>, or $OPERATOR_IMAGE);
# OPERATOR_BUILDER, the builder stage's output (the binary, passwd, group, CA bundle), named by a
# hash of everything the build reads: the build context's files (.dockerignore applied: sources,
# Cargo.toml, Cargo.lock), the Dockerfile, the Rust toolchain, and the versions of the packages
# that supply CA certificates, glibc and buildah; OPERATOR_BINARY in it; and OPERATOR_ARCHIVE, the
# image, named by that hash and the labels' version, revision and created (the git commit and its
# time), so a new commit with the same sources only re-runs the runtime stage.
operator_paths() {
	local key
	OPERATOR_VERSION="$(sed -n 's/^version = "\(.*\)"/\1/p' "${ROOT}/Cargo.toml" | head -n1)"
	OPERATOR_IMAGE="${OPERATOR_IMAGE:-localhost/memcached-operator:${OPERATOR_VERSION}}"
	OPERATOR_REVISION="$(git -C "${ROOT}" describe --always --dirty --abbrev=40 --match=NONE 2>/dev/null || echo unknown)"
	OPERATOR_CREATED="$(git -C "${ROOT}" log -1 --format=%cI 2>/dev/null | sed 's/+00:00$/Z/')"
	OPERATOR_CREATED="${OPERATOR_CREATED:-1970-01-01T00:00:00Z}"
	key="$(
		cd "${ROOT}"
		printf 'recipe=%s targetarch=%s\n' "${OPERATOR_RECIPE_VERSION}" "$(target_arch)"
		rustc -vV 2>/dev/null || true
		for p in "${OPERATOR_PACKAGES[@]}"; do printf '%s %s\n' "${p}" "$(pkg_version "${p}")"; done
		sha256sum Dockerfile .dockerignore hack/dockerfile.py
		python3 hack/dockerfile.py context . | tr '\n' '\0' | xargs -0 sha256sum
	)"
	key="$(sha256sum <<<"${key}" | cut -c1-12)"
	OPERATOR_BUILDER="${BIN_ROOT}/operator-builder-${OPERATOR_VERSION}-${key}"
	OPERATOR_BINARY="${OPERATOR_BUILDER}/memcached-operator"
	local labels
	labels="$(sha256sum <<<"${OPERATOR_IMAGE} ${OPERATOR_REVISION} ${OPERATOR_CREATED}" | cut -c1-8)"
	OPERATOR_ARCHIVE="${BIN_ROOT}/memcached-operator-${OPERATOR_VERSION}-${key}-${labels}.oci.tar"
}

# The Dockerfile's TARGETARCH for this machine (its Debian architecture: amd64, arm64).
target_arch() { dpkg --print-architecture; }

# The Dockerfile's builder stage, run here: its `cargo build` RUN and its ENV (hack/dockerfile.py
# builder-script) in a copy of the build context, and the files the runtime stage copies from
# it, in OUT.
operator_builder_stage() { # OUT
	local out="$1" ctx="${BIN_ROOT}/operator-context" script
	script="$(python3 "${HACK_DIR}/dockerfile.py" builder-script "${ROOT}/Dockerfile")"
	rm -rf "${ctx}"
	mkdir -p "${ctx}"
	(cd "${ROOT}" && python3 hack/dockerfile.py context . | tar --no-recursion -cf - -T -) | tar -C "${ctx}" -xf -
	mkdir -p "${out}/etc/ssl/certs"
	# The rust image's ca-certificates are Debian's too.
	cp -L /etc/ssl/certs/ca-certificates.crt "${out}/etc/ssl/certs/ca-certificates.crt"
	# The Dockerfile's cache mount on /src/target: the worktree's target directory (warm builds).
	local target_dir="${CARGO_TARGET_DIR:-${ROOT}/target}"
	mkdir -p "${target_dir}"
	ln -s "${target_dir}" "${ctx}/target"
	log "builder stage: cargo build ($(rustc -V)) in ${ctx}"
	(
		cd "${ctx}"
		unset CARGO_TARGET_DIR RUSTFLAGS
		export BUILDER_OUT="${out}" TARGETARCH
		TARGETARCH="$(target_arch)"
		timed "builder stage" nice -n "${BUILD_NICE:-5}" bash -c "${script}"
	)
}

# Keep the newest three of what matches NAME in BIN_ROOT.
keep_newest() { # NAME
	find "${BIN_ROOT}" -maxdepth 1 -name "$1" -printf '%T@ %p\n' | sort -rn |
		tail -n +4 | cut -d' ' -f2- | xargs -r rm -rf
}

# The builder stage's output, built unless cached (called with the lock held).
operator_builder() {
	if [[ -x "${OPERATOR_BINARY}" ]]; then
		log "builder stage cached (${OPERATOR_BUILDER})"
		return 0
	fi
	rm -rf "${BIN_ROOT}"/.tmp.operator-builder.*
	local work
	work="$(mktemp -d "${BIN_ROOT}/.tmp.operator-builder.XXXXXX")"
	chmod 755 "${work}"
	operator_builder_stage "${work}"
	mv "${work}" "${OPERATOR_BUILDER}"
	keep_newest 'operator-builder-*'
}

build_operator() {
	mkdir -p "${BIN_ROOT}"
	ensure_packages "${OPERATOR_PACKAGES[@]}"
	operator_paths
	exec 9>"${BIN_ROOT}/.operator.lock"
	flock 9
	if [[ -s "${OPERATOR_ARCHIVE}" ]]; then
		log "${OPERATOR_IMAGE} cached (${OPERATOR_ARCHIVE})"
		flock -u 9
		return 0
	fi
	local work t0=${SECONDS}
	operator_builder
	rm -rf "${BIN_ROOT}"/.tmp.operator.*
	work="$(mktemp -d "${BIN_ROOT}/.tmp.operator.XXXXXX")"
	# The runtime stage verbatim; `COPY --from=builder` reads the builder stage's output.
	python3 "${HACK_DIR}/dockerfile.py" runtime-stage "${ROOT}/Dockerfile" >"${work}/Dockerfile.runtime"
	mkdir -p "${work}/context"
	local -a buildah=(buildah --root "${work}/storage/root" --runroot "${work}/storage/run" --storage-driver vfs)
	"${buildah[@]}" bud --quiet --identity-label=false --timestamp "$(date -d "${OPERATOR_CREATED}" +%s)" \
		--build-arg VERSION="${OPERATOR_VERSION}" --build-arg REVISION="${OPERATOR_REVISION}" \
		--build-arg CREATED="${OPERATOR_CREATED}" \
		--build-context builder="${OPERATOR_BUILDER}" \
		-f "${work}/Dockerfile.runtime" -t "${OPERATOR_IMAGE}" "${work}/context" >"${work}/bud.log" 2>&1 ||
		{
			cat "${work}/bud.log" >&2
			die "buildah bud of the Dockerfile's runtime stage failed"
		}
	"${buildah[@]}" push --quiet "${OPERATOR_IMAGE}" "oci-archive:${work}/image.tar:${OPERATOR_IMAGE##*:}" >/dev/null
	mv "${work}/image.tar" "${OPERATOR_ARCHIVE}"
	rm -rf "${work}"
	keep_newest 'memcached-operator-*.oci.tar'
	log "built ${OPERATOR_IMAGE}: ${OPERATOR_ARCHIVE} ($(du -h "${OPERATOR_ARCHIVE}" | cut -f1)) in $((SECONDS - t0))s"
	flock -u 9
}

# The builder stage's binary (what the image runs), for the benchmarks.
operator_binary() {
	mkdir -p "${BIN_ROOT}"
	operator_paths
	exec 9>"${BIN_ROOT}/.operator.lock"
	flock 9
	operator_builder
	flock -u 9
	printf '%s\n' "${OPERATOR_BINARY}"
}

import_operator() { # SOCKET
	local sock="$1" refs
	build_operator
	ctr --address "${sock}" -n k8s.io images import --base-name "${OPERATOR_IMAGE%:*}" "${OPERATOR_ARCHIVE}" >/dev/null
	refs="$(ctr --address "${sock}" -n k8s.io images ls -q)"
	grep -qx "${OPERATOR_IMAGE}" <<<"${refs}" || die "${OPERATOR_IMAGE} not in containerd after import"
	log "imported ${OPERATOR_IMAGE} into ${sock} (namespace k8s.io)"
	printf '%s\n' "${OPERATOR_IMAGE}"
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
	rm -rf "${BIN_ROOT}"/.tmp.image.* "${BIN_ROOT}"/.tmp.sid.*
	if [[ -s "${MEMCACHED_ARCHIVE}" ]]; then
		log "${MEMCACHED_IMAGE} cached (${MEMCACHED_ARCHIVE})"
	else
		oci_image "${MEMCACHED_ARCHIVE}" "${MEMCACHED_IMAGE##*:}" fill_memcached \
			"${MEMCACHED_CONFIG[@]}" \
			--config.label "org.opencontainers.image.version=$(pkg_version memcached)" \
			--config.label "org.opencontainers.image.description=Debian's memcached package, binary and libraries only"
	fi
	build_sid_memcached
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
	if [[ -s "${EXPORTER_ARCHIVE}" ]]; then
		log "${EXPORTER_IMAGE} cached (${EXPORTER_ARCHIVE})"
	else
		exporter_binary
		oci_image "${EXPORTER_ARCHIVE}" "${EXPORTER_IMAGE##*:}" fill_exporter \
			--config.user 65534:65534 \
			--config.entrypoint /bin/memcached_exporter \
			--config.exposedports 9150/tcp \
			--config.label "org.opencontainers.image.title=memcached_exporter" \
			--config.label "org.opencontainers.image.version=${MEMCACHED_EXPORTER_VERSION}"
	fi
	flock -u 8
}

import_images() { # SOCKET
	local sock="$1"
	build_images
	ctr --address "${sock}" -n k8s.io images import --base-name "${MEMCACHED_IMAGE%:*}" "${MEMCACHED_ARCHIVE}" >/dev/null
	ctr --address "${sock}" -n k8s.io images import --base-name "${MEMCACHED_SID_IMAGE%:*}" "${MEMCACHED_SID_ARCHIVE}" >/dev/null
	ctr --address "${sock}" -n k8s.io images import --base-name "${PAUSE_IMAGE%:*}" "${PAUSE_ARCHIVE}" >/dev/null
	ctr --address "${sock}" -n k8s.io images import --base-name "${EXPORTER_IMAGE%:*}" "${EXPORTER_ARCHIVE}" >/dev/null
	local ref refs
	# (The list first: `ctr ... | grep -q` fails under pipefail when grep exits early.)
	refs="$(ctr --address "${sock}" -n k8s.io images ls -q)"
	for ref in "${MEMCACHED_IMAGE}" "${MEMCACHED_SID_IMAGE}" "${PAUSE_IMAGE}" "${EXPORTER_IMAGE}"; do
		grep -qx "${ref}" <<<"${refs}" || die "${ref} not in containerd after import"
	done
	log "imported ${MEMCACHED_IMAGE}, ${MEMCACHED_SID_IMAGE}, ${PAUSE_IMAGE} and ${EXPORTER_IMAGE} into ${sock} (namespace k8s.io)"
}

main() {
	case "${1:-}" in
	--print-env) print_env ;;
	build) build_images ;;
	import)
		[[ $# -eq 2 ]] || die "usage: $0 import SOCKET"
		import_images "$2"
		;;
	operator) build_operator ;;
	operator-binary) operator_binary ;;
	exporter-binary)
		exporter_binary
		printf '%s\n' "${EXPORTER_BIN}"
		;;
	import-operator)
		[[ $# -eq 2 ]] || die "usage: $0 import-operator SOCKET"
		import_operator "$2"
		;;
	*) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//' >&2 && exit 2 ;;
	esac
}

main "$@"
