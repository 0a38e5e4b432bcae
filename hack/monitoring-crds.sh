#!/usr/bin/env bash
# hack/monitoring-crds.sh : prints the directory holding the prometheus-operator's ServiceMonitor
# and PrometheusRule CRDs (monitoring.coreos.com/v1), copied once from its Go module
# (PROMETHEUS_OPERATOR_VERSION in hack/versions.env, example/prometheus-operator-crd/) into
# $MEMCACHED_OPERATOR_CACHE/crds/prometheus-operator-<version>/. The e2e suite and the OLM test
# install them; the operator itself never does.
set -euo pipefail

HACK_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CACHE_DIR="${MEMCACHED_OPERATOR_CACHE:-${HOME}/.cache/memcached-operator}"
LOG_TAG=monitoring-crds
# shellcheck source=hack/lib.sh
source "${HACK_DIR}/lib.sh"
# shellcheck disable=SC1091 # plain KEY=VALUE pins
source "${HACK_DIR}/versions.env"
GO="${GO:-go}"
if ! command -v "${GO}" >/dev/null && [[ -x /usr/local/go/bin/go ]]; then GO=/usr/local/go/bin/go; fi

CRDS=(monitoring.coreos.com_servicemonitors.yaml monitoring.coreos.com_prometheusrules.yaml)
BIN_ROOT="${CACHE_DIR}/crds"
dest="${BIN_ROOT}/prometheus-operator-${PROMETHEUS_OPERATOR_VERSION}"
if ! is_fresh "${dest}" "${PROMETHEUS_OPERATOR_VERSION}" "${CRDS[@]}"; then
	mkdir -p "${BIN_ROOT}"
	exec 9>"${BIN_ROOT}/.lock"
	flock 9
	if ! is_fresh "${dest}" "${PROMETHEUS_OPERATOR_VERSION}" "${CRDS[@]}"; then
		src="$(module_field "github.com/prometheus-operator/prometheus-operator@${PROMETHEUS_OPERATOR_VERSION}" Dir)"
		tmp="$(new_tmp .tmp.crds copy)"
		for f in "${CRDS[@]}"; do
			cp "${src}/example/prometheus-operator-crd/${f}" "${tmp}/${f}"
		done
		chmod u+w "${tmp}"/*.yaml
		printf '%s' "${PROMETHEUS_OPERATOR_VERSION}" >"${tmp}/.stamp"
		install_dir .tmp.crds "${tmp}" "${dest}"
		log "copied ${CRDS[*]} from prometheus-operator ${PROMETHEUS_OPERATOR_VERSION}"
	fi
	flock -u 9
fi
printf '%s\n' "${dest}"
