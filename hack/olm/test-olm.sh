#!/usr/bin/env bash
# Installs the operator through real OLM on the embedded local control plane, the way
# `operator-sdk run bundle` would, but without images or a container runtime:
#   - hack/cluster.sh up: etcd, kube-apiserver, controller-manager, scheduler, kwok (fake nodes)
#   - OLM's CRDs (the module's deploy/chart/crds), and OLM's own `olm` and
#     `catalog` operators run as processes against it (KUBECONFIG), built from the OLM module
#   - `opm serve catalog/` on 127.0.0.1 (the file-based catalog; its bundle carries its objects
#     inline, so no bundle image and no unpack Job are needed)
#   - CatalogSource (grpc, spec.address), OperatorGroup (OwnNamespace), Subscription
# and asserts: InstallPlan Complete, CSV Succeeded, and that OLM created the CRD, ServiceAccount,
# (Cluster)Roles and bindings, metrics Service, and the Deployment (whose pod kwok makes Ready),
# with WATCH_NAMESPACE fed from olm.targetNamespaces.
#
# Usage: hack/olm/test-olm.sh [DIR]   (default: .cluster/olm-test; cluster state and logs stay
#        there). Ends with "N passed, N failed"; exit 1 if anything failed. The cluster and every
#        process started here are stopped on exit (KEEP=1 leaves them running for inspection).
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
CATSRC=memcached-catalog
CSV_NAME="$(yq -r '.metadata.name' "${REPO_ROOT}/bundle/manifests/${PACKAGE}.clusterserviceversion.yaml")"
DEPLOYMENT="$(yq -r '.spec.install.spec.deployments[0].name' "${REPO_ROOT}/bundle/manifests/${PACKAGE}.clusterserviceversion.yaml")"
SA="$(yq -r '.spec.install.spec.deployments[0].spec.template.spec.serviceAccountName' "${REPO_ROOT}/bundle/manifests/${PACKAGE}.clusterserviceversion.yaml")"
IMAGE="$(yq -r '.spec.install.spec.deployments[0].spec.template.spec.containers[0].image' "${REPO_ROOT}/bundle/manifests/${PACKAGE}.clusterserviceversion.yaml")"
DEFAULT_CHANNEL="$(yq -r 'select(.schema == "olm.package") | .defaultChannel' "${REPO_ROOT}/catalog/${PACKAGE}/package.yaml")"

LOG_TAG=olm/test-olm
# shellcheck source=hack/lib.sh
source "${OLM_HACK_DIR}/../lib.sh"

PASSED=0 FAILED=0
pass() {
	PASSED=$((PASSED + 1))
	printf 'PASS  %s\n' "$*"
}
fail() {
	FAILED=$((FAILED + 1))
	printf 'FAIL  %s\n' "$*"
}
check() { # DESCRIPTION CMD... : pass if CMD succeeds (its output goes to DIR/logs/olm-checks.log)
	local desc="$1"
	shift
	printf '== %s\n' "${desc}" >>"${DIR}/logs/olm-checks.log"
	if "$@" >>"${DIR}/logs/olm-checks.log" 2>&1; then pass "${desc}"; else fail "${desc}"; fi
}
# wait_until TIMEOUT CMD... : retry CMD every second until it succeeds or TIMEOUT seconds pass.
wait_until() {
	local deadline=$((SECONDS + $1))
	shift
	until "$@" >/dev/null 2>&1; do
		[[ ${SECONDS} -lt ${deadline} ]] || return 1
		sleep 1
	done
}

port_free() { python3 -c 'import socket,sys; s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(("", int(sys.argv[1]))); s.close()' "$1" 2>/dev/null; }

# ---------------------------------------------------------------- processes started here
PIDS=()
CLUSTER_UP=0
cleanup() {
	local rc=$? pid
	if [[ "${KEEP:-0}" == 1 ]]; then
		log "KEEP=1: leaving the cluster in ${DIR} and pids ${PIDS[*]:-} running (hack/cluster.sh down ${DIR})"
		return "${rc}"
	fi
	for pid in "${PIDS[@]}"; do kill "${pid}" 2>/dev/null || true; done
	for pid in "${PIDS[@]}"; do wait "${pid}" 2>/dev/null || true; done
	if [[ ${CLUSTER_UP} == 1 ]]; then "${REPO_ROOT}/hack/cluster.sh" down "${DIR}" >&2 || true; fi
	return "${rc}"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM HUP

start() { # NAME CMD... : run CMD in the background, output to DIR/logs/olm-NAME.log
	local name="$1"
	shift
	"$@" >"${DIR}/logs/olm-${name}.log" 2>&1 &
	PIDS+=($!)
	log "started ${name} (pid $!, log ${DIR}/logs/olm-${name}.log)"
}

kctl() { kubectl --request-timeout=20s "$@"; }
jp() { kctl get "$@" 2>/dev/null; } # RESOURCE... -o jsonpath=... : empty on error

# ---------------------------------------------------------------- setup
for p in 8080 8443; do port_free "${p}" || die "port ${p} is in use (OLM's operators bind it; stop whatever holds it)"; done
[[ -f "${REPO_ROOT}/catalog/${PACKAGE}/package.yaml" ]] || die "catalog/${PACKAGE}/package.yaml not found: run make catalog"

OPM="${OPM:-$("${OLM_HACK_DIR}/build-tools.sh" --path opm)}"
OLM_DIR="${OLM_DIR:-$("${OLM_HACK_DIR}/build-tools.sh" --path olm)}"

"${REPO_ROOT}/hack/cluster.sh" up "${DIR}" >&2
CLUSTER_UP=1
# shellcheck disable=SC1091 # written by cluster.sh
source "${DIR}/env"
export KUBECONFIG
T0=${SECONDS}

log "applying OLM's CRDs"
kctl apply --server-side --field-manager=test-olm -f "${OLM_DIR}/crds.yaml" >/dev/null
check "OLM CRDs established" \
	kctl wait --for=condition=Established --timeout="${TIMEOUT}s" -f "${OLM_DIR}/crds.yaml"
kctl create namespace "${OLM_NS}" >/dev/null

# OLM's operators, out of cluster, with the flags of its quickstart Deployments. The catalog
# operator gets a TLS pair so that it serves health on :8443 and does not collide with olm's :8080.
openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj "/CN=localhost" \
	-keyout "${DIR}/olm-tls.key" -out "${DIR}/olm-tls.crt" 2>/dev/null
start olm env OPERATOR_NAMESPACE="${OLM_NS}" OPERATOR_NAME=olm-operator \
	"${OLM_DIR}/olm" --namespace "${OLM_NS}" --writeStatusName "" --writePackageServerStatusName ""
start catalog "${OLM_DIR}/catalog" --namespace "${OLM_NS}" --writeStatusName "" \
	--tls-cert "${DIR}/olm-tls.crt" --tls-key "${DIR}/olm-tls.key"
check "olm operator healthy (:8080/healthz)" wait_until 60 curl -sf http://127.0.0.1:8080/healthz
check "catalog operator healthy (:8443/healthz)" wait_until 60 curl -sfk https://127.0.0.1:8443/healthz

read -r GRPC_PORT PPROF_PORT <<<"$(free_ports 2)"
# As in catalog.Dockerfile: build the serve cache first (--cache-only), then serve from it.
rm -rf "${DIR}/opm-cache"
check "opm serve --cache-only builds the catalog's cache" \
	"${OPM}" serve "${REPO_ROOT}/catalog" --cache-dir "${DIR}/opm-cache" --cache-only \
	--pprof-addr "127.0.0.1:${PPROF_PORT}" --termination-log "${DIR}/logs/opm-termination.log"
start opm "${OPM}" serve "${REPO_ROOT}/catalog" --port "${GRPC_PORT}" --cache-dir "${DIR}/opm-cache" \
	--pprof-addr "127.0.0.1:${PPROF_PORT}" --termination-log "${DIR}/logs/opm-termination.log"
check "opm serve catalog/ listening on 127.0.0.1:${GRPC_PORT}" \
	wait_until 60 python3 -c 'import socket,sys; socket.create_connection(("127.0.0.1", int(sys.argv[1])), 1)' "${GRPC_PORT}"

# ---------------------------------------------------------------- install through OLM
log "creating CatalogSource, OperatorGroup and Subscription"
kctl apply -f - >/dev/null <<EOF
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
---
apiVersion: v1
kind: Namespace
metadata:
  name: ${NS}
---
apiVersion: operators.coreos.com/v1
kind: OperatorGroup
metadata:
  name: ${PACKAGE}
  namespace: ${NS}
spec:
  targetNamespaces:
  - ${NS}
---
apiVersion: operators.coreos.com/v1alpha1
kind: Subscription
metadata:
  name: ${PACKAGE}
  namespace: ${NS}
spec:
  name: ${PACKAGE}
  channel: ${DEFAULT_CHANNEL}
  source: ${CATSRC}
  sourceNamespace: ${OLM_NS}
  installPlanApproval: Automatic
EOF

catsrc_ready() { [[ "$(jp catalogsource -n "${OLM_NS}" "${CATSRC}" -o jsonpath='{.status.connectionState.lastObservedState}')" == READY ]]; }
check "CatalogSource ${CATSRC} connection READY" wait_until "${TIMEOUT}" catsrc_ready

installplan() { jp subscription -n "${NS}" "${PACKAGE}" -o jsonpath='{.status.installPlanRef.name}'; }
has_installplan() { [[ -n "$(installplan)" ]]; }
check "Subscription resolved to an InstallPlan" wait_until "${TIMEOUT}" has_installplan
IP="$(installplan)"
ip_complete() { [[ "$(jp installplan -n "${NS}" "${IP}" -o jsonpath='{.status.phase}')" == Complete ]]; }
check "InstallPlan ${IP:-?} phase Complete" wait_until "${TIMEOUT}" ip_complete
ip_installs_csv() { [[ " $(jp installplan -n "${NS}" "${IP}" -o jsonpath='{.spec.clusterServiceVersionNames[*]}') " == *" ${CSV_NAME} "* ]]; }
check "InstallPlan installs ${CSV_NAME}" ip_installs_csv
no_jobs() { [[ -z "$(kctl get jobs -A -o name)" ]]; }
check "no bundle unpack Job (bundle objects inline in the catalog)" no_jobs

csv_succeeded() { [[ "$(jp csv -n "${NS}" "${CSV_NAME}" -o jsonpath='{.status.phase}')" == Succeeded ]]; }
check "CSV ${CSV_NAME} phase Succeeded" wait_until "${TIMEOUT}" csv_succeeded

# ---------------------------------------------------------------- what OLM created
check "CRD memcacheds.cache.example.com created and Established" \
	kctl wait --for=condition=Established --timeout=10s crd/memcacheds.cache.example.com
check "ServiceAccount ${SA}" kctl get serviceaccount -n "${NS}" "${SA}" -o name
owned() { # KIND [-n NS] : some object of KIND that OLM labelled as owned by the CSV exists
	# Not `| grep -q .`: under pipefail, grep leaving early makes kubectl die of SIGPIPE when
	# there is more than one object.
	[[ -n "$(kctl get "$@" -l "olm.owner=${CSV_NAME}" -o name)" ]]
}
owned_role_and_binding() { owned role -n "${NS}" && owned rolebinding -n "${NS}"; }
check "Role and RoleBinding (permissions: leases) owned by the CSV" owned_role_and_binding
owned_clusterrole_and_binding() { owned clusterrole && owned clusterrolebinding; }
check "ClusterRole and ClusterRoleBinding (clusterPermissions) owned by the CSV" owned_clusterrole_and_binding
check "ClusterRole memcached-operator-memcached-viewer-role (bundle object)" \
	kctl get clusterrole memcached-operator-memcached-viewer-role -o name
check "metrics Service (bundle object)" \
	kctl get service -n "${NS}" memcached-operator-controller-manager-metrics-service -o name
deployment_field() { jp deployment -n "${NS}" "${DEPLOYMENT}" -o "jsonpath=$1"; }
deployment_image() { [[ "$(deployment_field '{.spec.template.spec.containers[0].image}')" == "${IMAGE}" ]]; }
check "Deployment ${DEPLOYMENT} runs image ${IMAGE}" deployment_image
check "Deployment ${DEPLOYMENT} Available (kwok runs its pod)" \
	kctl wait --for=condition=Available --timeout="${TIMEOUT}s" -n "${NS}" "deployment/${DEPLOYMENT}"
pod_target_namespaces() {
	[[ "$(jp pods -n "${NS}" -l control-plane=controller-manager \
		-o jsonpath='{.items[0].metadata.annotations.olm\.targetNamespaces}')" == "${NS}" ]]
}
check "operator pod annotated olm.targetNamespaces=${NS} (its WATCH_NAMESPACE)" pod_target_namespaces
watch_namespace_from_annotation() {
	[[ "$(deployment_field '{.spec.template.spec.containers[0].env[?(@.name=="WATCH_NAMESPACE")].valueFrom.fieldRef.fieldPath}')" \
		== "metadata.annotations['olm.targetNamespaces']" ]]
}
check "WATCH_NAMESPACE comes from metadata.annotations['olm.targetNamespaces']" watch_namespace_from_annotation
related_image_env() {
	[[ -n "$(deployment_field '{.spec.template.spec.containers[0].env[?(@.name=="RELATED_IMAGE_MEMCACHED")].value}')" ]]
}
check "RELATED_IMAGE_MEMCACHED set on the operator" related_image_env

log "install through OLM took $((SECONDS - T0))s after the control plane was up"

# ---------------------------------------------------------------- the operator with OLM's RBAC
# kwok runs no containers, so run the operator binary as a process instead of the pod, as the
# ServiceAccount OLM created, with the environment the pod gets (WATCH_NAMESPACE resolved from the
# pod's olm.targetNamespaces annotation): proves the CSV's permissions are enough and the
# OperatorGroup scopes what it watches. Skipped when the binary is not built (cargo build --release).
OPERATOR_BIN="${OPERATOR_BIN:-${REPO_ROOT}/target/release/memcached-operator}"
if [[ ! -x "${OPERATOR_BIN}" ]]; then
	printf 'SKIP  the operator under OLM-granted RBAC (%s not built)\n' "${OPERATOR_BIN}"
else
	cp "${OPERATOR_BIN}" "${DIR}/memcached-operator" # the binary may be rebuilt meanwhile
	write_sa_kubeconfig "${NS}" "${SA}" "${DIR}/operator.kubeconfig" 1h
	watch_ns="$(jp pods -n "${NS}" -l control-plane=controller-manager -o jsonpath='{.items[0].metadata.annotations.olm\.targetNamespaces}')"
	related="$(deployment_field '{.spec.template.spec.containers[0].env[?(@.name=="RELATED_IMAGE_MEMCACHED")].value}')"
	read -r METRICS_PORT HEALTH_PORT <<<"$(free_ports 2)"
	start operator env KUBECONFIG="${DIR}/operator.kubeconfig" POD_NAMESPACE="${NS}" POD_NAME=olm-test-operator \
		WATCH_NAMESPACE="${watch_ns}" RELATED_IMAGE_MEMCACHED="${related}" \
		"${DIR}/memcached-operator" --leader-elect --log-format=json --metrics-secure \
		--metrics-bind-address="127.0.0.1:${METRICS_PORT}" --health-probe-bind-address="127.0.0.1:${HEALTH_PORT}"
	check "operator ready as ${SA} (WATCH_NAMESPACE=${watch_ns})" \
		wait_until 60 curl -sf "http://127.0.0.1:${HEALTH_PORT}/readyz"
	# The CSV's first alm-example, in the watched namespace and in one it must ignore.
	yq -c '.metadata.annotations."alm-examples" | fromjson | .[0]' \
		"${REPO_ROOT}/bundle/manifests/${PACKAGE}.clusterserviceversion.yaml" >"${DIR}/sample.json"
	SAMPLE="$(jq -r '.metadata.name' "${DIR}/sample.json")"
	kctl create namespace "${NS}-other" >/dev/null
	kctl apply -n "${NS}" -f "${DIR}/sample.json" >/dev/null
	kctl apply -n "${NS}-other" -f "${DIR}/sample.json" >/dev/null
	check "Memcached ${SAMPLE} (alm-examples) Available" \
		kctl wait --for=condition=Available --timeout="${TIMEOUT}s" -n "${NS}" "memcached/${SAMPLE}"
	check "its Deployment and Service exist" kctl get -n "${NS}" "deployment/${SAMPLE}" "service/${SAMPLE}" -o name
	not_reconciled_elsewhere() {
		[[ -z "$(kctl get deployments -n "${NS}-other" -o name)" &&
			-z "$(jp memcached -n "${NS}-other" "${SAMPLE}" -o jsonpath='{.status.conditions}')" ]]
	}
	check "Memcached in ${NS}-other (outside the OperatorGroup) left alone" not_reconciled_elsewhere
	no_forbidden() { ! grep -qi 'forbidden' "${DIR}/logs/olm-operator.log"; }
	check "operator log has no RBAC 'forbidden' errors" no_forbidden
fi
if [[ ${FAILED} -gt 0 ]]; then
	log "diagnostics:"
	kctl get catalogsource,subscription,installplan,csv -A >&2 || true
	kctl get deployment,pods -n "${NS}" >&2 || true
	tail -n 20 "${DIR}"/logs/olm-*.log >&2 || true
fi
echo "${PASSED} passed, ${FAILED} failed"
[[ ${FAILED} -eq 0 ]]
