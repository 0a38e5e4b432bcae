#!/usr/bin/env bash
# Keeps one component of a local cluster running, as the kubelet keeps a static pod running:
#   hack/supervise.sh DIR COMPONENT CMD...
# Runs CMD with its output appended to DIR/logs/COMPONENT.log and its pid in
# DIR/pids/COMPONENT.pid; when CMD exits, logs it (also to DIR/logs/restarts.log) and starts it
# again after a back-off that doubles from RESTART_BACKOFF (1 s) to RESTART_BACKOFF_MAX (60 s)
# and resets once the component has run for RESTART_BACKOFF_MAX. `cluster.sh down` creates
# DIR/pids/stopping first, after which nothing is restarted.
set -uo pipefail

DIR="$1" COMPONENT="$2"
shift 2
LOG="${DIR}/logs/${COMPONENT}.log"
PIDFILE="${DIR}/pids/${COMPONENT}.pid"
STOPPING="${DIR}/pids/stopping"
initial="${RESTART_BACKOFF:-1}" max="${RESTART_BACKOFF_MAX:-60}"
backoff="${initial}" restarts=0 child=""

note() {
	local line
	line="$(date -u +%FT%TZ) [supervise] ${COMPONENT}: $*"
	printf '%s\n' "${line}" >>"${LOG}"
	printf '%s\n' "${line}" >>"${DIR}/logs/restarts.log"
}

# A TERM for the supervisor (down) ends it without touching the component: down stops that.
trap 'exit 0' TERM INT

while :; do
	started=${SECONDS}
	"$@" </dev/null >>"${LOG}" 2>&1 &
	child=$!
	printf '%s\n' "${child}" >"${PIDFILE}"
	wait "${child}"
	rc=$?
	[[ -e "${STOPPING}" ]] && exit 0
	if ((SECONDS - started >= max)); then backoff="${initial}"; fi
	restarts=$((restarts + 1))
	note "exited with status ${rc}; restart ${restarts} in ${backoff}s"
	sleep "${backoff}" &
	wait $!
	[[ -e "${STOPPING}" ]] && exit 0
	backoff=$((backoff * 2 > max ? max : backoff * 2))
done
