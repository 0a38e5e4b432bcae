#!/usr/bin/env bash
# A release bundle pinned by digest, as hack/olm/README.md ("Releasing") tells how to make one:
# the operator, memcached and exporter images pushed to a registry on 127.0.0.1, then hack/olm/bundle.sh
# with IMG and RELATED_IMAGES naming them there and USE_IMAGE_DIGESTS=true. Checks that every
# image the CSV names (containerImage, the manager's image, RELATED_IMAGE_* values and
# relatedImages) is the registry's reference by the digest the registry serves, that no tag is
# left, and that the bundle validates. Root (image builds and packages).
set -euo pipefail

OLM_HACK_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
HACK_DIR="$(cd "${OLM_HACK_DIR}/.." && pwd)"
LOG_TAG=olm/test-digests
# shellcheck source=hack/lib.sh
source "${HACK_DIR}/lib.sh"
# shellcheck disable=SC1091 # plain KEY=VALUE pins
source "${OLM_HACK_DIR}/versions.env"

ensure_packages yq jq
WORK="$(mktemp -d "${TMPDIR:-/tmp}/olm-digests.XXXXXX")"
cleanup() {
	"${OLM_HACK_DIR}/registry.sh" stop "${WORK}/registry" || true
	rm -rf "${WORK}"
}
trap cleanup EXIT

failed=0
pass() { printf 'PASS  %s\n' "$*"; }
fail() {
	printf 'FAIL  %s\n' "$*"
	failed=1
}

"${HACK_DIR}/images.sh" build >&2
"${HACK_DIR}/images.sh" operator >&2
eval "$("${HACK_DIR}/images.sh" --print-env)"
REGISTRY="$("${OLM_HACK_DIR}/registry.sh" start "${WORK}/registry")"
operator_ref="${REGISTRY}/memcached/memcached-operator:${BUNDLE_VERSION}"
memcached_ref="${REGISTRY}/memcached/memcached:${MEMCACHED_IMAGE##*:}"
exporter_ref="${REGISTRY}/memcached/memcached-exporter:${EXPORTER_IMAGE##*:}"
"${OLM_HACK_DIR}/registry.sh" push "${OPERATOR_ARCHIVE}" "${operator_ref}"
"${OLM_HACK_DIR}/registry.sh" push "${MEMCACHED_ARCHIVE}" "${memcached_ref}"
"${OLM_HACK_DIR}/registry.sh" push "${EXPORTER_ARCHIVE}" "${exporter_ref}"
pinned() { echo "${1%:*}@$("${OLM_HACK_DIR}/registry.sh" digest "$1")"; }
operator_pinned="$(pinned "${operator_ref}")"
memcached_pinned="$(pinned "${memcached_ref}")"
exporter_pinned="$(pinned "${exporter_ref}")"

IMG="${operator_ref}" RELATED_IMAGES="MEMCACHED=${memcached_ref} MEMCACHED_EXPORTER=${exporter_ref}" \
	USE_IMAGE_DIGESTS=true \
	"${OLM_HACK_DIR}/bundle.sh" "${WORK}/out" >&2
CSV="${WORK}/out/bundle/manifests/memcached-operator.clusterserviceversion.yaml"

expect() { # WHAT GOT WANT
	if [[ "$2" == "$3" ]]; then pass "$1: $2"; else fail "$1: got '$2', want '$3'"; fi
}
expect "CSV containerImage" "$(yq -r '.metadata.annotations.containerImage' "${CSV}")" "${operator_pinned}"
manager='.spec.install.spec.deployments[0].spec.template.spec.containers[] | select(.name == "manager")'
expect "manager image" "$(yq -r "${manager} | .image" "${CSV}")" "${operator_pinned}"
env_value() { yq -r "${manager} | .env[] | select(.name == \"$1\") | .value" "${CSV}"; }
expect "RELATED_IMAGE_MEMCACHED" "$(env_value RELATED_IMAGE_MEMCACHED)" "${memcached_pinned}"
expect "RELATED_IMAGE_MEMCACHED_EXPORTER" "$(env_value RELATED_IMAGE_MEMCACHED_EXPORTER)" "${exporter_pinned}"
related="$(yq -r '.spec.relatedImages[].image' "${CSV}" | sort | tr '\n' ' ')"
for want in "${operator_pinned}" "${memcached_pinned}" "${exporter_pinned}"; do
	if [[ " ${related}" == *" ${want} "* ]]; then pass "relatedImages lists ${want}"; else fail "relatedImages (${related}) lacks ${want}"; fi
done
# Every image reference in the CSV, wherever it is: none by tag.
tagged="$(yq -r '.. | objects | (.image?, .containerImage?, (select(.name? | strings | startswith("RELATED_IMAGE_")) | .value?)) | strings' "${CSV}" |
	grep -v '@sha256:[0-9a-f]\{64\}$' || true)"
expect "image references by tag" "${tagged:-none}" "none"
if "$(make --no-print-directory -s -C "${HACK_DIR}/.." operator-sdk)" bundle validate "${WORK}/out/bundle" \
	--select-optional suite=operatorframework >"${WORK}/validate.log" 2>&1; then
	pass "operator-sdk bundle validate (suite=operatorframework)"
else
	fail "bundle validate: $(tail -5 "${WORK}/validate.log")"
fi
[[ ${failed} == 0 ]] || die "digest-pinned bundle: failures above"
log "a bundle pinned by digest from ${REGISTRY}: all checks passed"
