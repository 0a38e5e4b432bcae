#!/usr/bin/env bash
# Generates the file-based catalog catalog/memcached-operator/index.yaml from bundle/ with opm:
#   olm.package   `opm init` (defaultChannel, description = the CSV's spec.description,
#                 icon = config/manifests/icon.svg)
#   olm.channel   DEFAULT_CHANNEL (alpha), one entry per bundle in catalog (today: bundle/)
#   olm.bundle    `opm render ./bundle`: the bundle's objects inline, no bundle image
# then `opm validate catalog`, and catalog.Dockerfile (`opm generate dockerfile catalog`: the
# standard image that runs `opm serve /configs`, its cache pre-built).
#
# Usage:
#   hack/olm/catalog.sh            regenerate catalog/memcached-operator/ and validate it
#   hack/olm/catalog.sh --check    regenerate into a temporary directory, fail on drift
#
# Environment: OPM (path; built and cached by hack/olm/build-tools.sh when unset),
# DEFAULT_CHANNEL (default from hack/olm/versions.env), OPM_IMAGE (base and builder image of
# catalog.Dockerfile; default operator-framework/opm:$OPM_VERSION, no registry named).
set -euo pipefail

OLM_HACK_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "${OLM_HACK_DIR}/../.." && pwd)"
# shellcheck disable=SC1091 # plain KEY=VALUE pins
source "${OLM_HACK_DIR}/versions.env"

PACKAGE=memcached-operator
DEFAULT_CHANNEL="${DEFAULT_CHANNEL:-${BUNDLE_DEFAULT_CHANNEL}}"
OPM_IMAGE="${OPM_IMAGE:-operator-framework/opm:${OPM_VERSION}}"

TMP_DIRS=()
cleanup() { if [[ ${#TMP_DIRS[@]} -gt 0 ]]; then rm -rf "${TMP_DIRS[@]}"; fi; }
trap cleanup EXIT
new_tmp() { # NAME : a temporary directory, removed on exit; path in REPLY
	REPLY="$(mktemp -d "${TMPDIR:-/tmp}/$1.XXXXXX")"
	TMP_DIRS+=("${REPLY}")
}
log() { printf '[olm/catalog] %s\n' "$*" >&2; }
die() {
	log "ERROR: $*"
	exit 1
}

opm() {
	if [[ -z "${OPM:-}" ]]; then OPM="$("${OLM_HACK_DIR}/build-tools.sh" --path opm)"; fi
	"${OPM}" "$@"
}

# generate OUTDIR : write OUTDIR/catalog/memcached-operator/index.yaml (directory replaced) and
# OUTDIR/catalog.Dockerfile.
generate() {
	local out="$1" work csv bundle_name
	new_tmp olm-catalog
	work="${REPLY}"
	csv="${REPO_ROOT}/bundle/manifests/${PACKAGE}.clusterserviceversion.yaml"
	[[ -f "${csv}" ]] || die "${csv} not found: run make bundle first"
	bundle_name="$(yq -r '.metadata.name' "${csv}")"
	yq -r '.spec.description' "${csv}" >"${work}/description.md"
	mkdir -p "${work}/catalog/${PACKAGE}"
	{
		opm init "${PACKAGE}" --default-channel="${DEFAULT_CHANNEL}" \
			--description="${work}/description.md" \
			--icon="${REPO_ROOT}/config/manifests/icon.svg" --output=yaml
		cat <<EOF
---
schema: olm.channel
package: ${PACKAGE}
name: ${DEFAULT_CHANNEL}
entries:
- name: ${bundle_name}
EOF
		# Each of opm's YAML outputs starts with its own "---".
		(cd "${REPO_ROOT}" && opm render ./bundle --output=yaml)
	} >"${work}/catalog/${PACKAGE}/index.yaml"
	opm validate "${work}/catalog" >&2 || die "opm validate failed on the generated catalog"
	(cd "${work}" && opm generate dockerfile catalog --base-image="${OPM_IMAGE}" --builder-image="${OPM_IMAGE}") >&2
	mkdir -p "${out}/catalog"
	rm -rf "${out:?}/catalog/${PACKAGE}"
	mv "${work}/catalog/${PACKAGE}" "${out}/catalog/${PACKAGE}"
	mv "${work}/catalog.Dockerfile" "${out}/catalog.Dockerfile"
}

main() {
	case "${1:-}" in
	--check)
		local tmp
		new_tmp olm-catalog-check
		tmp="${REPLY}"
		generate "${tmp}"
		local rc=0
		diff -ru "${REPO_ROOT}/catalog/${PACKAGE}" "${tmp}/catalog/${PACKAGE}" || rc=1
		diff -u "${REPO_ROOT}/catalog.Dockerfile" "${tmp}/catalog.Dockerfile" || rc=1
		[[ ${rc} == 0 ]] || die "catalog/${PACKAGE} or catalog.Dockerfile differ from what bundle/ generates: run make catalog"
		log "catalog/${PACKAGE} and catalog.Dockerfile match bundle/"
		;;
	"")
		generate "${REPO_ROOT}"
		opm validate "${REPO_ROOT}/catalog"
		log "wrote catalog/${PACKAGE}/index.yaml and catalog.Dockerfile; opm validate catalog: ok"
		;;
	*) die "unknown argument: $1 (see the header of $0)" ;;
	esac
}

main "$@"
