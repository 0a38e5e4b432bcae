#!/usr/bin/env bash
# Maintains the file-based catalog catalog/memcached-operator/ with opm. It holds every release:
#   package.yaml                       olm.package (`opm init`: defaultChannel, description = the
#                                      CSV's spec.description, icon = config/manifests/icon.svg)
#   channels.yaml                      one olm.channel per channel: the upgrade graph
#   memcached-operator.v<X.Y.Z>.yaml   one olm.bundle per release (`opm render` of its bundle
#                                      directory: the bundle's objects inline, no bundle image)
# Only the bundle being prepared (bundle/, VERSION in hack/olm/versions.env) is (re)rendered; the
# files of earlier releases are kept as committed, never regenerated: a release, once in the
# catalog, does not change. channels.yaml keeps every entry of earlier releases; the current
# bundle's entry is put in each of CHANNELS (and taken out of any other channel) with the
# CSV's spec.replaces and olm.skipRange, entries ordered by version.
# Then `opm validate catalog`, and catalog.Dockerfile (`opm generate dockerfile catalog`: the
# standard image that runs `opm serve /configs`, its cache pre-built).
#
# Usage:
#   hack/olm/catalog.sh            regenerate package.yaml, channels.yaml and the current bundle's
#                                  file in catalog/memcached-operator/, and validate
#   hack/olm/catalog.sh --check    regenerate into a temporary copy, fail on drift
#
# Environment: OPM (path; built and cached by hack/olm/build-tools.sh when unset),
# CHANNELS and DEFAULT_CHANNEL (defaults from hack/olm/versions.env), OPM_IMAGE (base and builder
# image of catalog.Dockerfile; default operator-framework/opm:$OPM_VERSION, no registry named).
set -euo pipefail

OLM_HACK_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "${OLM_HACK_DIR}/../.." && pwd)"
# shellcheck disable=SC1091 # plain KEY=VALUE pins
source "${OLM_HACK_DIR}/versions.env"

PACKAGE=memcached-operator
CHANNELS="${CHANNELS:-${BUNDLE_CHANNELS}}"
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

# channels IN OUT BUNDLE_NAME REPLACES SKIP_RANGE : channels.yaml IN with BUNDLE_NAME's entry set
# in each of CHANNELS and removed from the others, written to OUT. Also checks that every entry
# names a bundle of the catalog (a file BUNDLE.yaml beside OUT).
channels() {
	python3 - "$@" "${PACKAGE}" "${CHANNELS}" "${DEFAULT_CHANNEL}" <<'EOF'
import os, re, sys, yaml

src, out, name, replaces, skip_range, package, channels, default = sys.argv[1:]
wanted = [c for c in channels.split(",") if c]
docs = []
if os.path.exists(src):
    docs = [d for d in yaml.safe_load_all(open(src, encoding="utf-8")) if d]
by_name = {}
for d in docs:
    if d.get("schema") != "olm.channel" or d.get("package") != package:
        sys.exit(f"{src}: only olm.channel blobs of package {package} belong here, found {d.get('schema')}")
    by_name[d["name"]] = d
for c in wanted:
    by_name.setdefault(c, {"schema": "olm.channel", "package": package, "name": c, "entries": []})
if default not in by_name:
    sys.exit(f"default channel {default} is not a channel of the catalog")

def version(bundle):
    m = re.fullmatch(re.escape(package) + r"\.v(\d+)\.(\d+)\.(\d+)(?:-(.+))?", bundle)
    if not m:
        sys.exit(f"bundle name {bundle!r} is not {package}.v<semver>")
    # A pre-release sorts before its release.
    return (int(m[1]), int(m[2]), int(m[3]), 0 if m[4] else 1, m[4] or "")

entry = {"name": name}
if replaces:
    entry["replaces"] = replaces
if skip_range:
    entry["skipRange"] = skip_range
catalog_dir = os.path.dirname(out)
result = []
for cname in sorted(by_name):
    ch = by_name[cname]
    entries = [e for e in ch.get("entries") or [] if e["name"] != name]
    if cname in wanted:
        entries.append(entry)
    for e in entries:
        if not os.path.exists(os.path.join(catalog_dir, e["name"] + ".yaml")):
            sys.exit(f"channel {cname}: entry {e['name']} has no {e['name']}.yaml in the catalog")
    entries.sort(key=lambda e: version(e["name"]))
    if entries:
        result.append({"schema": "olm.channel", "package": package, "name": cname, "entries": entries})
with open(out, "w", encoding="utf-8") as f:
    yaml.safe_dump_all(result, f, sort_keys=False, explicit_start=True, width=1000)
EOF
}

# generate SRC OUTDIR : OUTDIR/catalog/memcached-operator/ (a copy of SRC, the committed catalog
# directory, with the current bundle's files regenerated) and OUTDIR/catalog.Dockerfile.
generate() {
	local src="$1" out="$2" work csv bundle_name replaces skip_range dir
	new_tmp olm-catalog
	work="${REPLY}"
	csv="${REPO_ROOT}/bundle/manifests/${PACKAGE}.clusterserviceversion.yaml"
	[[ -f "${csv}" ]] || die "${csv} not found: run make bundle first"
	bundle_name="$(yq -r '.metadata.name' "${csv}")"
	replaces="$(yq -r '.spec.replaces // ""' "${csv}")"
	skip_range="$(yq -r '.metadata.annotations["olm.skipRange"] // ""' "${csv}")"
	yq -r '.spec.description' "${csv}" >"${work}/description.md"
	dir="${work}/catalog/${PACKAGE}"
	mkdir -p "${dir}"
	# Earlier releases, as committed.
	if [[ -d "${src}" ]]; then
		find "${src}" -maxdepth 1 -name "${PACKAGE}.v*.yaml" ! -name "${bundle_name}.yaml" -exec cp {} "${dir}/" \;
	fi
	opm init "${PACKAGE}" --default-channel="${DEFAULT_CHANNEL}" \
		--description="${work}/description.md" \
		--icon="${REPO_ROOT}/config/manifests/icon.svg" --output=yaml >"${dir}/package.yaml"
	# Each of opm's YAML outputs starts with its own "---".
	(cd "${REPO_ROOT}" && opm render ./bundle --output=yaml) >"${dir}/${bundle_name}.yaml"
	[[ "$(yq -r 'select(.schema == "olm.bundle") | .name' "${dir}/${bundle_name}.yaml")" == "${bundle_name}" ]] ||
		die "opm render ./bundle did not produce bundle ${bundle_name}"
	channels "${src}/channels.yaml" "${dir}/channels.yaml" "${bundle_name}" "${replaces}" "${skip_range}" ||
		die "cannot update channels.yaml"
	opm validate "${work}/catalog" >&2 || die "opm validate failed on the generated catalog"
	(cd "${work}" && opm generate dockerfile catalog --base-image="${OPM_IMAGE}" --builder-image="${OPM_IMAGE}") >&2
	mkdir -p "${out}/catalog"
	rm -rf "${out:?}/catalog/${PACKAGE}"
	mv "${dir}" "${out}/catalog/${PACKAGE}"
	mv "${work}/catalog.Dockerfile" "${out}/catalog.Dockerfile"
}

main() {
	local src="${REPO_ROOT}/catalog/${PACKAGE}"
	case "${1:-}" in
	--check)
		local tmp
		new_tmp olm-catalog-check
		tmp="${REPLY}"
		generate "${src}" "${tmp}"
		local rc=0
		diff -ru "${src}" "${tmp}/catalog/${PACKAGE}" || rc=1
		diff -u "${REPO_ROOT}/catalog.Dockerfile" "${tmp}/catalog.Dockerfile" || rc=1
		[[ ${rc} == 0 ]] || die "catalog/${PACKAGE} or catalog.Dockerfile differ from what bundle/ and the kept releases generate: run make catalog"
		log "catalog/${PACKAGE} and catalog.Dockerfile match bundle/ and the kept releases"
		;;
	"")
		local tmp
		new_tmp olm-catalog-new
		tmp="${REPLY}"
		generate "${src}" "${tmp}"
		mkdir -p "${REPO_ROOT}/catalog"
		rm -rf "${src}"
		mv "${tmp}/catalog/${PACKAGE}" "${src}"
		mv "${tmp}/catalog.Dockerfile" "${REPO_ROOT}/catalog.Dockerfile"
		opm validate "${REPO_ROOT}/catalog"
		log "wrote catalog/${PACKAGE}/ (package.yaml, channels.yaml, $(cd "${src}" && echo "${PACKAGE}".v*.yaml)) and catalog.Dockerfile; opm validate catalog: ok"
		;;
	*) die "unknown argument: $1 (see the header of $0)" ;;
	esac
}

main "$@"
