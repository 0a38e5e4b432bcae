#!/usr/bin/env bash
# Builds the controller-runtime reference operator once per source version and prints its path.
# Cached under ${MEMCACHED_OPERATOR_CACHE:-$HOME/.cache/memcached-operator}/bin, keyed by a hash of
# this directory's Go sources and module files.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cache="${MEMCACHED_OPERATOR_CACHE:-${HOME}/.cache/memcached-operator}/bin"
key="$(cat "${here}"/go.mod "${here}"/go.sum "${here}"/*.go | sha256sum | cut -c1-12)"
bin="${cache}/memcached-reference-go-${key}"
if [[ ! -x "${bin}" ]]; then
	mkdir -p "${cache}"
	echo "building the controller-runtime reference operator (one time per source version)" >&2
	(cd "${here}" && CGO_ENABLED=0 go build -trimpath -ldflags=-s -o "${bin}.tmp" .)
	mv "${bin}.tmp" "${bin}"
fi
echo "${bin}"
