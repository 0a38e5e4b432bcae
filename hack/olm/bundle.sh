#!/usr/bin/env bash
# Generates the OLM bundle from config/ with operator-sdk, reproducibly:
#   kubectl kustomize config/manifests (+ IMG for the manager's image and the CSV's containerImage)
#   | operator-sdk generate bundle --package memcached-operator --version $VERSION ...
#   then pins the CSV's createdAt (operator-sdk stamps the current time) to BUNDLE_CREATED_AT.
# The upgrade graph: the CSV gets spec.replaces memcached-operator.v$REPLACES and the annotation
# olm.skipRange ">=$SKIP_RANGE_MIN <$VERSION" (each left out when its variable is empty).
#
# Usage:
#   hack/olm/bundle.sh            regenerate bundle/ and bundle.Dockerfile in the repo, then validate
#   hack/olm/bundle.sh OUTDIR     write OUTDIR/bundle and OUTDIR/bundle.Dockerfile instead
#   hack/olm/bundle.sh --check    regenerate into a temporary directory and fail if the result
#                                 differs from the committed bundle/ or bundle.Dockerfile (drift)
#
# Environment (defaults from hack/olm/versions.env): VERSION, IMG, CHANNELS, DEFAULT_CHANNEL,
# CREATED_AT, REPLACES, SKIP_RANGE_MIN (set and empty: none); OPERATOR_SDK (path; built and
# cached by hack/olm/build-tools.sh when unset); KUSTOMIZE (default: kubectl kustomize).
# For a release (see hack/olm/README.md, "Releasing"): RELATED_IMAGES, space-separated NAME=REF
# pairs that replace the manager's RELATED_IMAGE_<NAME> values (so the CSV's relatedImages), and
# USE_IMAGE_DIGESTS=true, which has operator-sdk replace every image's tag by the digest its
# registry serves (--use-image-digests: the registry must be reachable and hold the images).
set -euo pipefail

OLM_HACK_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "${OLM_HACK_DIR}/../.." && pwd)"
# shellcheck disable=SC1091 # plain KEY=VALUE pins
source "${OLM_HACK_DIR}/versions.env"

PACKAGE=memcached-operator
VERSION="${VERSION:-${BUNDLE_VERSION}}"
IMG="${IMG:-${IMAGE_TAG_BASE:-memcached-operator}:${VERSION}}"
CHANNELS="${CHANNELS:-${BUNDLE_CHANNELS}}"
DEFAULT_CHANNEL="${DEFAULT_CHANNEL:-${BUNDLE_DEFAULT_CHANNEL}}"
CREATED_AT="${CREATED_AT:-${BUNDLE_CREATED_AT}}"
REPLACES="${REPLACES-${BUNDLE_REPLACES}}"
SKIP_RANGE_MIN="${SKIP_RANGE_MIN-${BUNDLE_SKIP_RANGE_MIN}}"
read -r -a KUSTOMIZE_CMD <<<"${KUSTOMIZE:-kubectl kustomize}"

TMP_DIRS=()
cleanup() { if [[ ${#TMP_DIRS[@]} -gt 0 ]]; then rm -rf "${TMP_DIRS[@]}"; fi; }
trap cleanup EXIT
new_tmp() { # NAME : a temporary directory, removed on exit; path in REPLY
	REPLY="$(mktemp -d "${TMPDIR:-/tmp}/$1.XXXXXX")"
	TMP_DIRS+=("${REPLY}")
}

log() { printf '[olm/bundle] %s\n' "$*" >&2; }
die() {
	log "ERROR: $*"
	exit 1
}

operator_sdk() {
	if [[ -z "${OPERATOR_SDK:-}" ]]; then
		OPERATOR_SDK="$("${OLM_HACK_DIR}/build-tools.sh" --path operator-sdk)"
	fi
	"${OPERATOR_SDK}" "$@"
}

# render OVERLAY_DIR : config/manifests with the operator image set to IMG, on stdout.
render() {
	local overlay="$1" rel
	rel="$(python3 -c 'import os,sys; print(os.path.relpath(sys.argv[1], sys.argv[2]))' \
		"${REPO_ROOT}/config/manifests" "${overlay}")"
	cat >"${overlay}/kustomization.yaml" <<EOF
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
- ${rel}
patches:
- target:
    group: apps
    kind: Deployment
    labelSelector: control-plane=controller-manager
  patch: |-
    - op: replace
      path: /spec/template/spec/containers/0/image
      value: "${IMG}"
- target:
    group: operators.coreos.com
    kind: ClusterServiceVersion
  patch: |-
    - op: replace
      path: /metadata/annotations/containerImage
      value: "${IMG}"
EOF
	if [[ -n "${REPLACES}" ]]; then
		cat >>"${overlay}/kustomization.yaml" <<EOF
    - op: add
      path: /spec/replaces
      value: "${PACKAGE}.v${REPLACES}"
EOF
	fi
	if [[ -n "${SKIP_RANGE_MIN}" ]]; then
		cat >>"${overlay}/kustomization.yaml" <<EOF
    - op: add
      path: /metadata/annotations/olm.skipRange
      value: ">=${SKIP_RANGE_MIN} <${VERSION}"
EOF
	fi
	# After the CSV patch: the two above append operations to it. The agent beside memcached
	# runs the operator's image; RELATED_IMAGES may still name another.
	local pair
	for pair in "AGENT=${IMG}" ${RELATED_IMAGES:-}; do
		[[ "${pair}" == ?*=?* ]] || die "RELATED_IMAGES: expected NAME=REF, got ${pair}"
		cat >>"${overlay}/kustomization.yaml" <<EOF
- target:
    group: apps
    kind: Deployment
    labelSelector: control-plane=controller-manager
  patch: |-
    apiVersion: apps/v1
    kind: Deployment
    metadata:
      name: controller-manager
    spec:
      template:
        spec:
          containers:
          - name: manager
            env:
            - name: RELATED_IMAGE_${pair%%=*}
              value: "${pair#*=}"
EOF
	done
	"${KUSTOMIZE_CMD[@]}" "${overlay}"
}

# check_icon : the CSV base's icon is config/manifests/icon.svg.
check_icon() {
	local want got
	want="$(base64 -w0 "${REPO_ROOT}/config/manifests/icon.svg")"
	got="$(awk '/base64data:/{print $NF; exit}' "${REPO_ROOT}/config/manifests/bases/${PACKAGE}.clusterserviceversion.yaml")"
	[[ "${want}" == "${got}" ]] ||
		die "icon in config/manifests/bases/${PACKAGE}.clusterserviceversion.yaml is not base64 of config/manifests/icon.svg (run: base64 -w0 config/manifests/icon.svg)"
}

# generate OUTDIR : OUTDIR/bundle and OUTDIR/bundle.Dockerfile (both replaced).
generate() {
	local out="$1" work csv n
	new_tmp olm-bundle
	work="${REPLY}"
	mkdir -p "${work}/overlay" "${work}/gen"
	check_icon
	render "${work}/overlay" >"${work}/manifests.yaml"
	# operator-sdk writes bundle.Dockerfile into its working directory, with paths relative to
	# it, and reads manifests from stdin only when stdin is a pipe.
	[[ -n "${OPERATOR_SDK:-}" ]] || OPERATOR_SDK="$("${OLM_HACK_DIR}/build-tools.sh" --path operator-sdk)"
	local digests=()
	[[ "${USE_IMAGE_DIGESTS:-false}" != true ]] || digests=(--use-image-digests)
	# shellcheck disable=SC2002 # the pipe is the point
	cat "${work}/manifests.yaml" | (cd "${work}/gen" && "${OPERATOR_SDK}" generate bundle --quiet --overwrite \
		--package "${PACKAGE}" --version "${VERSION}" \
		--channels "${CHANNELS}" --default-channel "${DEFAULT_CHANNEL}" \
		"${digests[@]}" --output-dir bundle) >&2
	csv="${work}/gen/bundle/manifests/${PACKAGE}.clusterserviceversion.yaml"
	[[ -f "${csv}" ]] || die "operator-sdk wrote no ${csv##*/}"
	n="$(grep -c '^    createdAt: ' "${csv}" || true)"
	[[ "${n}" == 1 ]] || die "expected one createdAt annotation in ${csv##*/}, found ${n}"
	sed -i "s/^    createdAt: .*/    createdAt: \"${CREATED_AT}\"/" "${csv}"
	[[ -f "${work}/gen/bundle.Dockerfile" ]] || die "operator-sdk wrote no bundle.Dockerfile"
	mkdir -p "${out}"
	rm -rf "${out}/bundle"
	mv "${work}/gen/bundle" "${out}/bundle"
	mv "${work}/gen/bundle.Dockerfile" "${out}/bundle.Dockerfile"
}

validate() { # DIR
	operator_sdk bundle validate "$1" --select-optional suite=operatorframework
}

main() {
	case "${1:-}" in
	--check)
		local tmp rc=0
		new_tmp olm-bundle-check
		tmp="${REPLY}"
		generate "${tmp}"
		diff -ru "${REPO_ROOT}/bundle" "${tmp}/bundle" || rc=1
		diff -u "${REPO_ROOT}/bundle.Dockerfile" "${tmp}/bundle.Dockerfile" || rc=1
		[[ ${rc} == 0 ]] || die "bundle/ or bundle.Dockerfile differ from what config/ generates: run make bundle"
		log "bundle/ and bundle.Dockerfile match config/ (VERSION=${VERSION} IMG=${IMG} REPLACES=${REPLACES})"
		;;
	-*) die "unknown flag: $1 (see the header of $0)" ;;
	*)
		local out="${1:-${REPO_ROOT}}"
		generate "${out}"
		log "wrote ${out}/bundle and ${out}/bundle.Dockerfile (VERSION=${VERSION} IMG=${IMG})"
		validate "${out}/bundle"
		;;
	esac
}

main "$@"
