#!/usr/bin/env bash
# `operator-sdk run bundle`, `run bundle-upgrade`, `scorecard` and `cleanup`, unmodified, on the
# local control plane with its real node (root), the way an operator developer tests a bundle:
#   - images: the operator, memcached and the exporter (hack/images.sh); opm, OLM's util image,
#     scorecard-test and busybox (hack/olm/images.sh); the bundle images of 0.1.0 and 0.2.0 from
#     their bundle.Dockerfile and the catalog image from catalog.Dockerfile, built with buildah;
#     all pushed to a registry on 127.0.0.1 (hack/olm/registry.sh, HTTPS with its own CA), which
#     the real node's containerd pulls from and also uses as its mirror of docker.io (the
#     scorecard config's short image name) and of the registry of the decompression image that
#     `run bundle-upgrade` hard-codes (it has no flag for it)
#   - the cluster: hack/cluster.sh up with REAL_NODE=1 and no kwok nodes, the real node's taint
#     removed (operator-sdk's and OLM's pods carry no toleration); OLM's CRDs and its olm and
#     catalog operators as processes (test-lib.sh), the catalog operator's --opmImage and
#     --util-image the images above (the bundle unpack Job runs on the real node)
# Phases:
#   1. run bundle of 0.1.0 (its bundle rebuilt from the release's rendered catalog entry, images
#      named in the local registry): CSV Succeeded, the operator a pod on the real node from its
#      image as pulled from the registry, the sample Memcached Available with real memcached pods
#      that answer; a key is stored in each
#   2. run bundle-upgrade to 0.2.0 (bundle.sh with the images in the local registry, as a release
#      is made): 0.2.0 Succeeded and replaces 0.1.0, the Memcached stays Available throughout
#      (sampled every second), same Memcached UID, same memcached pod UIDs, the keys still there
#   2b. run bundle-upgrade to a patch release pinned by digest (so the memcached pod template
#      changes): it rolls as promised, every pod replaced, Available with all pods serving in every
#      sample, never more than one extra pod
#   3. scorecard of bundle/ as committed (its config unmodified): the six tests as pods
#   4. the catalog image as a CatalogSource (OLM's registry pod, probed with grpc_health_probe):
#      READY, and a Subscription to it resolves to 0.2.0
#   5. cleanup: the CSV, Subscription, CatalogSource, registry pod, OperatorGroup, CRD and with it
#      every Memcached, its Deployment and pods gone
#
# Usage: hack/olm/test-run-bundle.sh [DIR]   (default .cluster/run-bundle; logs stay there)
#        Ends with "N passed, N failed"; FIGURE lines also in DIR/logs/run-bundle-figures.txt,
#        operator-sdk's output in DIR/logs/run-bundle-operator-sdk.log. Without root it is
#        skipped (exit 0), unless REQUIRE_REAL_NODE=1 (exit 2), as in CI.
# Environment: TIMEOUT (seconds per wait, default 240), KEEP=1 (leave everything running).
set -euo pipefail

OLM_HACK_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "${OLM_HACK_DIR}/../.." && pwd)"
DIR="${1:-${REPO_ROOT}/.cluster/run-bundle}"
mkdir -p "${DIR}/logs"
DIR="$(cd "${DIR}" && pwd -P)"
TIMEOUT="${TIMEOUT:-240}"

PACKAGE=memcached-operator
OLM_NS=olm
NS=memcached-run-bundle
NS_CATALOG=memcached-catalog-image
MEMCACHED_PODS=app.kubernetes.io/part-of=memcached-operator,app.kubernetes.io/component=cache
OPERATOR_POD=control-plane=controller-manager
SAMPLE_FILE="${REPO_ROOT}/config/samples/cache_v1alpha1_memcached.yaml"
CATALOG="${REPO_ROOT}/catalog/${PACKAGE}"
CSV_FILE="${REPO_ROOT}/bundle/manifests/${PACKAGE}.clusterserviceversion.yaml"

LOG_TAG=olm/test-run-bundle
TEST_NAME=run-bundle
FIGURES="${DIR}/logs/run-bundle-figures.txt"
# shellcheck source=hack/olm/test-lib.sh
source "${OLM_HACK_DIR}/test-lib.sh"
# shellcheck source=hack/real-node.sh
source "${REPO_ROOT}/hack/real-node.sh"
# shellcheck disable=SC1091 # plain KEY=VALUE pins
source "${OLM_HACK_DIR}/versions.env"

if [[ "$(id -u)" -ne 0 ]]; then
	echo "SKIPPED: run bundle on the real node needs root (containerd, runc, bridges, buildah)" >&2
	[[ -z "${REQUIRE_REAL_NODE:-}" ]] || exit 2
	exit 0
fi
olm_ports_free
ensure_packages yq jq
rm -rf "${DIR}/work" "${DIR}/registry"
mkdir -p "${DIR}/work"
: >"${FIGURES}"
T0=${SECONDS}

CSV_NAME="$(yq -r '.metadata.name' "${CSV_FILE}")"
VERSION="$(yq -r '.spec.version' "${CSV_FILE}")"
PREV_CSV="$(yq -r '.spec.replaces // ""' "${CSV_FILE}")"
PREV_VERSION="${PREV_CSV#"${PACKAGE}".v}"
[[ -n "${PREV_CSV}" && -f "${CATALOG}/${PREV_CSV}.yaml" ]] || die "${CSV_NAME} replaces no release kept in catalog/${PACKAGE}"
SAMPLE="$(yq -r '.metadata.name' "${SAMPLE_FILE}")"
SAMPLE_SIZE="$(yq -r '.spec.size' "${SAMPLE_FILE}")"

# ---------------------------------------------------------------- tools and images
OPERATOR_SDK="$("${OLM_HACK_DIR}/build-tools.sh" --path operator-sdk)"
OPM="$("${OLM_HACK_DIR}/build-tools.sh" --path opm)"
OLM_DIR="$("${OLM_HACK_DIR}/build-tools.sh" --path olm)"
"${REPO_ROOT}/hack/images.sh" build >&2
"${REPO_ROOT}/hack/images.sh" operator >&2
eval "$("${REPO_ROOT}/hack/images.sh" --print-env)"
eval "$("${OLM_HACK_DIR}/images.sh" build)"
# The decompression image of the registry pod that `run bundle-upgrade` makes: it has no flag for
# it, so the real node's mirror serves one under operator-sdk's default name (it needs sh, cat
# and gzip: busybox).
BIN_ROOT="${MEMCACHED_OPERATOR_CACHE:-${HOME}/.cache/memcached-operator}/bin" GO="${GO:-go}"
SDK_SRC="$(module_field "github.com/operator-framework/operator-sdk@${OPERATOR_SDK_VERSION}" Dir)"
UPGRADE_INIT_IMAGE="$(sed -n 's/^\s*DefaultInitImage = "\(.*\)"$/\1/p' "${SDK_SRC}/internal/olm/fbcutil/util.go")"
[[ -n "${UPGRADE_INIT_IMAGE}" ]] || die "operator-sdk's DefaultInitImage not found in its source"

# HTTPS: operator-sdk looks the index image up without its --use-http (plain HTTP refused).
REGISTRY="$("${OLM_HACK_DIR}/registry.sh" start "${DIR}/registry" --tls)"
export SSL_CERT_FILE="${DIR}/registry/ca.crt" # operator-sdk and opm trust the registry
ON_EXIT+=("\"${OLM_HACK_DIR}/registry.sh\" stop \"${DIR}/registry\"")
push() { "${OLM_HACK_DIR}/registry.sh" push "$@"; } # ARCHIVE REF
OPERATOR_REF_PREV="${REGISTRY}/memcached-operator:${PREV_VERSION}"
OPERATOR_REF="${REGISTRY}/memcached-operator:${VERSION}"
MEMCACHED_REF="${REGISTRY}/memcached:${MEMCACHED_IMAGE##*:}"
EXPORTER_REF="${REGISTRY}/memcached-exporter:${EXPORTER_IMAGE##*:}"
# One operator binary serves as both releases here (the operand's pod template is the same).
push "${OPERATOR_ARCHIVE}" "${OPERATOR_REF_PREV}"
push "${OPERATOR_ARCHIVE}" "${OPERATOR_REF}"
push "${MEMCACHED_ARCHIVE}" "${MEMCACHED_REF}"
push "${EXPORTER_ARCHIVE}" "${EXPORTER_REF}"
push "${OPM_ARCHIVE}" "${REGISTRY}/${OPM_IMAGE}"
push "${OLM_UTIL_ARCHIVE}" "${REGISTRY}/${OLM_UTIL_IMAGE}"
push "${SCORECARD_TEST_ARCHIVE}" "${REGISTRY}/${SCORECARD_TEST_IMAGE}"
push "${BUSYBOX_ARCHIVE}" "${REGISTRY}/${BUSYBOX_IMAGE}"
push "${BUSYBOX_ARCHIVE}" "${REGISTRY}/${UPGRADE_INIT_IMAGE#*/}"

# The release being prepared, as a release is made (hack/olm/README.md, "Releasing"): bundle.sh
# with the images named in a registry.
IMG="${OPERATOR_REF}" RELATED_IMAGES="MEMCACHED=${MEMCACHED_REF} MEMCACHED_EXPORTER=${EXPORTER_REF}" \
	OPERATOR_SDK="${OPERATOR_SDK}" "${OLM_HACK_DIR}/bundle.sh" "${DIR}/work/v${VERSION}" >&2

# The previous release: the bundle its catalog entry was rendered from (olm.bundle.object holds
# every manifest), its images named in the local registry as a mirror would.
prev_bundle() { # OUT
	local out="$1" entry="${CATALOG}/${PREV_CSV}.yaml" map channels i=0 data
	mkdir -p "${out}/bundle/manifests" "${out}/bundle/metadata"
	# relatedImages by name: "" is the operator, the others RELATED_IMAGE_<NAME>s.
	# shellcheck disable=SC2016 # jq variables
	map="$(yq -c --arg op "${OPERATOR_REF_PREV}" --arg mc "${MEMCACHED_REF}" --arg ex "${EXPORTER_REF}" \
		'[.relatedImages[] | {key: .image, value: ({"": $op, "memcached": $mc, "memcached-exporter": $ex}[.name] //
			error("no local image for relatedImages entry " + .name))}] | from_entries' "${entry}")"
	while read -r data; do
		i=$((i + 1))
		# shellcheck disable=SC2016
		base64 -d <<<"${data}" | jq --argjson map "${map}" 'walk(if type == "string" then ($map[.] // .) else . end)' \
			>"${out}/bundle/manifests/${i}.json"
	done < <(yq -r '.properties[] | select(.type == "olm.bundle.object") | .value.data' "${entry}")
	[[ ${i} -gt 0 ]] || die "${entry} holds no olm.bundle.object"
	# shellcheck disable=SC2016
	channels="$(yq -r --arg csv "${PREV_CSV}" 'select(any(.entries[]; .name == $csv)) | .name' "${CATALOG}/channels.yaml" | paste -sd, -)"
	cat >"${out}/bundle/metadata/annotations.yaml" <<-EOF
		annotations:
		  operators.operatorframework.io.bundle.mediatype.v1: registry+v1
		  operators.operatorframework.io.bundle.manifests.v1: manifests/
		  operators.operatorframework.io.bundle.metadata.v1: metadata/
		  operators.operatorframework.io.bundle.package.v1: ${PACKAGE}
		  operators.operatorframework.io.bundle.channels.v1: ${channels}
		  operators.operatorframework.io.bundle.channel.default.v1: ${channels%%,*}
	EOF
	{
		echo "FROM scratch"
		yq -r '.annotations | to_entries[] | "LABEL \(.key)=\(.value)"' "${out}/bundle/metadata/annotations.yaml"
		echo "COPY bundle/manifests /manifests/"
		echo "COPY bundle/metadata /metadata/"
	} >"${out}/bundle.Dockerfile"
}
prev_bundle "${DIR}/work/v${PREV_VERSION}"
check "the rebuilt ${PREV_CSV} bundle validates" "${OPERATOR_SDK}" bundle validate "${DIR}/work/v${PREV_VERSION}/bundle"

BUNDLE_REF_PREV="${REGISTRY}/${PACKAGE}-bundle:v${PREV_VERSION}"
BUNDLE_REF="${REGISTRY}/${PACKAGE}-bundle:v${VERSION}"
CATALOG_REF="${REGISTRY}/${PACKAGE}-catalog:v${VERSION}"
"${OLM_HACK_DIR}/images.sh" bundle "${DIR}/work/v${PREV_VERSION}" "${DIR}/work/bundle-prev.tar" "v${PREV_VERSION}"
"${OLM_HACK_DIR}/images.sh" bundle "${DIR}/work/v${VERSION}" "${DIR}/work/bundle.tar" "v${VERSION}"
"${OLM_HACK_DIR}/images.sh" catalog "${DIR}/work/catalog.tar" "v${VERSION}"
push "${DIR}/work/bundle-prev.tar" "${BUNDLE_REF_PREV}"
push "${DIR}/work/bundle.tar" "${BUNDLE_REF}"
push "${DIR}/work/catalog.tar" "${CATALOG_REF}"
rendered_catalog_matches() { # the catalog image serves exactly catalog/
	diff <("${OPM}" render "${REPO_ROOT}/catalog" -o json | jq -S .) \
		<("${OPM}" render "${CATALOG_REF}" -o json | jq -S .)
}
check "opm render of the catalog image (from catalog.Dockerfile) equals opm render catalog/" rendered_catalog_matches
# The committed bundle.Dockerfile and bundle/, as `make bundle-build` would build them.
"${OLM_HACK_DIR}/images.sh" bundle "${REPO_ROOT}" "${DIR}/work/bundle-committed.tar" "v${VERSION}"
push "${DIR}/work/bundle-committed.tar" "${REGISTRY}/${PACKAGE}-bundle-committed:v${VERSION}"
rendered_bundle_matches() { # the image renders as bundle/ does (it also lists itself as a related image)
	# shellcheck disable=SC2016 # jq variables
	diff <("${OPM}" render "${REPO_ROOT}/bundle" -o json | jq -S 'del(.image)') \
		<("${OPM}" render "${REGISTRY}/${PACKAGE}-bundle-committed:v${VERSION}" -o json |
			jq -S --arg self "${REGISTRY}/${PACKAGE}-bundle-committed:v${VERSION}" 'del(.image) | .relatedImages |= map(select(.image != $self))')
}
check "opm render of the image of the committed bundle.Dockerfile equals opm render bundle/" rendered_bundle_matches
figure "images built $((SECONDS - T0))s after the start: bundles ${BUNDLE_REF_PREV##*/}, ${BUNDLE_REF##*/}, catalog ${CATALOG_REF##*/}"

# ---------------------------------------------------------------- the cluster
REAL_NODE=1 NODES=0 "${REPO_ROOT}/hack/cluster.sh" up "${DIR}" >&2
CLUSTER_UP=1
# shellcheck disable=SC1091 # written by cluster.sh
source "${DIR}/env"
export KUBECONFIG
kctl taint node "${REAL_NODE_NAME}" "${REAL_NODE_TAINT}-" >/dev/null
real_node_registry_hosts "${DIR}" "${REGISTRY}" "${SSL_CERT_FILE}" docker.io "${UPGRADE_INIT_IMAGE%%/*}"
OLM_CLUSTER_DNS="${REAL_NODE_DNS_IP}" start_olm "${OLM_NS}" --util-image "${REGISTRY}/${OLM_UTIL_IMAGE}" --opmImage "${REGISTRY}/${OPM_IMAGE}"
kctl create namespace "${NS}" >/dev/null
T_CLUSTER=${SECONDS}

sdk() { # ARGS... : operator-sdk, its output kept in DIR/logs/run-bundle-operator-sdk.log
	printf '$ operator-sdk %s\n' "$*" >>"${DIR}/logs/run-bundle-operator-sdk.log"
	(cd "${DIR}/work" && "${OPERATOR_SDK}" "$@") 2>&1 | tee -a "${DIR}/logs/run-bundle-operator-sdk.log"
}
csv_phase() { jp csv -n "${NS}" "$1" -o jsonpath='{.status.phase}'; } # CSV
csv_succeeded() { [[ "$(csv_phase "$1")" == Succeeded ]]; }            # CSV
csv_gone() { ! kctl get csv -n "${NS}" "$1" -o name >/dev/null 2>&1; } # CSV
# The operator's one pod: Running and Ready on the real node, from IMAGE as pulled from the registry.
operator_pod_runs() { # IMAGE (by tag or digest)
	local pods repo="${1%@*}"
	[[ "$1" == *@* ]] || repo="${1%:*}"
	pods="$(jp pods -n "${NS}" -l "${OPERATOR_POD}" -o json)" || return 1
	jq -e --arg img "$1" --arg node "${REAL_NODE_NAME}" --arg repo "${repo}@sha256:" '
		.items | length == 1 and (.[0] |
			.spec.nodeName == $node and .status.phase == "Running" and .metadata.deletionTimestamp == null and
			.spec.containers[0].image == $img and
			(.status.containerStatuses[] | select(.name == "manager") | .ready and (.imageID | startswith($repo)))
		)' <<<"${pods}"
}
memcached_available() { [[ "$(jp memcached -n "${NS}" "${SAMPLE}" -o jsonpath='{.status.conditions[?(@.type=="Available")].status}')" == True ]]; }
memcached_pods_ready() { # N : N memcached pods, all Ready on the real node, none terminating
	jp pods -n "${NS}" -l "${MEMCACHED_PODS}" -o json | jq -e --argjson n "$1" --arg node "${REAL_NODE_NAME}" '
		[.items[] | select(.metadata.deletionTimestamp == null)] | length == $n and
		all(.spec.nodeName == $node and any(.status.conditions[]?; .type == "Ready" and .status == "True"))'
}
pod_ips() { jp pods -n "${NS}" -l "${MEMCACHED_PODS}" -o jsonpath='{range .items[*]}{.status.podIP}{"\n"}{end}'; }
pod_uids() { jp pods -n "${NS}" -l "${MEMCACHED_PODS}" -o jsonpath='{range .items[*]}{.metadata.name}={.metadata.uid}{"\n"}{end}' | sort; }
# memcached's text protocol from the host to each pod IP: SET stores KEY=VALUE in every pod, GET
# reads it back from every pod.
memcached_each() { # set|get KEY VALUE
	local ip
	for ip in $(pod_ips); do
		python3 - "${ip}" "$@" <<-'EOF' || return 1
			import socket, sys
			ip, op, key, value = sys.argv[1:]
			s = socket.create_connection((ip, 11211), 5)
			if op == "set":
			    s.sendall(b"set %s 0 0 %d\r\n%s\r\n" % (key.encode(), len(value), value.encode()))
			    want = b"STORED\r\n"
			else:
			    s.sendall(b"get %s\r\n" % key.encode())
			    want = b"VALUE %s 0 %d\r\n%s\r\nEND\r\n" % (key.encode(), len(value), value.encode())
			got = b""
			while not got.endswith(b"\r\n") or (op == "get" and not got.endswith(b"END\r\n")):
			    chunk = s.recv(4096)
			    if not chunk:
			        break
			    got += chunk
			if got != want:
			    sys.exit("%s: %s %s answered %r" % (ip, op, key, got))
		EOF
	done
}

# ---------------------------------------------------------------- 1. run bundle (previous release)
T=$(now_ms)
check "operator-sdk run bundle ${BUNDLE_REF_PREV##*/} (--index-image: the opm image)" \
	sdk run bundle "${BUNDLE_REF_PREV}" --index-image "${REGISTRY}/${OPM_IMAGE}" \
	--decompression-image "${REGISTRY}/${BUSYBOX_IMAGE}" -n "${NS}" --timeout 5m
stop_if_failed "run bundle"
figure "run bundle ${PREV_CSV}: command to CSV Succeeded $(secs_since "${T}") s"
check "CSV ${PREV_CSV} phase Succeeded" csv_succeeded "${PREV_CSV}"
figure "install mode: OperatorGroup targetNamespaces [$(jp operatorgroup -n "${NS}" -o jsonpath='{.items[0].spec.targetNamespaces}')] (empty: AllNamespaces)"
unpack_job_done() { [[ "$(jp jobs -n "${NS}" -o jsonpath='{range .items[*]}{.status.succeeded}{end}')" == 1* ]]; }
check "OLM's bundle unpack Job ran on the real node and succeeded" unpack_job_done
registry_pod() { jp catalogsource -n "${NS}" "${PACKAGE}-catalog" -o jsonpath='{.metadata.annotations.operators\.operatorframework\.io/registry-pod-name}'; }
registry_pod_image() { [[ "$(jp pod -n "${NS}" "$(registry_pod)" -o jsonpath='{.spec.containers[0].image}')" == "${REGISTRY}/${OPM_IMAGE}" ]]; }
check "run bundle's registry pod runs the opm image" registry_pod_image
check "operator pod Running and Ready on ${REAL_NODE_NAME} from ${OPERATOR_REF_PREV##*/}, pulled from the registry" \
	wait_until "${TIMEOUT}" operator_pod_runs "${OPERATOR_REF_PREV}"

T=$(now_ms)
kctl apply -n "${NS}" -f "${SAMPLE_FILE}" >/dev/null
check "Memcached ${SAMPLE} Available" wait_until "${TIMEOUT}" memcached_available
stop_if_failed "the operator's pod or the sample Memcached"
figure "sample Memcached (size ${SAMPLE_SIZE}) created to Available: $(secs_since "${T}") s"
check "${SAMPLE_SIZE} memcached pods Ready on ${REAL_NODE_NAME}" wait_until "${TIMEOUT}" memcached_pods_ready "${SAMPLE_SIZE}"
check "every memcached pod stores a key (set over TCP from the host)" memcached_each set run-bundle "${PREV_VERSION}"
MEMCACHED_UID="$(jp memcached -n "${NS}" "${SAMPLE}" -o jsonpath='{.metadata.uid}')"
pod_uids >"${DIR}/work/pods.before"
GENERATION_BEFORE="$(jp deployment -n "${NS}" "${SAMPLE}" -o jsonpath='{.metadata.generation}')"

# Every second until an upgrade is over: the Memcached's Available condition, its memcached pods
# that are Ready and not terminating (serving), and all its pods not terminating.
monitor() {
	local s pods
	while :; do
		s="$(kubectl --request-timeout=5s get memcached -n "${NS}" "${SAMPLE}" \
			-o jsonpath='{.status.conditions[?(@.type=="Available")].status}' 2>&1)" || s="ERROR"
		pods="$(kubectl --request-timeout=5s get pods -n "${NS}" -l "${MEMCACHED_PODS}" -o json 2>/dev/null | jq -r '
			[.items[] | select(.metadata.deletionTimestamp == null)] |
			"ready=\([.[] | select(any(.status.conditions[]?; .type == "Ready" and .status == "True"))] | length) pods=\(length)"')" ||
			pods="ready=? pods=?"
		printf '%s available=%s %s\n' "$(date +%T)" "${s}" "${pods}"
		sleep 1
	done
}
# samples LOG : how many samples; not_available LOG : how many without Available=True;
# min_ready LOG / max_pods LOG : the fewest serving pods and the most pods in any sample.
samples() { grep -c . "$1" || true; }
not_available() { grep -vc ' available=True ' "$1" || true; }
min_ready() { sed -n 's/.* ready=\([0-9]*\) .*/\1/p' "$1" | sort -n | head -n1; }
max_pods() { sed -n 's/.* pods=\([0-9]*\)$/\1/p' "$1" | sort -n | tail -n1; }
start availability monitor
MONITOR_PID="${REPLY}"

# ---------------------------------------------------------------- 2. run bundle-upgrade
T=$(now_ms)
check "operator-sdk run bundle-upgrade ${BUNDLE_REF##*/}" \
	sdk run bundle-upgrade "${BUNDLE_REF}" -n "${NS}" --timeout 5m
stop_if_failed "run bundle-upgrade"
figure "run bundle-upgrade ${PREV_CSV} -> ${CSV_NAME}: command to CSV Succeeded $(secs_since "${T}") s"
check "CSV ${CSV_NAME} phase Succeeded" csv_succeeded "${CSV_NAME}"
replaces_prev() { [[ "$(jp csv -n "${NS}" "${CSV_NAME}" -o jsonpath='{.spec.replaces}')" == "${PREV_CSV}" ]]; }
check "CSV ${CSV_NAME} replaces ${PREV_CSV}" replaces_prev
check "CSV ${PREV_CSV} removed" wait_until "${TIMEOUT}" csv_gone "${PREV_CSV}"
check "operator pod Running and Ready on ${REAL_NODE_NAME} from ${OPERATOR_REF##*/}" \
	wait_until "${TIMEOUT}" operator_pod_runs "${OPERATOR_REF}"
new_operator_reconciled() { memcached_available && memcached_pods_ready "${SAMPLE_SIZE}"; }
check "Memcached ${SAMPLE} Available under ${CSV_NAME}" wait_until "${TIMEOUT}" new_operator_reconciled
sleep 5 # a few more samples with the new operator in charge
stop "${MONITOR_PID}"
same_memcached() { [[ "$(jp memcached -n "${NS}" "${SAMPLE}" -o jsonpath='{.metadata.uid}')" == "${MEMCACHED_UID}" ]]; }
check "the same Memcached (UID ${MEMCACHED_UID:-?}): no CR lost" same_memcached
pod_uids >"${DIR}/work/pods.after"
check "memcached pods not restarted (the same pod UIDs)" diff "${DIR}/work/pods.before" "${DIR}/work/pods.after"
figure "memcached pod UIDs before/after the upgrade: $(paste -sd' ' "${DIR}/work/pods.before") / $(paste -sd' ' "${DIR}/work/pods.after")"
same_generation() { [[ "$(jp deployment -n "${NS}" "${SAMPLE}" -o jsonpath='{.metadata.generation}')" == "${GENERATION_BEFORE}" ]]; }
check "the memcached Deployment not rolled (generation ${GENERATION_BEFORE})" same_generation
check "every memcached pod still holds the key stored under ${PREV_CSV}" memcached_each get run-bundle "${PREV_VERSION}"
MLOG="${DIR}/logs/run-bundle-availability.log"
always_available() { [[ "$(samples "$1")" -gt 0 && "$(not_available "$1")" -eq 0 && "$(min_ready "$1")" -ge "${SAMPLE_SIZE}" ]]; } # LOG
check "Memcached Available and ${SAMPLE_SIZE} pods serving in every sample during the upgrade" always_available "${MLOG}"
figure "samples during the upgrade: $(samples "${MLOG}"), not Available: $(not_available "${MLOG}"), fewest serving pods: $(min_ready "${MLOG}"); Memcacheds lost: $(same_memcached && echo 0 || echo 1)"

# ---------------------------------------------------------------- 2b. a release that changes the pod template
# A patch release made as releases are (hack/olm/README.md, "Releasing": images pinned by digest):
# the memcached image's reference changes from tag to digest, so every memcached pod template
# changes; the operator rolls it as the rollout strategy promises (maxSurge 1, maxUnavailable 0,
# minReadySeconds): the Memcached serves with all its pods throughout, one pod added at a time.
PATCH_VERSION="${VERSION%.*}.$((${VERSION##*.} + 1))"
PATCH_CSV="${PACKAGE}.v${PATCH_VERSION}"
OPERATOR_REF_PATCH="${REGISTRY}/memcached-operator:${PATCH_VERSION}"
push "${OPERATOR_ARCHIVE}" "${OPERATOR_REF_PATCH}"
RELEASED_VERSION="${VERSION}"
VERSION="${PATCH_VERSION}" REPLACES="${RELEASED_VERSION}" SKIP_RANGE_MIN="" IMG="${OPERATOR_REF_PATCH}" \
	RELATED_IMAGES="MEMCACHED=${MEMCACHED_REF} MEMCACHED_EXPORTER=${EXPORTER_REF}" USE_IMAGE_DIGESTS=true \
	OPERATOR_SDK="${OPERATOR_SDK}" "${OLM_HACK_DIR}/bundle.sh" "${DIR}/work/v${PATCH_VERSION}" >&2
MEMCACHED_PINNED="${MEMCACHED_REF%:*}@$("${OLM_HACK_DIR}/registry.sh" digest "${MEMCACHED_REF}")"
"${OLM_HACK_DIR}/images.sh" bundle "${DIR}/work/v${PATCH_VERSION}" "${DIR}/work/bundle-patch.tar" "v${PATCH_VERSION}"
BUNDLE_REF_PATCH="${REGISTRY}/${PACKAGE}-bundle:v${PATCH_VERSION}"
push "${DIR}/work/bundle-patch.tar" "${BUNDLE_REF_PATCH}"
start availability-roll monitor
MONITOR_PID="${REPLY}"
T=$(now_ms)
check "operator-sdk run bundle-upgrade ${BUNDLE_REF_PATCH##*/} (images by digest)" \
	sdk run bundle-upgrade "${BUNDLE_REF_PATCH}" -n "${NS}" --timeout 5m
figure "run bundle-upgrade ${CSV_NAME} -> ${PATCH_CSV}: command to CSV Succeeded $(secs_since "${T}") s"
stop_if_failed "run bundle-upgrade to the patch release"
check "operator pod Running and Ready on ${REAL_NODE_NAME} from the patch release's image (by digest)" \
	wait_until "${TIMEOUT}" operator_pod_runs "${OPERATOR_REF_PATCH%:*}@$("${OLM_HACK_DIR}/registry.sh" digest "${OPERATOR_REF_PATCH}")"
rolled() { # every memcached pod runs the pinned image, none of the old pods left
	memcached_pods_ready "${SAMPLE_SIZE}" &&
		[[ "$(jp deployment -n "${NS}" "${SAMPLE}" -o jsonpath='{.spec.template.spec.containers[0].image}')" == "${MEMCACHED_PINNED}" ]] &&
		[[ -z "$(comm -12 "${DIR}/work/pods.before" <(pod_uids))" ]] && memcached_available
}
check "the memcached Deployment rolled to ${MEMCACHED_PINNED##*/}: ${SAMPLE_SIZE} new pods Ready, Available" \
	wait_until "${TIMEOUT}" rolled
figure "patch release: bundle-upgrade started to every memcached pod replaced: $(secs_since "${T}") s"
sleep 3
stop "${MONITOR_PID}"
check "the same Memcached (UID ${MEMCACHED_UID:-?}) after the roll" same_memcached
MLOG="${DIR}/logs/run-bundle-availability-roll.log"
check "Memcached Available and ${SAMPLE_SIZE} pods serving in every sample during the roll" always_available "${MLOG}"
surge_one() { [[ "$(max_pods "${MLOG}")" -le $((SAMPLE_SIZE + 1)) ]]; }
check "at most one pod over size at any time (maxSurge 1)" surge_one
figure "samples during the roll: $(samples "${MLOG}"), not Available: $(not_available "${MLOG}"), fewest serving pods: $(min_ready "${MLOG}"), most pods: $(max_pods "${MLOG}")"
check "every new memcached pod answers (a key set and read back)" memcached_each set run-bundle "${PATCH_VERSION}"
check "every new memcached pod reads its key back" memcached_each get run-bundle "${PATCH_VERSION}"

# ---------------------------------------------------------------- 3. scorecard
T=$(now_ms)
scorecard() {
	(cd "${DIR}/work" && "${OPERATOR_SDK}" scorecard "${REPO_ROOT}/bundle" -n "${NS}" -o json -w 180s \
		--untar-image "${REGISTRY}/${BUSYBOX_IMAGE}" --storage-image "${REGISTRY}/${BUSYBOX_IMAGE}") \
		>"${DIR}/work/scorecard.json" 2>>"${DIR}/logs/run-bundle-operator-sdk.log"
}
check "operator-sdk scorecard bundle/ (tests as pods of the scorecard-test image)" scorecard
figure "scorecard: $(jq -r '[.items[].status.results[] | "\(.name)=\(.state)"] | join(" ")' "${DIR}/work/scorecard.json" 2>/dev/null) in $(secs_since "${T}") s"
want_tests="$(yq -r '.stages[].tests[].entrypoint[1]' "${REPO_ROOT}/bundle/tests/scorecard/config.yaml" | sort | paste -sd' ' -)"
passed_tests() { jq -r '.items[].status.results[] | select(.state == "pass") | .name' "${DIR}/work/scorecard.json" | sort | paste -sd' ' -; }
all_passed() { [[ -n "${want_tests}" && "$(passed_tests)" == "${want_tests}" ]]; }
check "scorecard: every test of the config passed (${want_tests})" all_passed

# ---------------------------------------------------------------- 4. the catalog image
kctl create namespace "${NS_CATALOG}" >/dev/null
kctl apply -f - >/dev/null <<EOF
apiVersion: operators.coreos.com/v1alpha1
kind: CatalogSource
metadata:
  name: ${PACKAGE}-catalog-image
  namespace: ${OLM_NS}
spec:
  sourceType: grpc
  image: ${CATALOG_REF}
  displayName: memcached-operator (catalog image)
  grpcPodConfig:
    securityContextConfig: restricted
---
apiVersion: operators.coreos.com/v1
kind: OperatorGroup
metadata:
  name: ${PACKAGE}
  namespace: ${NS_CATALOG}
spec:
  targetNamespaces: [${NS_CATALOG}]
---
apiVersion: operators.coreos.com/v1alpha1
kind: Subscription
metadata:
  name: ${PACKAGE}
  namespace: ${NS_CATALOG}
spec:
  name: ${PACKAGE}
  source: ${PACKAGE}-catalog-image
  sourceNamespace: ${OLM_NS}
  installPlanApproval: Manual
EOF
catalog_ready() { [[ "$(jp catalogsource -n "${OLM_NS}" "${PACKAGE}-catalog-image" -o jsonpath='{.status.connectionState.lastObservedState}')" == READY ]]; }
check "CatalogSource of the catalog image READY (its pod on ${REAL_NODE_NAME}, probed by grpc_health_probe)" \
	wait_until "${TIMEOUT}" catalog_ready
resolves_to_release() {
	local ip
	ip="$(jp subscription -n "${NS_CATALOG}" "${PACKAGE}" -o jsonpath='{.status.installPlanRef.name}')"
	[[ -n "${ip}" && " $(jp installplan -n "${NS_CATALOG}" "${ip}" -o jsonpath='{.spec.clusterServiceVersionNames[*]}') " == *" ${CSV_NAME} "* ]]
}
check "a Subscription to the catalog image's default channel resolves to ${CSV_NAME}" wait_until "${TIMEOUT}" resolves_to_release
kctl delete namespace "${NS_CATALOG}" --wait=false >/dev/null
kctl delete catalogsource -n "${OLM_NS}" "${PACKAGE}-catalog-image" >/dev/null

# ---------------------------------------------------------------- 5. cleanup
T=$(now_ms)
check "operator-sdk cleanup ${PACKAGE}" sdk cleanup "${PACKAGE}" -n "${NS}" --timeout 3m
figure "cleanup: $(secs_since "${T}") s"
none_left() { # KIND... : no object of any KIND in NS
	local k
	for k in "$@"; do [[ -z "$(kctl get "${k}" -n "${NS}" -o name 2>/dev/null)" ]] || return 1; done
}
check "no CSV, Subscription, CatalogSource, OperatorGroup or InstallPlan left" \
	none_left csv subscription catalogsource operatorgroup installplan
check "no Deployment or pod left in ${NS} (operator, registry, memcached)" wait_until "${TIMEOUT}" none_left deployment pods
crd_gone() { ! kctl get crd memcacheds.cache.example.com >/dev/null 2>&1; }
check "CRD memcacheds.cache.example.com deleted (and with it every Memcached)" wait_until "${TIMEOUT}" crd_gone
figure "the whole test: $((SECONDS - T0)) s (cluster up after $((T_CLUSTER - T0)) s)"

finish
