# csi-provisioner: a CSI provisioner sidecar with its own PV/PVC binder.
# `make help` lists the targets. Every tool is pinned in hack/tools/versions.env
# and built from the Go module proxy into ${XDG_CACHE_HOME:-$HOME/.cache}/csi-provisioner.

include hack/tools/versions.env

SHELL := /usr/bin/env bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help

GO ?= go
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -X main.version=$(VERSION)
# grpcnotrace keeps golang.org/x/net/trace out of both binaries. That package
# (gRPC's optional request tracing, which nothing here turns on) executes
# html/template, whose reflective method calls stop the linker from dropping
# unused exported methods: with it, the sidecar keeps every method of
# client-go's typed clients and apply configurations, 65 MB of code and
# tables instead of 37 MB, and most of that is resident. The image builder
# (hack/tools/image), the tests' own build (internal/e2e) and the
# Dockerfiles set the same tag.
GOTAGS := grpcnotrace
BIN := bin
TOOLS := hack/tools/build.sh
HELM = $(shell $(TOOLS) path helm)/helm
KUSTOMIZE = $(shell $(TOOLS) path kustomize)/kustomize
GOLANGCI_LINT = $(shell $(TOOLS) path golangci-lint)/golangci-lint
# Packages that need the local control plane (or build binaries and run them;
# cmd/demo's test runs `make demo`'s flow).
INTEGRATION_PKGS := ./test/... ./internal/controlplane/... ./cmd/demo
UNIT_PKGS = $(shell $(GO) list ./... | grep -v -e /test/ -e /internal/controlplane -e /cmd/demo$$)
# The unit packages under the race detector, but csi-test's sanity suite,
# which calls the example driver one RPC at a time (the tests of
# examples/hostpath-driver make concurrent calls) and would add csi-test
# and ginkgo to the instrumented build.
RACE_PKGS = $(filter-out %/sanity,$(UNIT_PKGS))
TEST_TIMEOUT ?= 25m
# What the tests need: the control plane is required (never skipped), the
# tools' paths, and the binaries `make build` just built.
TEST_ENV_COMMON = CSI_PROVISIONER_REQUIRE_CONTROLPLANE=1 KUBE_CACHE_MUTATION_DETECTOR=true HELM=$(HELM) KUSTOMIZE=$(KUSTOMIZE)
TEST_ENV = $(TEST_ENV_COMMON) CSI_PROVISIONER_BIN_DIR=$(CURDIR)/$(BIN)
# test-race-integration builds the two programs with -race here.
RACE_BIN := bin-race

.PHONY: help
help: ## List the targets.
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  %-22s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

.PHONY: build
# Static, as in the images (cgo off): the tests run the binaries that ship,
# and the image builder reuses the packages this build compiled.
build: ## Build the sidecar and the example driver into bin/.
	CGO_ENABLED=0 $(GO) build -trimpath -tags $(GOTAGS) -ldflags "$(LDFLAGS)" -o $(BIN)/csi-provisioner ./cmd/csi-provisioner
	CGO_ENABLED=0 $(GO) build -trimpath -tags $(GOTAGS) -ldflags "$(LDFLAGS)" -o $(BIN)/hostpath-driver ./examples/hostpath-driver

.PHONY: tools
tools: ## Build (or reuse from the cache) etcd, kube-apiserver, kube-controller-manager, helm, kustomize and golangci-lint.
	$(TOOLS) etcd kubernetes helm kustomize golangci-lint

.PHONY: tools-control-plane
tools-control-plane: ## Build (or reuse) the local control plane only: etcd, kube-apiserver, kube-controller-manager.
	$(TOOLS) etcd kubernetes

.PHONY: tools-test
tools-test: tools-control-plane ## Build (or reuse) what `make test` needs: the control plane, helm, kustomize, upstream external-provisioner (switchover tests).
	$(TOOLS) helm kustomize external-provisioner

.PHONY: test
test: tools-test build test-race ## Run every test: unit (also under the race detector), sanity, integration, end-to-end, chart, short chaos, images.
	hack/no-leftovers.sh snapshot
	$(TEST_ENV) $(GO) test -count=1 -timeout $(TEST_TIMEOUT) ./...
	hack/no-leftovers.sh check
	$(GO) -C hack/tools/image test -count=1 -timeout $(TEST_TIMEOUT) ./...

.PHONY: test-unit
test-unit: ## Run the unit tests (no control plane needed).
	$(GO) test -timeout $(TEST_TIMEOUT) $(UNIT_PKGS)

.PHONY: test-race
test-race: ## Run the unit tests under Go's race detector.
	$(GO) test -race -count=1 -timeout $(TEST_TIMEOUT) $(RACE_PKGS)

.PHONY: test-race-integration
test-race-integration: tools-test ## Run the control-plane tests under the race detector, with the sidecar and driver built with -race too.
	$(GO) build -race -trimpath -tags $(GOTAGS) -ldflags "$(LDFLAGS)" -o $(RACE_BIN)/csi-provisioner ./cmd/csi-provisioner
	$(GO) build -race -trimpath -tags $(GOTAGS) -ldflags "$(LDFLAGS)" -o $(RACE_BIN)/hostpath-driver ./examples/hostpath-driver
	hack/no-leftovers.sh snapshot
	$(TEST_ENV_COMMON) CSI_PROVISIONER_BIN_DIR=$(CURDIR)/$(RACE_BIN) $(GO) test -race -count=1 -timeout $(TEST_TIMEOUT) $(INTEGRATION_PKGS)
	hack/no-leftovers.sh check

.PHONY: test-integration
test-integration: tools-test build ## Run the tests against the local control plane.
	hack/no-leftovers.sh snapshot
	$(TEST_ENV) $(GO) test -count=1 -timeout $(TEST_TIMEOUT) $(INTEGRATION_PKGS)
	hack/no-leftovers.sh check

# The control-plane tests (but the chaos run) against the older Kubernetes pinned as
# KUBERNETES_COMPAT_VERSION. Not part of `make test` (CI time budget).
COMPAT_PKGS := ./test/e2e ./test/integration ./test/chart ./test/badinput

.PHONY: test-compat
test-compat: tools-test build ## Run the e2e, integration, chart and bad-input tests against the older Kubernetes of versions.env (KUBERNETES_COMPAT_VERSION), about 3 minutes once built.
	$(TOOLS) kubernetes-compat
	hack/no-leftovers.sh snapshot
	$(TEST_ENV) CSI_PROVISIONER_KUBERNETES_VERSION=$(KUBERNETES_COMPAT_VERSION) $(GO) test -count=1 -timeout $(TEST_TIMEOUT) $(COMPAT_PKGS)
	hack/no-leftovers.sh check

.PHONY: sanity
sanity: ## Run csi-test's sanity suite against the example driver's backends.
	$(GO) test -count=1 -v -run Sanity ./examples/hostpath-driver/... 2>&1 | tee /dev/stderr | grep -E '^(Ran [0-9]+ of|SUCCESS!|FAIL!|--- (PASS|FAIL|SKIP))' || true

.PHONY: demo
demo: tools-control-plane build ## Run the sidecar on a local control plane: provision, bind, delete, explain a Pending claim (KEEP=1 leaves it running).
	$(GO) run ./cmd/demo --bin-dir $(BIN) $(if $(KEEP),--keep)

.PHONY: bench
bench: tools-control-plane build ## Measure throughput, latency, API cost and memory (ARGS="-n 1000").
	$(GO) run ./test/bench --bin-dir $(BIN) $(ARGS)

.PHONY: bench-upstream
bench-upstream: tools-control-plane build ## The benchmark with upstream external-provisioner v6.3.0 and kube-controller-manager's binder, side by side with ours.
	$(TOOLS) external-provisioner
	$(GO) run ./test/bench --bin-dir $(BIN) -binder kcm -provisioner-cmd $(shell $(TOOLS) path external-provisioner)/csi-provisioner $(ARGS)

.PHONY: chaos
chaos: tools-control-plane build ## Long chaos run with invariant checks (ARGS="-chaos.claims=2000 -chaos.kills=100").
	$(TEST_ENV) CHAOS_LONG=1 $(GO) test -count=1 -timeout 120m -v -run TestChaos ./test/chaos/ $(ARGS)

.PHONY: chart
chart: ## Lint and render the Helm chart with default and all-options values.
	$(TOOLS) helm
	$(HELM) lint --strict deploy/sidecar/chart
	$(HELM) lint --strict deploy/sidecar/chart -f deploy/sidecar/chart/ci/all-options-values.yaml
	$(HELM) template csi deploy/sidecar/chart >/dev/null
	$(HELM) template csi deploy/sidecar/chart -f deploy/sidecar/chart/ci/all-options-values.yaml >/dev/null

# make image: the images as OCI image layout archives, built by
# hack/tools/image (no container engine, no base image pull). Same digest
# for the same source, Go toolchain, VERSION and REVISION.
REVISION ?= $(shell git rev-parse HEAD 2>/dev/null || echo unknown)
IMAGE_PLATFORMS ?= linux/amd64,linux/arm64
# Prefix of the names the archives carry, e.g. registry.example.com/acme.
IMAGE_REGISTRY ?=
IMAGE_ARGS = -repo-root $(CURDIR) -out $(CURDIR)/$(BIN)/images -version $(VERSION) -revision $(REVISION) \
	$(if $(IMAGE_REGISTRY),-registry $(IMAGE_REGISTRY))

.PHONY: image
image: ## Build both images for linux/amd64 and linux/arm64 as OCI archives in bin/images/ (no container engine needed); prints the digests.
	$(GO) -C hack/tools/image run . $(IMAGE_ARGS) -platforms $(IMAGE_PLATFORMS)

.PHONY: test-image
test-image: ## Build both images for this machine and check them (part of make test).
	$(GO) -C hack/tools/image test -count=1 -timeout $(TEST_TIMEOUT) ./...

.PHONY: docker-image
docker-image: ## Build the images with docker build and the Dockerfiles (needs a Docker engine that can pull gcr.io/distroless).
	docker build --build-arg VERSION=$(VERSION) -t csi-provisioner:$(VERSION) -f Dockerfile .
	docker build --build-arg VERSION=$(VERSION) -t hostpath-driver:$(VERSION) -f examples/hostpath-driver/Dockerfile .

.PHONY: lint
lint: ## Run golangci-lint.
	$(TOOLS) golangci-lint
	$(GOLANGCI_LINT) run ./...
	cd hack/tools/image && $(GOLANGCI_LINT) run ./...

.PHONY: verify
verify: lint ## gofmt, go vet, go mod tidy and lint must be clean.
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed: $$out"; exit 1; fi
	$(GO) vet ./...
	$(GO) -C hack/tools/image vet ./...
	hack/verify-tidy.sh
	@big=$$(git ls-files -z | xargs -0 du -k 2>/dev/null | awk '$$1 > 1024 {print $$2}'); \
	if [ -n "$$big" ]; then echo "tracked files over 1 MiB (a built binary?): $$big"; exit 1; fi
