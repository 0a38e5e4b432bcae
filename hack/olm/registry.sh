#!/usr/bin/env bash
# A throwaway image registry on 127.0.0.1 (Debian's docker-registry, the CNCF distribution
# registry), and pushes of the OCI archives hack/images.sh builds into it with skopeo. Plain
# HTTP by default: go-containerregistry (operator-sdk's digest resolver) and containerd take a
# loopback registry as plain HTTP; skopeo is told so. With --tls it serves HTTPS with a
# self-signed certificate for 127.0.0.1, DIR/ca.crt, for clients that never try plain HTTP
# (operator-sdk run bundle's index image lookup): Go programs trust it with SSL_CERT_FILE.
#
#   hack/olm/registry.sh start DIR [--tls]  start one with its storage and pid in DIR; prints host:port
#   hack/olm/registry.sh push ARCHIVE REF  push an OCI archive as REF (host:port/name:tag)
#   hack/olm/registry.sh digest REF      the manifest digest the registry serves for REF
#   hack/olm/registry.sh stop DIR        stop the one started in DIR
#
# Root installs what is missing (docker-registry, skopeo) with apt-get.
set -euo pipefail

OLM_HACK_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
LOG_TAG=olm/registry
# shellcheck source=hack/lib.sh
source "${OLM_HACK_DIR}/../lib.sh"

start() {
	local dir="$1" tls="${2:-}" port pid scheme=http
	ensure_packages docker-registry skopeo
	mkdir -p "${dir}/storage"
	port="$(free_ports 1)"
	cat >"${dir}/config.yml" <<EOF
version: 0.1
log:
  level: warn
storage:
  filesystem:
    rootdirectory: ${dir}/storage
  delete:
    enabled: true
http:
  addr: 127.0.0.1:${port}
EOF
	if [[ "${tls}" == --tls ]]; then
		scheme=https
		openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj "/CN=127.0.0.1" \
			-addext "subjectAltName=IP:127.0.0.1" -keyout "${dir}/tls.key" -out "${dir}/ca.crt" 2>/dev/null
		printf '  tls:\n    certificate: %s\n    key: %s\n' "${dir}/ca.crt" "${dir}/tls.key" >>"${dir}/config.yml"
	fi
	docker-registry serve "${dir}/config.yml" >"${dir}/registry.log" 2>&1 &
	pid=$!
	echo "${pid}" >"${dir}/pid"
	for _ in $(seq 100); do
		if curl -fsS ${tls:+--cacert "${dir}/ca.crt"} "${scheme}://127.0.0.1:${port}/v2/" >/dev/null 2>&1; then
			log "registry at ${scheme}://127.0.0.1:${port} (pid ${pid}, storage ${dir}/storage)"
			echo "127.0.0.1:${port}"
			return
		fi
		kill -0 "${pid}" 2>/dev/null || die "registry exited: $(tail -5 "${dir}/registry.log")"
		sleep 0.1
	done
	die "registry did not answer on 127.0.0.1:${port} in 10 s"
}

push() {
	local archive="$1" ref="$2"
	[[ -f "${archive}" ]] || die "no archive ${archive}"
	skopeo copy --quiet --dest-tls-verify=false "oci-archive:${archive}" "docker://${ref}" >&2
	log "pushed ${archive##*/} as ${ref}"
}

digest() {
	skopeo inspect --tls-verify=false --format '{{.Digest}}' "docker://$1"
}

stop() {
	local dir="$1" pid
	[[ -f "${dir}/pid" ]] || return 0
	pid="$(cat "${dir}/pid")"
	kill "${pid}" 2>/dev/null || true
	for _ in $(seq 50); do
		kill -0 "${pid}" 2>/dev/null || break
		sleep 0.1
	done
	rm -f "${dir}/pid"
}

case "${1:-}" in
start) start "$2" "${3:-}" ;;
push) push "$2" "$3" ;;
digest) digest "$2" ;;
stop) stop "$2" ;;
*) die "usage: $0 start DIR [--tls] | push ARCHIVE REF | digest REF | stop DIR" ;;
esac
