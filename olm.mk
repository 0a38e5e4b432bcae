# OLM packaging: bundle, file-based catalog, their images, and the offline checks.
# Included by the Makefile (`include olm.mk`). Targets and variables follow operator-sdk's
# scaffolded Makefile. Tools are built from Go modules into
# $(MEMCACHED_OPERATOR_CACHE)/bin/<tool>-<version>/ (pins: hack/olm/versions.env).

# OPERATOR_SDK_VERSION, OPM_VERSION, OLM_VERSION, BUNDLE_VERSION, BUNDLE_CREATED_AT,
# BUNDLE_REPLACES, BUNDLE_SKIP_RANGE_MIN, BUNDLE_CHANNELS, BUNDLE_DEFAULT_CHANNEL.
include hack/olm/versions.env

# The bundle's version (CSV memcached-operator.v$(VERSION)).
VERSION ?= $(BUNDLE_VERSION)
# Image names carry no registry: set IMAGE_TAG_BASE (or IMG, BUNDLE_IMG, CATALOG_IMG) to push.
IMAGE_TAG_BASE ?= memcached-operator
IMG ?= $(IMAGE_TAG_BASE):$(VERSION)
BUNDLE_IMG ?= $(IMAGE_TAG_BASE)-bundle:v$(VERSION)
CATALOG_IMG ?= $(IMAGE_TAG_BASE)-catalog:v$(VERSION)
CONTAINER_TOOL ?= docker
# The version it upgrades from (CSV spec.replaces) and the bottom of its olm.skipRange.
REPLACES ?= $(BUNDLE_REPLACES)
SKIP_RANGE_MIN ?= $(BUNDLE_SKIP_RANGE_MIN)
CHANNELS ?= $(BUNDLE_CHANNELS)
DEFAULT_CHANNEL ?= $(BUNDLE_DEFAULT_CHANNEL)
# The CSV's createdAt: pinned so that `make bundle` is reproducible (bump it with VERSION).
CREATED_AT ?= $(BUNDLE_CREATED_AT)

OLM_TOOLS_CACHE := $(or $(MEMCACHED_OPERATOR_CACHE),$(HOME)/.cache/memcached-operator)/bin
OPERATOR_SDK ?= $(OLM_TOOLS_CACHE)/operator-sdk-$(OPERATOR_SDK_VERSION)/operator-sdk
OPM ?= $(OLM_TOOLS_CACHE)/opm-$(OPM_VERSION)/opm
SCORECARD_TEST ?= $(OLM_TOOLS_CACHE)/scorecard-test-$(OPERATOR_SDK_VERSION)/scorecard-test
# Base and builder image of catalog.Dockerfile (`opm generate dockerfile`).
OPM_IMAGE ?= operator-framework/opm:$(OPM_VERSION)

# What the bundle scripts read from the environment.
OLM_BUNDLE_ENV = VERSION=$(VERSION) IMG=$(IMG) CHANNELS=$(CHANNELS) DEFAULT_CHANNEL=$(DEFAULT_CHANNEL) \
	CREATED_AT=$(CREATED_AT) REPLACES=$(REPLACES) SKIP_RANGE_MIN=$(SKIP_RANGE_MIN) OPERATOR_SDK=$(OPERATOR_SDK)

##@ OLM bundle and catalog

.PHONY: operator-sdk
operator-sdk: ## Build operator-sdk from its Go module (cached); print its path.
	@if [ "$(OPERATOR_SDK)" = "$(OLM_TOOLS_CACHE)/operator-sdk-$(OPERATOR_SDK_VERSION)/operator-sdk" ]; then \
		hack/olm/build-tools.sh --path operator-sdk; else echo "$(OPERATOR_SDK)"; fi

.PHONY: opm
opm: ## Build opm from its Go module (cached); print its path.
	@if [ "$(OPM)" = "$(OLM_TOOLS_CACHE)/opm-$(OPM_VERSION)/opm" ]; then \
		hack/olm/build-tools.sh --path opm; else echo "$(OPM)"; fi

.PHONY: scorecard-test
scorecard-test: ## Build operator-sdk's scorecard-test program (cached); print its path.
	@if [ "$(SCORECARD_TEST)" = "$(OLM_TOOLS_CACHE)/scorecard-test-$(OPERATOR_SDK_VERSION)/scorecard-test" ]; then \
		hack/olm/build-tools.sh --path scorecard-test; else echo "$(SCORECARD_TEST)"; fi

# bundle.Dockerfile's LABELs against bundle/metadata/annotations.yaml, and that the check finds a
# disagreement (tests/bundle; its scorecard test is make scorecard-static's).
CHECK_BUNDLE_DOCKERFILE = $(CARGO_TEST) --quiet --test bundle -- --skip the_scorecards_built_in_tests

.PHONY: bundle
bundle: operator-sdk ## Regenerate bundle/ and bundle.Dockerfile from config/ (operator-sdk generate bundle), then validate.
	$(OLM_BUNDLE_ENV) hack/olm/bundle.sh
	$(CHECK_BUNDLE_DOCKERFILE)

.PHONY: bundle-validate
bundle-validate: operator-sdk ## operator-sdk bundle validate ./bundle --select-optional suite=operatorframework.
	$(OPERATOR_SDK) bundle validate ./bundle --select-optional suite=operatorframework
	$(CHECK_BUNDLE_DOCKERFILE)

.PHONY: scorecard-static
scorecard-static: scorecard-test ## Run the scorecard's built-in (static) tests on bundle/ offline.
	SCORECARD_TEST=$(SCORECARD_TEST) $(CARGO_TEST) --test bundle -- --nocapture the_scorecards_built_in_tests

.PHONY: bundle-check
bundle-check: operator-sdk opm ## Fail if bundle/, bundle.Dockerfile, catalog/ or catalog.Dockerfile drift from config/.
	$(OLM_BUNDLE_ENV) hack/olm/bundle.sh --check
	$(CHECK_BUNDLE_DOCKERFILE)
	OPM=$(OPM) OPM_IMAGE=$(OPM_IMAGE) CHANNELS=$(CHANNELS) DEFAULT_CHANNEL=$(DEFAULT_CHANNEL) hack/olm/catalog.sh --check

.PHONY: bundle-build
bundle-build: ## Build the bundle image (bundle.Dockerfile).
	$(CONTAINER_TOOL) build -f bundle.Dockerfile -t $(BUNDLE_IMG) .

.PHONY: bundle-push
bundle-push: ## Push the bundle image.
	$(CONTAINER_TOOL) push $(BUNDLE_IMG)

.PHONY: catalog
catalog: opm ## Update catalog/ (every release; bundle/ rendered, its channel entries set) and catalog.Dockerfile; opm validate.
	OPM=$(OPM) OPM_IMAGE=$(OPM_IMAGE) CHANNELS=$(CHANNELS) DEFAULT_CHANNEL=$(DEFAULT_CHANNEL) hack/olm/catalog.sh

.PHONY: catalog-build
catalog-build: ## Build the catalog image (catalog.Dockerfile: opm serve of catalog/).
	$(CONTAINER_TOOL) build -f catalog.Dockerfile -t $(CATALOG_IMG) .

.PHONY: catalog-push
catalog-push: ## Push the catalog image.
	$(CONTAINER_TOOL) push $(CATALOG_IMG)

.PHONY: olm-check
olm-check: bundle-check bundle-validate scorecard-static ## Offline OLM checks: drift, validate, scorecard static tests.

.PHONY: olm
olm: ## Build OLM's olm and catalog operators from the OLM Go module (cached); print their directory.
	@hack/olm/build-tools.sh --path olm

.PHONY: test-digests
test-digests: operator-sdk ## A release bundle pinned by digest: images pushed to a registry on 127.0.0.1, make bundle USE_IMAGE_DIGESTS=true, every CSV image by digest (root; tests/olm/digests.rs).
	$(CARGO_TEST) --test olm -- --test-threads=1 --nocapture digests::

.PHONY: test-run-bundle
test-run-bundle: ## On a local control plane with a real node (root): operator-sdk run bundle, run bundle-upgrade, scorecard and cleanup with images from a registry on 127.0.0.1; the catalog image through OLM (tests/olm/run_bundle.rs).
	SUITE=olm REAL_NODE=1 NODES=0 hack/e2e.sh run_bundle --nocapture

.PHONY: test-olm
test-olm: opm ## Through real OLM on a local control plane: install the previous release (its own operator, built from its commit), upgrade to bundle/'s (automatic, manual), least privilege; tear down.
	OLM_DIR="$$(hack/olm/build-tools.sh --path olm)" && \
		OPM=$(OPM) OLM_DIR="$$OLM_DIR" SUITE=olm hack/e2e.sh install_and_upgrade --nocapture
