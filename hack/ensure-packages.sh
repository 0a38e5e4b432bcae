#!/usr/bin/env bash
# hack/ensure-packages.sh PKG... : install the Debian packages that are missing (root), e.g.
# prometheus for promtool in `make test-unit`. Without root, a missing package is an error that
# names it.
set -euo pipefail
# shellcheck source=hack/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
LOG_TAG=packages
ensure_packages "$@"
