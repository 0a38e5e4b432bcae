#!/usr/bin/env bash
# Installs the operator through real OLM on the embedded local control plane, then upgrades it
# along the catalog's upgrade graph, the way OperatorHub users receive a release, but without
# images or a container runtime:
#   - hack/cluster.sh up: etcd, kube-apiserver, controller-manager, scheduler, kwok (fake nodes)
#   - OLM's CRDs (the module's deploy/chart/crds), and OLM's own `olm` and
#     `catalog` operators run as processes against it (KUBECONFIG), built from the OLM module
#   - `opm serve` on 127.0.0.1 of a file-based catalog (its bundles carry their objects inline, so
#     no bundle image and no unpack Job are needed), a grpc CatalogSource (spec.address)
# Phase 1, the previous release: the catalog as it was before the bundle in bundle/ (the release
# its CSV `replaces`) is served. Two OwnNamespace installs of it: NS by an Automatic Subscription,
# NS_MANUAL by a Manual one (its InstallPlan approved by the test). Asserts the InstallPlan, the
# CSV phase and the objects OLM creates; runs the operator binary as each CSV's Deployment would
# (below) and creates Memcacheds, plus one in NS_OTHER that no OperatorGroup targets.
# Phase 2, the upgrade: catalog/ (all releases) is served in its place on the same address. NS
# upgrades by itself; NS_MANUAL gets an InstallPlan that waits for approval until the test
# approves it. Asserts: the new CSV Succeeds and replaces the old one (which is removed), every
# Memcached stays Available throughout (polled every second), no Memcached is lost (same UIDs),
# and the memcached pods are not restarted (same pod UIDs, same Deployment generations: the new
# operator computes the same pod template). Then least privilege: the new CSV's `permissions`
# apply in NS only (`kubectl auth can-i` as the operator's ServiceAccount), and the operator still
# reconciles a new Memcached in NS. Phase 3: a fresh Subscription to the default channel installs
# the new release directly. Phase 4: without the ServiceMonitor and PrometheusRule CRDs, OLM
# fails the InstallPlan of the bundle, which holds one of each.
#
# kwok runs no containers, so the operator binary runs as a process instead of the pod, as the
# ServiceAccount OLM created, with the environment the pod gets (WATCH_NAMESPACE from the pod's
# olm.targetNamespaces annotation); when OLM rolls the Deployment to the new CSV, the process is
# replaced too, like the pod.
#
# Usage: hack/olm/test-olm.sh [DIR]   (default: .cluster/olm-test; cluster state and logs stay
#        there). Ends with "N passed, N failed"; exit 1 if anything failed. The cluster and every
#        process started here are stopped on exit (KEEP=1 leaves them running for inspection).
#        Figures (upgrade durations, pod UIDs) are printed and kept in DIR/logs/olm-upgrade.txt.
# Environment: OPERATOR_BIN (default target/release/memcached-operator; required), OPM, OLM_DIR,
#        TIMEOUT (seconds per wait, default 180).
# OLM's operators listen on :8080 (olm, health) and :8443 (catalog, health over TLS): their
# ports are fixed upstream, so the script refuses to start when either is taken.
set -euo pipefail

OLM_HACK_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "${OLM_HACK_DIR}/../.." && pwd)"
DIR="${1:-${REPO_ROOT}/.cluster/olm-test}"
mkdir -p "${DIR}"
DIR="$(cd "${DIR}" && pwd -P)"
TIMEOUT="${TIMEOUT:-180}"

PACKAGE=memcached-operator
OLM_NS=olm
NS=memcached-olm-test
NS_MANUAL=memcached-olm-manual
NS_OTHER=memcached-olm-other
NS_FRESH=memcached-olm-fresh
NS_NO_CRDS=memcached-olm-no-monitoring
CATSRC=memcached-catalog
CATALOG="${REPO_ROOT}/catalog/${PACKAGE}"
CSV_FILE="${REPO_ROOT}/bundle/manifests/${PACKAGE}.clusterserviceversion.yaml"
CSV_NAME="$(yq -r '.metadata.name' "${CSV_FILE}")"
PREV_CSV="$(yq -r '.spec.replaces // ""' "${CSV_FILE}")"
DEPLOYMENT="$(yq -r '.spec.install.spec.deployments[0].name' "${CSV_FILE}")"
SA="$(yq -r '.spec.install.spec.deployments[0].spec.template.spec.serviceAccountName' "${CSV_FILE}")"
IMAGE="$(yq -r '.spec.install.spec.deployments[0].spec.template.spec.containers[0].image' "${CSV_FILE}")"
DEFAULT_CHANNEL="$(yq -r 'select(.schema == "olm.package") | .defaultChannel' "${CATALOG}/package.yaml")"
OPERATOR_BIN="${OPERATOR_BIN:-${REPO_ROOT}/target/release/memcached-operator}"
# The memcached pods (not the operator's): labels of src/resources.rs.
MEMCACHED_PODS=app.kubernetes.io/part-of=memcached-operator,app.kubernetes.io/component=cache

LOG_TAG=olm/test-olm
TEST_NAME=olm
FIGURES="${DIR}/logs/olm-upgrade.txt"
# shellcheck source=hack/olm/test-lib.sh
source "${OLM_HACK_DIR}/test-lib.sh"

# ---------------------------------------------------------------- setup
olm_ports_free
[[ -f "${CATALOG}/package.yaml" ]] || die "catalog/${PACKAGE}/package.yaml not found: run make catalog"
[[ -n "${PREV_CSV}" ]] || die "${CSV_NAME} replaces nothing: there is no upgrade to test"
[[ -f "${CATALOG}/${PREV_CSV}.yaml" ]] || die "the release ${CSV_NAME} replaces, ${PREV_CSV}, is not in catalog/${PACKAGE}"
[[ -x "${OPERATOR_BIN}" ]] || die "${OPERATOR_BIN} not built (cargo build --release, or set OPERATOR_BIN)"

OPM="${OPM:-$("${OLM_HACK_DIR}/build-tools.sh" --path opm)}"
OLM_DIR="${OLM_DIR:-$("${OLM_HACK_DIR}/build-tools.sh" --path olm)}"

"${REPO_ROOT}/hack/cluster.sh" up "${DIR}" >&2
CLUSTER_UP=1
# shellcheck disable=SC1091 # written by cluster.sh
source "${DIR}/env"
export KUBECONFIG
: >"${DIR}/logs/olm-upgrade.txt"
T0=${SECONDS}

start_olm "${OLM_NS}"

# The catalog before this release: catalog/ without the bundle of bundle/ (and its channel
# entries), its default channel one that still has entries.
rm -rf "${DIR}/catalog-prev"
mkdir -p "${DIR}/catalog-prev/${PACKAGE}"
find "${CATALOG}" -maxdepth 1 -name "${PACKAGE}.v*.yaml" ! -name "${CSV_NAME}.yaml" -exec cp {} "${DIR}/catalog-prev/${PACKAGE}/" \;
# shellcheck disable=SC2016 # $csv and $ch are jq variables
yq -y --arg csv "${CSV_NAME}" '.entries |= map(select(.name != $csv)) | select(.entries | length > 0)' \
	"${CATALOG}/channels.yaml" >"${DIR}/catalog-prev/${PACKAGE}/channels.yaml"
# shellcheck disable=SC2016
PREV_CHANNEL="$(yq -r --arg csv "${PREV_CSV}" 'select(any(.entries[]; .name == $csv)) | .name' \
	"${DIR}/catalog-prev/${PACKAGE}/channels.yaml" | head -n1)"
[[ -n "${PREV_CHANNEL}" ]] || die "${PREV_CSV} is in no channel of catalog/${PACKAGE}/channels.yaml"
# shellcheck disable=SC2016
yq -y --arg ch "${PREV_CHANNEL}" '.defaultChannel = $ch' "${CATALOG}/package.yaml" \
	>"${DIR}/catalog-prev/${PACKAGE}/package.yaml"
check "the catalog before ${CSV_NAME} (${PREV_CSV} in channel ${PREV_CHANNEL}) passes opm validate" \
	"${OPM}" validate "${DIR}/catalog-prev"

read -r GRPC_PORT PPROF_PORT <<<"$(free_ports 2)"
OPM_PID=
serve_catalog() { # DIR NAME : opm serve DIR on GRPC_PORT (as catalog.Dockerfile: cache first)
	rm -rf "${DIR}/opm-cache-$2"
	check "opm serve --cache-only builds the cache of $2" \
		"${OPM}" serve "$1" --cache-dir "${DIR}/opm-cache-$2" --cache-only \
		--pprof-addr "127.0.0.1:${PPROF_PORT}" --termination-log "${DIR}/logs/opm-termination.log"
	start "opm-$2" "${OPM}" serve "$1" --port "${GRPC_PORT}" --cache-dir "${DIR}/opm-cache-$2" \
		--pprof-addr "127.0.0.1:${PPROF_PORT}" --termination-log "${DIR}/logs/opm-termination.log"
	OPM_PID="${REPLY}"
	check "opm serve $2 listening on 127.0.0.1:${GRPC_PORT}" \
		wait_until 60 python3 -c 'import socket,sys; socket.create_connection(("127.0.0.1", int(sys.argv[1])), 1)' "${GRPC_PORT}"
}
serve_catalog "${DIR}/catalog-prev" previous

# ---------------------------------------------------------------- phase 1: the previous release
log "creating CatalogSource, OperatorGroups and Subscriptions (${PREV_CSV}, channel ${PREV_CHANNEL})"
operator_group() { # NS
	cat <<EOF
---
apiVersion: v1
kind: Namespace
metadata:
  name: $1
---
apiVersion: operators.coreos.com/v1
kind: OperatorGroup
metadata:
  name: ${PACKAGE}
  namespace: $1
spec:
  targetNamespaces:
  - $1
EOF
}
subscription() { # NS CHANNEL APPROVAL [STARTING_CSV]
	cat <<EOF
---
apiVersion: operators.coreos.com/v1alpha1
kind: Subscription
metadata:
  name: ${PACKAGE}
  namespace: $1
spec:
  name: ${PACKAGE}
  channel: $2
  source: ${CATSRC}
  sourceNamespace: ${OLM_NS}
  installPlanApproval: $3
EOF
	if [[ -n "${4:-}" ]]; then printf '  startingCSV: %s\n' "$4"; fi
}
{
	cat <<EOF
apiVersion: operators.coreos.com/v1alpha1
kind: CatalogSource
metadata:
  name: ${CATSRC}
  namespace: ${OLM_NS}
spec:
  sourceType: grpc
  address: 127.0.0.1:${GRPC_PORT}
  displayName: memcached-operator (local catalog/)
  publisher: memcached-operator maintainers
EOF
	operator_group "${NS}"
	subscription "${NS}" "${PREV_CHANNEL}" Automatic
	operator_group "${NS_MANUAL}"
	subscription "${NS_MANUAL}" "${PREV_CHANNEL}" Manual "${PREV_CSV}"
} | kctl apply -f - >/dev/null
kctl create namespace "${NS_OTHER}" >/dev/null

catsrc_ready() { [[ "$(jp catalogsource -n "${OLM_NS}" "${CATSRC}" -o jsonpath='{.status.connectionState.lastObservedState}')" == READY ]]; }
check "CatalogSource ${CATSRC} connection READY" wait_until "${TIMEOUT}" catsrc_ready

installplan() { jp subscription -n "$1" "${PACKAGE}" -o jsonpath='{.status.installPlanRef.name}'; } # NS
has_installplan() { [[ -n "$(installplan "$1")" ]]; }                                               # NS
new_installplan() { [[ -n "$(installplan "$1")" && "$(installplan "$1")" != "$2" ]]; }              # NS OLD
ip_phase() { jp installplan -n "$1" "$2" -o jsonpath='{.status.phase}'; }                          # NS IP
ip_complete() { [[ "$(ip_phase "$1" "$2")" == Complete ]]; }                                       # NS IP
ip_installs() { [[ " $(jp installplan -n "$1" "$2" -o jsonpath='{.spec.clusterServiceVersionNames[*]}') " == *" $3 "* ]]; } # NS IP CSV
ip_waits_for_approval() {                                                                          # NS IP
	[[ "$(ip_phase "$1" "$2")" == RequiresApproval && "$(jp installplan -n "$1" "$2" -o jsonpath='{.spec.approved}')" == false ]]
}
approve() { kctl patch installplan -n "$1" "$2" --type merge -p '{"spec":{"approved":true}}'; } # NS IP
csv_phase() { jp csv -n "$1" "$2" -o jsonpath='{.status.phase}'; }                             # NS CSV
csv_succeeded() { [[ "$(csv_phase "$1" "$2")" == Succeeded ]]; }                                # NS CSV
csv_gone() { ! kctl get csv -n "$1" "$2" -o name >/dev/null 2>&1; }                             # NS CSV

check "Subscription in ${NS} resolved to an InstallPlan" wait_until "${TIMEOUT}" has_installplan "${NS}"
IP="$(installplan "${NS}")"
check "InstallPlan ${IP:-?} phase Complete" wait_until "${TIMEOUT}" ip_complete "${NS}" "${IP}"
check "InstallPlan ${IP:-?} installs ${PREV_CSV}" ip_installs "${NS}" "${IP}" "${PREV_CSV}"
no_jobs() { [[ -z "$(kctl get jobs -A -o name)" ]]; }
check "no bundle unpack Job (bundle objects inline in the catalog)" no_jobs
check "CSV ${PREV_CSV} in ${NS} phase Succeeded" wait_until "${TIMEOUT}" csv_succeeded "${NS}" "${PREV_CSV}"

check "Manual Subscription in ${NS_MANUAL} resolved to an InstallPlan" wait_until "${TIMEOUT}" has_installplan "${NS_MANUAL}"
IP_MANUAL="$(installplan "${NS_MANUAL}")"
check "InstallPlan ${IP_MANUAL:-?} (${PREV_CSV}) waits for approval" \
	wait_until "${TIMEOUT}" ip_waits_for_approval "${NS_MANUAL}" "${IP_MANUAL}"
check "InstallPlan ${IP_MANUAL:-?} approved" approve "${NS_MANUAL}" "${IP_MANUAL}"
check "CSV ${PREV_CSV} in ${NS_MANUAL} phase Succeeded" wait_until "${TIMEOUT}" csv_succeeded "${NS_MANUAL}" "${PREV_CSV}"

# ---------------------------------------------------------------- what OLM created
check "CRD memcacheds.cache.example.com created and Established" \
	kctl wait --for=condition=Established --timeout=10s crd/memcacheds.cache.example.com
check "ServiceAccount ${SA}" kctl get serviceaccount -n "${NS}" "${SA}" -o name
owned() { # CSV KIND [-n NS] : some object of KIND that OLM labelled as owned by CSV exists
	# Not `| grep -q .`: under pipefail, grep leaving early makes kubectl die of SIGPIPE when
	# there is more than one object.
	local csv="$1"
	shift
	[[ -n "$(kctl get "$@" -l "olm.owner=${csv}" -o name)" ]]
}
owned_role_and_binding() { owned "$1" role -n "$2" && owned "$1" rolebinding -n "$2"; } # CSV NS
check "Role and RoleBinding (permissions) owned by ${PREV_CSV}" owned_role_and_binding "${PREV_CSV}" "${NS}"
owned_clusterrole_and_binding() { owned "$1" clusterrole && owned "$1" clusterrolebinding; } # CSV
check "ClusterRole and ClusterRoleBinding (clusterPermissions) owned by ${PREV_CSV}" \
	owned_clusterrole_and_binding "${PREV_CSV}"
check "ClusterRole memcached-operator-memcached-viewer-role (bundle object)" \
	kctl get clusterrole memcached-operator-memcached-viewer-role -o name
check "metrics Service (bundle object)" \
	kctl get service -n "${NS}" memcached-operator-controller-manager-metrics-service -o name
deployment_field() { jp deployment -n "$1" "${DEPLOYMENT}" -o "jsonpath=$2"; } # NS JSONPATH
deployment_image() { [[ "$(deployment_field "$1" '{.spec.template.spec.containers[0].image}')" == "$2" ]]; } # NS IMAGE
check "Deployment ${DEPLOYMENT} Available (kwok runs its pod)" \
	kctl wait --for=condition=Available --timeout="${TIMEOUT}s" -n "${NS}" "deployment/${DEPLOYMENT}"
pod_target_namespaces() { # NS
	[[ "$(jp pods -n "$1" -l control-plane=controller-manager \
		-o jsonpath='{.items[0].metadata.annotations.olm\.targetNamespaces}')" == "$1" ]]
}
check "operator pod annotated olm.targetNamespaces=${NS} (its WATCH_NAMESPACE)" pod_target_namespaces "${NS}"
watch_namespace_from_annotation() {
	[[ "$(deployment_field "${NS}" '{.spec.template.spec.containers[0].env[?(@.name=="WATCH_NAMESPACE")].valueFrom.fieldRef.fieldPath}')" \
		== "metadata.annotations['olm.targetNamespaces']" ]]
}
check "WATCH_NAMESPACE comes from metadata.annotations['olm.targetNamespaces']" watch_namespace_from_annotation
related_image_env() {
	[[ -n "$(deployment_field "${NS}" '{.spec.template.spec.containers[0].env[?(@.name=="RELATED_IMAGE_MEMCACHED")].value}')" ]]
}
check "RELATED_IMAGE_MEMCACHED set on the operator" related_image_env

log "install of ${PREV_CSV} through OLM took $((SECONDS - T0))s after the control plane was up"

# ---------------------------------------------------------------- the operator, as its pod would run
cp "${OPERATOR_BIN}" "${DIR}/memcached-operator" # the binary may be rebuilt meanwhile
declare -A OPERATOR_PID=()
# run_operator NS TAG : (re)start the operator for NS as its current pod would run: stops the
# previous process first (the old pod goes away), a fresh token of the ServiceAccount, the
# pod's olm.targetNamespaces as WATCH_NAMESPACE, the Deployment's RELATED_IMAGE_MEMCACHED.
run_operator() {
	local ns="$1" tag="$2" watch_ns related metrics_port health_port
	if [[ -n "${OPERATOR_PID[${ns}]:-}" ]]; then stop "${OPERATOR_PID[${ns}]}"; fi
	write_sa_kubeconfig "${ns}" "${SA}" "${DIR}/operator-${ns}.kubeconfig" 1h
	watch_ns="$(jp pods -n "${ns}" -l control-plane=controller-manager -o jsonpath='{.items[0].metadata.annotations.olm\.targetNamespaces}')"
	related="$(deployment_field "${ns}" '{.spec.template.spec.containers[0].env[?(@.name=="RELATED_IMAGE_MEMCACHED")].value}')"
	read -r metrics_port health_port <<<"$(free_ports 2)"
	start "operator-${ns}-${tag}" env KUBECONFIG="${DIR}/operator-${ns}.kubeconfig" POD_NAMESPACE="${ns}" \
		POD_NAME="olm-test-operator-${tag}" WATCH_NAMESPACE="${watch_ns}" RELATED_IMAGE_MEMCACHED="${related}" \
		"${DIR}/memcached-operator" --leader-elect --log-format=json --metrics-secure \
		--metrics-bind-address="127.0.0.1:${metrics_port}" --health-probe-bind-address="127.0.0.1:${health_port}"
	OPERATOR_PID[${ns}]="${REPLY}"
	check "operator (${tag}) ready in ${ns} as ${SA} (WATCH_NAMESPACE=${watch_ns})" \
		wait_until 60 curl -sf "http://127.0.0.1:${health_port}/readyz"
}
run_operator "${NS}" "${PREV_CSV}"
run_operator "${NS_MANUAL}" "${PREV_CSV}"

# The CSV's first alm-example, and a second Memcached of 2 pods, in each installed namespace;
# the alm-example also in NS_OTHER, which no OperatorGroup targets.
yq -c '.metadata.annotations."alm-examples" | fromjson | .[0]' "${CSV_FILE}" >"${DIR}/sample.json"
SAMPLE="$(jq -r '.metadata.name' "${DIR}/sample.json")"
jq '.metadata.name = "memcached-second" | .spec.size = 2' "${DIR}/sample.json" >"${DIR}/second.json"
for ns in "${NS}" "${NS_MANUAL}"; do
	kctl apply -n "${ns}" -f "${DIR}/sample.json" -f "${DIR}/second.json" >/dev/null
done
kctl apply -n "${NS_OTHER}" -f "${DIR}/sample.json" >/dev/null
for ns in "${NS}" "${NS_MANUAL}"; do
	check "Memcacheds ${SAMPLE} and memcached-second Available in ${ns} (${PREV_CSV})" \
		kctl wait --for=condition=Available --timeout="${TIMEOUT}s" -n "${ns}" "memcached/${SAMPLE}" memcached/memcached-second
done
check "their Deployments and Services exist" kctl get -n "${NS}" "deployment/${SAMPLE}" "service/${SAMPLE}" -o name
not_reconciled_elsewhere() {
	[[ -z "$(kctl get deployments -n "${NS_OTHER}" -o name)" &&
		-z "$(jp memcached -n "${NS_OTHER}" "${SAMPLE}" -o jsonpath='{.status.conditions}')" ]]
}
check "Memcached in ${NS_OTHER} (outside the OperatorGroups) left alone" not_reconciled_elsewhere
# The contrast for the least-privilege checks after the upgrade: the previous release's rules were
# all clusterPermissions.
AS="system:serviceaccount:${NS}:${SA}"
can() { [[ "$(kctl auth can-i --as="${AS}" "$@" 2>/dev/null)" == yes ]]; }
cannot() { [[ "$(kctl auth can-i --as="${AS}" "$@" 2>/dev/null)" == no ]]; }
check "under ${PREV_CSV} (clusterPermissions) ${SA} can list Deployments in ${NS_OTHER}" \
	can list deployments.apps -n "${NS_OTHER}"

# The state the upgrade must not disturb.
memcached_uids() { kctl get memcached -n "$1" -o jsonpath='{range .items[*]}{.metadata.name}={.metadata.uid}{"\n"}{end}' | sort; } # NS
pod_uids() { kctl get pods -n "$1" -l "${MEMCACHED_PODS}" -o jsonpath='{range .items[*]}{.metadata.name}={.metadata.uid}{"\n"}{end}' | sort; } # NS
deployment_generations() { kctl get deployments -n "$1" -l "${MEMCACHED_PODS}" -o jsonpath='{range .items[*]}{.metadata.name}={.metadata.generation}{"\n"}{end}' | sort; } # NS
all_pods_ready() { # NS : 2 Memcacheds of 3 + 2 pods, all Running
	[[ "$(kctl get pods -n "$1" -l "${MEMCACHED_PODS}" --field-selector=status.phase=Running -o name | wc -l)" == 5 ]]
}
for ns in "${NS}" "${NS_MANUAL}"; do
	check "5 memcached pods Running in ${ns}" wait_until "${TIMEOUT}" all_pods_ready "${ns}"
	memcached_uids "${ns}" >"${DIR}/memcacheds-${ns}.before"
	pod_uids "${ns}" >"${DIR}/pods-${ns}.before"
	deployment_generations "${ns}" >"${DIR}/generations-${ns}.before"
done

# Every Memcached's Available condition, every second, until the upgrades are over: a line for
# each sample that is not True (or a Memcached missing).
monitor() {
	local ns line
	while :; do
		for ns in "${NS}" "${NS_MANUAL}"; do
			line="$(kubectl --request-timeout=5s get memcached -n "${ns}" \
				-o jsonpath='{range .items[*]}{.metadata.name}={.status.conditions[?(@.type=="Available")].status} {end}' 2>&1)" ||
				{
					printf '%s %s ERROR %s\n' "$(date +%T)" "${ns}" "${line}"
					continue
				}
			printf '%s %s %s\n' "$(date +%T)" "${ns}" "${line}"
			[[ " ${line}" == *" ${SAMPLE}=True "* && " ${line}" == *" memcached-second=True "* ]] ||
				printf '%s %s NOT-AVAILABLE %s\n' "$(date +%T)" "${ns}" "${line}"
		done
		sleep 1
	done
}
start availability monitor
MONITOR_PID="${REPLY}"

# ---------------------------------------------------------------- phase 2: the upgrade
log "serving catalog/ (all releases) in place of the previous catalog"
OLD_IP_AUTO="${IP}"
stop "${OPM_PID}"
serve_catalog "${REPO_ROOT}/catalog" current
T_PUBLISH=$(now_ms)

# Automatic: OLM upgrades as soon as it sees the new release.
check "Subscription in ${NS} resolved to a new InstallPlan" wait_until "${TIMEOUT}" new_installplan "${NS}" "${OLD_IP_AUTO}"
IP_UP="$(installplan "${NS}")"
check "InstallPlan ${IP_UP:-?} installs ${CSV_NAME}" ip_installs "${NS}" "${IP_UP}" "${CSV_NAME}"
if wait_until "${TIMEOUT}" csv_succeeded "${NS}" "${CSV_NAME}"; then
	pass "CSV ${CSV_NAME} in ${NS} phase Succeeded (Automatic)"
	figure "Automatic: catalog with ${CSV_NAME} served -> CSV Succeeded in $(secs_since "${T_PUBLISH}") s"
else
	fail "CSV ${CSV_NAME} in ${NS} phase Succeeded (Automatic)"
fi

# Manual: the upgrade's InstallPlan waits; nothing moves until it is approved.
check "Manual Subscription in ${NS_MANUAL} resolved to a new InstallPlan" \
	wait_until "${TIMEOUT}" new_installplan "${NS_MANUAL}" "${IP_MANUAL}"
IP_MANUAL_UP="$(installplan "${NS_MANUAL}")"
check "InstallPlan ${IP_MANUAL_UP:-?} (${CSV_NAME}) waits for approval" \
	wait_until "${TIMEOUT}" ip_waits_for_approval "${NS_MANUAL}" "${IP_MANUAL_UP}"
check "InstallPlan ${IP_MANUAL_UP:-?} installs ${CSV_NAME}" ip_installs "${NS_MANUAL}" "${IP_MANUAL_UP}" "${CSV_NAME}"
sleep 5
still_previous() { csv_gone "${NS_MANUAL}" "${CSV_NAME}" && csv_succeeded "${NS_MANUAL}" "${PREV_CSV}"; }
check "unapproved: ${NS_MANUAL} still runs ${PREV_CSV} 5 s later, no ${CSV_NAME}" still_previous
T_APPROVE=$(now_ms)
check "InstallPlan ${IP_MANUAL_UP:-?} approved" approve "${NS_MANUAL}" "${IP_MANUAL_UP}"
if wait_until "${TIMEOUT}" csv_succeeded "${NS_MANUAL}" "${CSV_NAME}"; then
	pass "CSV ${CSV_NAME} in ${NS_MANUAL} phase Succeeded (Manual)"
	figure "Manual: InstallPlan approved -> CSV Succeeded in $(secs_since "${T_APPROVE}") s"
else
	fail "CSV ${CSV_NAME} in ${NS_MANUAL} phase Succeeded (Manual)"
fi

replaced() { # NS
	[[ "$(jp csv -n "$1" "${CSV_NAME}" -o jsonpath='{.spec.replaces}')" == "${PREV_CSV}" &&
		"$(jp subscription -n "$1" "${PACKAGE}" -o jsonpath='{.status.installedCSV}')" == "${CSV_NAME}" ]] &&
		csv_gone "$1" "${PREV_CSV}"
}
rolled() { # NS : the Deployment runs the new CSV's template, its one pod from it
	deployment_image "$1" "${IMAGE}" &&
		[[ "$(deployment_field "$1" '{.status.updatedReplicas}')" == 1 &&
			"$(deployment_field "$1" '{.status.replicas}')" == 1 ]]
}
for ns in "${NS}" "${NS_MANUAL}"; do
	check "${CSV_NAME} replaced ${PREV_CSV} in ${ns} (installedCSV; the old CSV removed)" wait_until "${TIMEOUT}" replaced "${ns}"
	check "Deployment ${DEPLOYMENT} in ${ns} rolled to ${IMAGE}" wait_until "${TIMEOUT}" rolled "${ns}"
	run_operator "${ns}" "${CSV_NAME}"
done

# The new operators have started: let them reconcile everything once, then compare.
T_RECONCILE=${SECONDS}
kctl apply -n "${NS}" -f - >/dev/null <<EOF
$(jq '.metadata.name = "memcached-after-upgrade" | .spec.size = 1' "${DIR}/sample.json")
EOF
check "operator (${CSV_NAME}) reconciles a new Memcached in ${NS}: Available" \
	kctl wait --for=condition=Available --timeout="${TIMEOUT}s" -n "${NS}" memcached/memcached-after-upgrade
sleep $((T_RECONCILE + 10 > SECONDS ? T_RECONCILE + 10 - SECONDS : 0))
stop "${MONITOR_PID}"
for ns in "${NS}" "${NS_MANUAL}"; do
	memcached_uids "${ns}" | grep -v '^memcached-after-upgrade=' >"${DIR}/memcacheds-${ns}.after" || true
	pod_uids "${ns}" | grep -v '^memcached-after-upgrade-' >"${DIR}/pods-${ns}.after" || true
	deployment_generations "${ns}" | grep -v '^memcached-after-upgrade=' >"${DIR}/generations-${ns}.after" || true
	check "no Memcached lost in ${ns} (same names and UIDs)" diff "${DIR}/memcacheds-${ns}.before" "${DIR}/memcacheds-${ns}.after"
	check "memcached pods not restarted in ${ns} (same pod UIDs)" diff "${DIR}/pods-${ns}.before" "${DIR}/pods-${ns}.after"
	check "memcached Deployments untouched in ${ns} (same generations)" diff "${DIR}/generations-${ns}.before" "${DIR}/generations-${ns}.after"
	figure "${ns}: Memcacheds before/after: $(wc -l <"${DIR}/memcacheds-${ns}.before")/$(wc -l <"${DIR}/memcacheds-${ns}.after"); memcached pod UIDs before/after: $(paste -sd' ' "${DIR}/pods-${ns}.before" | sed 's/[a-z0-9-]*=//g') / $(paste -sd' ' "${DIR}/pods-${ns}.after" | sed 's/[a-z0-9-]*=//g')"
done
samples="$(grep -c ' memcached-olm-' "${DIR}/logs/olm-availability.log" || true)"
always_available() { ! grep -E 'NOT-AVAILABLE|ERROR' "${DIR}/logs/olm-availability.log"; }
check "every Memcached Available throughout the upgrade (${samples} samples, 1 s apart)" always_available
figure "availability samples during the upgrades: ${samples}, not Available: $(grep -c NOT-AVAILABLE "${DIR}/logs/olm-availability.log" || true)"

# ---------------------------------------------------------------- monitoring (the new bundle's objects)
for kind in servicemonitor prometheusrule configmap; do
	name="memcached-operator-controller-manager-metrics-monitor"
	[[ "${kind}" != prometheusrule ]] || name=memcached-operator-alerts
	[[ "${kind}" != configmap ]] || name=memcached-operator-grafana-dashboard
	check "${kind} ${name} (bundle object) in ${NS}" kctl get "${kind}" -n "${NS}" "${name}" -o name
done
related_exporter_env() {
	[[ -n "$(deployment_field "${NS}" '{.spec.template.spec.containers[0].env[?(@.name=="RELATED_IMAGE_MEMCACHED_EXPORTER")].value}')" ]]
}
check "RELATED_IMAGE_MEMCACHED_EXPORTER set on the operator (${CSV_NAME})" related_exporter_env
check "${SA} can create ServiceMonitors in ${NS} (spec.monitoring)" can create servicemonitors.monitoring.coreos.com -n "${NS}"
check "${SA} cannot list ServiceMonitors in ${NS_OTHER}" cannot list servicemonitors.monitoring.coreos.com -n "${NS_OTHER}"

# ---------------------------------------------------------------- least privilege (the new CSV)
check "${SA} can list Deployments in ${NS}" can list deployments.apps -n "${NS}"
check "${SA} can patch Memcached status in ${NS}" can patch memcacheds.cache.example.com --subresource=status -n "${NS}"
check "${SA} cannot list Deployments in ${NS_OTHER} (permissions, not clusterPermissions)" \
	wait_until 60 cannot list deployments.apps -n "${NS_OTHER}"
check "${SA} cannot list Memcacheds in all namespaces" cannot list memcacheds.cache.example.com --all-namespaces
check "${SA} cannot list Pods in ${NS_OTHER}" cannot list pods -n "${NS_OTHER}"
check "${SA} can create TokenReviews (clusterPermissions: secure metrics)" can create tokenreviews.authentication.k8s.io
check "${SA} can create SubjectAccessReviews (clusterPermissions: secure metrics)" \
	can create subjectaccessreviews.authorization.k8s.io
check "Role and RoleBinding (permissions) owned by ${CSV_NAME}" owned_role_and_binding "${CSV_NAME}" "${NS}"
no_prev_cluster_rbac() { [[ -z "$(kctl get clusterrole,clusterrolebinding -l "olm.owner=${PREV_CSV}" -o name)" ]]; }
check "no ClusterRole or ClusterRoleBinding of ${PREV_CSV} left" wait_until 60 no_prev_cluster_rbac
check "Memcached in ${NS_OTHER} still left alone" not_reconciled_elsewhere
no_forbidden() { ! grep -i 'forbidden' "${DIR}"/logs/olm-operator-*.log; }
check "operator logs have no RBAC 'forbidden' errors" no_forbidden

# ---------------------------------------------------------------- phase 3: a fresh install
{
	operator_group "${NS_FRESH}"
	subscription "${NS_FRESH}" "${DEFAULT_CHANNEL}" Automatic
} | kctl apply -f - >/dev/null
T_FRESH=$(now_ms)
if wait_until "${TIMEOUT}" csv_succeeded "${NS_FRESH}" "${CSV_NAME}"; then
	pass "fresh Subscription to channel ${DEFAULT_CHANNEL} installs ${CSV_NAME}: Succeeded"
	figure "fresh install of ${CSV_NAME} (channel ${DEFAULT_CHANNEL}): Subscription -> CSV Succeeded in $(secs_since "${T_FRESH}") s"
else
	fail "fresh Subscription to channel ${DEFAULT_CHANNEL} installs ${CSV_NAME}: Succeeded"
fi

# ---------------------------------------------------------------- phase 4: without the monitoring CRDs
# What the README tells users: the bundle's ServiceMonitor and PrometheusRule need their CRDs, and
# OLM fails the InstallPlan without them.
kctl delete --wait=true -f "${MONITORING_CRDS}" >/dev/null
monitoring_api_gone() { ! kctl api-resources --api-group=monitoring.coreos.com -o name | grep -q .; }
check "ServiceMonitor and PrometheusRule CRDs removed" wait_until 60 monitoring_api_gone
{
	operator_group "${NS_NO_CRDS}"
	subscription "${NS_NO_CRDS}" "${DEFAULT_CHANNEL}" Automatic
} | kctl apply -f - >/dev/null
check "Subscription in ${NS_NO_CRDS} resolved to an InstallPlan" wait_until "${TIMEOUT}" has_installplan "${NS_NO_CRDS}"
IP_NO_CRDS="$(installplan "${NS_NO_CRDS}")"
ip_failed() { [[ "$(ip_phase "${NS_NO_CRDS}" "${IP_NO_CRDS}")" == Failed ]]; }
check "without the monitoring CRDs, InstallPlan ${IP_NO_CRDS:-?} fails" wait_until "${TIMEOUT}" ip_failed
figure "InstallPlan without the monitoring CRDs: $(jp installplan -n "${NS_NO_CRDS}" "${IP_NO_CRDS}" -o jsonpath='{.status.message} {.status.conditions[?(@.type=="Installed")].message}')"
# The steps before the failing one stay (the CSV), short of what it needs: no operator runs.
no_operator() {
	[[ "$(csv_phase "${NS_NO_CRDS}" "${CSV_NAME}")" != Succeeded ]] &&
		[[ -z "$(kctl get deployment -n "${NS_NO_CRDS}" -o name)" ]]
}
check "no operator Deployment in ${NS_NO_CRDS}, ${CSV_NAME} not Succeeded ($(csv_phase "${NS_NO_CRDS}" "${CSV_NAME}"))" no_operator

finish
