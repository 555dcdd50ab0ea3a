# Lifeline's build. `make help` lists the targets.

SHELL := /usr/bin/env bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help

GO       ?= go
BIN      := $(CURDIR)/bin
PROGRESS := $(CURDIR)/test/tools/progress.sh
# Tests find the control-plane binaries here, whatever package they run in.
export LIFELINE_BIN_DIR := $(BIN)
# Every compile but the race detector's (vet, build, images, the scale test's controller) uses the images' flags,
# static and path-free, so a cold machine compiles the dependencies once for all of them.
GO_STATIC := CGO_ENABLED=0 GOFLAGS=-trimpath $(GO)

# Pinned versions are read from the tools modules, so go.mod stays the one place that names them.
modver = $(shell awk '{ m = ($$1 == "require") ? $$2 : $$1; v = ($$1 == "require") ? $$3 : $$2 } m == "$(2)" { print v; exit }' $(1)/go.mod)

KUBE_VERSION := $(call modver,test/tools/kube,k8s.io/kubernetes)
# Stamped with the version the API server and kubectl report (go build stamps none), and stripped, as releases are.
KUBE_LDFLAGS := -s -w $(foreach pkg,k8s.io/component-base/version k8s.io/client-go/pkg/version,\
	-X $(pkg).gitVersion=$(KUBE_VERSION) -X $(pkg).gitMajor=$(word 1,$(subst ., ,$(KUBE_VERSION:v%=%))) \
	-X $(pkg).gitMinor=$(word 2,$(subst ., ,$(KUBE_VERSION:v%=%))) -X $(pkg).gitTreeState=clean)
KUBE_TOOLS := $(BIN)/kube-apiserver $(BIN)/kube-controller-manager $(BIN)/kube-scheduler $(BIN)/kubectl \
	$(BIN)/kubelet $(BIN)/kube-proxy
GEN_TOOLS  := $(BIN)/controller-gen $(BIN)/protoc-gen-go $(BIN)/staticcheck
ALL_TOOLS  := $(KUBE_TOOLS) $(BIN)/etcd $(GEN_TOOLS) $(BIN)/kwok $(BIN)/kube-state-metrics $(BIN)/helm $(BIN)/lifeline-images

##@ Everyday

.PHONY: help
help: ## Show this list.
	@awk 'BEGIN {FS = ":.*## "} /^##@/ {printf "\n%s\n", substr($$0, 5)} /^[a-z-]+:.*## / {printf "  make %-18s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

DEMO_PID := $(CURDIR)/.demo.pid

.PHONY: demo
demo: tools build ## Run Lifeline on a simulated edge and narrate it; leaves it running (Ctrl-C or make demo-down).
	@echo "==> starting the demo"
	$(GO_STATIC) build -o $(BIN)/lifeline-demo ./test/demo
	$(BIN)/lifeline-demo --pid-file $(DEMO_PID)

.PHONY: demo-real
demo-real: tools build ## The same story on real nodes (kubelet and containerd; root, see docs/operations.md); leaves it running.
	$(MAKE) --no-print-directory images-nodes
	@echo "==> starting the demo on real nodes"
	$(GO_STATIC) build -o $(BIN)/lifeline-demo ./test/demo
	$(BIN)/lifeline-demo --real --pid-file $(DEMO_PID)

.PHONY: demo-down
demo-down: ## Stop a demo left running, with every process and temp dir.
	@if [ -f $(DEMO_PID) ]; then kill $$(cat $(DEMO_PID)) && echo "demo stopping"; else echo "no demo running"; fi

.PHONY: test
test: lint verify-generated tools build fuzz ## Everything CI runs: lint, generated code, fuzzing, unit, integration, e2e (real nodes too, as root with containerd).
	@# The real-node tests (test/realnode) install this release on real kubelets; elsewhere they skip, saying why.
	$(MAKE) --no-print-directory images-nodes
	@echo "==> go test -race ./... but the soak and the real KubeEdge nodes (integration and e2e packages start their own control plane)"
	$(GO) test -race -count=1 $$($(GO) list ./... | grep -v -e '/test/soak$$' -e '/test/realkubeedge$$')
	@# Apart from test/realnode: real nodes of both take this machine's node network (its addresses, namespaces, firewall).
	@echo "==> go test -race on real KubeEdge nodes (cloudcore and edgecore from ../shared/kubeedge; they skip without it)"
	$(GO) test -race -count=1 -timeout 30m ./test/realkubeedge/
	@# Apart from the e2e: both simulations run their nodes' pods on this machine's ports, aggregators on 7363.
	@echo "==> go test -race the soak's short run"
	$(GO) test -race -count=1 ./test/soak/
	@echo "==> go test the image builder (it cross-compiles the commands and writes their images)"
	@# Without -race: the builder runs on one goroutine, and the detector would slow its gzip of 200 MB tenfold.
	cd test/tools/images && $(GO) test -count=1 .

# Fuzz targets run briefly in every test run; run them longer with FUZZTIME=5000000x make fuzz. The budget is a
# count of executions, not a duration: Go 1.26's fuzz coordinator can fail a duration-bound run with a spurious
# "context deadline exceeded" when the machine is loaded (go.dev/issue/75804, fixed in Go 1.27).
FUZZTIME ?= 50000x
# Each target is <package>:<fuzz function>.
FUZZ_TARGETS := ./proto/lifeline/v1/:FuzzParseTopic ./proto/lifeline/v1/:FuzzDecodeMessages \
	./cloud/liveness/:FuzzIngest ./cloud/liveness/:FuzzIngestSequence ./edge/reportapi/:FuzzReportHandler \
	./cloud/broker/:FuzzOfferedTickets

.PHONY: fuzz
fuzz: ## Fuzz the protocol's topic parser and decoders, the controller's liveness table, the broker's ClientHello reader and the agent's report API ($(FUZZTIME) executions each).
	@for t in $(FUZZ_TARGETS); do f=$${t##*:}; p=$${t%:*}; echo "==> fuzz $$f in $$p ($(FUZZTIME) executions)"; \
		$(GO) test -run '^$$' -fuzz "^$$f$$" -fuzztime $(FUZZTIME) $$p || exit 1; done

.PHONY: test-unit
test-unit: ## Unit tests only (no control plane).
	$(GO) test -race -count=1 -short ./...

.PHONY: test-integration
test-integration: tools build ## Integration tests against the real control plane (and the unit tests beside them).
	$(GO) test -race -count=1 ./...

# The chaos run on the simulation (test/soak): SOAK_CYCLES cycles from a new seed (make test runs 20 cycles of seed
# 42); a failing run prints its seed, and SOAK_SEED=<seed> make soak replays it.
SOAK_CYCLES ?= 200
SOAK_SEED ?= random

.PHONY: soak
soak: tools build ## Seeded chaos on the simulation: partitions, kills, restarts, reboots, deletions; SOAK_SEED replays a run.
	SOAK_CYCLES=$(SOAK_CYCLES) SOAK_SEED=$(SOAK_SEED) $(GO) test -count=1 -timeout 90m -v -run '^TestSoak$$' ./test/soak/

# Packages that hold benchmarks; those that need it start their own control plane (test/e2e: the whole simulation).
BENCH_PKGS := ./cloud/broker/ ./cloud/jointinference/ ./cloud/federatedlearning/ ./cloud/liveness/ ./edge/agent/ ./test/e2e/ ./test/realnode/

.PHONY: bench
bench: tools build ## Benchmarks, each printed beside an anchor measured in the same run (real nodes too, as root with containerd).
	$(MAKE) --no-print-directory images-nodes
	@echo "==> benchmarks (each package starts a control plane first)"
	$(GO) test -count=1 -run '^$$' -bench . -benchtime 1x $(BENCH_PKGS)
	@# Apart from test/realnode's: real nodes of both take this machine's node network.
	@echo "==> benchmarks on real KubeEdge nodes (they skip without KubeEdge's source archive)"
	$(GO) test -count=1 -run '^$$' -bench . -benchtime 1x ./test/realkubeedge/

# Fleet sizes `make bench-scale` runs at, one control plane each (SCALE_NODES=100,300,1000 for the whole curve).
SCALE_NODES ?= 100,300

.PHONY: bench-scale
bench-scale: tools ## Lifeline at fleet scale under kwok: children, reconciles, CPU, RSS, detection, mass cut-off ($(SCALE_NODES) nodes).
	@echo "==> scale benchmark at $(SCALE_NODES) edge nodes (one control plane, kwok and agent fleet per size)"
	$(GO) test -count=1 -run '^$$' -bench '^BenchmarkScale$$' -benchtime 1x -timeout 90m ./test/scale/ -scale.nodes=$(SCALE_NODES)

##@ Building

.PHONY: build
build: ## Compile every package, and into bin/ the binaries and the simulation's (edge nodes, sample workers).
	$(GO_STATIC) build ./...
	$(GO_STATIC) build -o $(BIN)/ ./cmd/... ./test/cmd/...
	$(GO_STATIC) build -o $(BIN)/lifeline-sampleworker ./test/workers

.PHONY: lint
lint: $(BIN)/staticcheck ## gofmt, go vet and staticcheck.
	@echo "==> gofmt"
	@bad=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$bad" ]; then echo "gofmt would change:"; echo "$$bad"; exit 1; fi
	@echo "==> go vet"
	$(GO_STATIC) vet ./...
	cd test/tools/images && $(GO_STATIC) vet .
	@echo "==> staticcheck"
	$(BIN)/staticcheck ./...
	cd test/tools/images && $(BIN)/staticcheck .

# The plain manifests are the chart with its default values, but for what cannot be rendered without a cluster or
# without secrets: the broker's certificate (generated by the chart, kept by lookup) and the nodes' identity (KubeEdge's
# CA). They take both from objects you create, as the chart does with these values, and create the namespace.
MANIFESTS_VALUES := --set nodeIdentity.mode=password --set broker.tls.existingSecret=lifeline-broker-tls
MANIFESTS_HEADER := "\# Lifeline in namespace lifeline-system, generated by make generate from deploy/chart/lifeline with" \
	"\# $(MANIFESTS_VALUES). Do not edit." \
	"\# Create first the Secrets lifeline-broker-tls (kubernetes.io/tls) and lifeline-mqtt-credentials, and the ConfigMap" \
	"\# lifeline-broker-ca (key ca.crt), as docs/operations.md says; then kubectl apply --server-side -f this file." \
	"apiVersion: v1" "kind: Namespace" "metadata:" "  name: lifeline-system"

# Everything `make generate` writes; verify-generated compares these paths with what git has.
GENERATED := cloud/api deploy/crds deploy/chart/lifeline/crds deploy/manifests proto

.PHONY: generate
generate: $(BIN)/controller-gen $(BIN)/protoc-gen-go $(BIN)/helm ## Regenerate deepcopy code, CRDs, the plain manifests and protobuf code.
	@echo "==> controller-gen: deepcopy and CRDs"
	$(BIN)/controller-gen object paths=./cloud/api/...
	$(BIN)/controller-gen crd:generateEmbeddedObjectMeta=true paths=./cloud/api/... output:crd:artifacts:config=deploy/crds
	@echo "==> crdconstraints: what controller-gen's markers cannot reach, as OpenAPI"
	$(GO) run ./deploy/crdconstraints deploy/crds/*.yaml
	@echo "==> helm: the chart's CRDs and deploy/manifests/lifeline.yaml"
	rm -f deploy/chart/lifeline/crds/*.yaml && cp deploy/crds/*.yaml deploy/chart/lifeline/crds/
	@mkdir -p deploy/manifests
	{ printf '%s\n' $(MANIFESTS_HEADER); $(BIN)/helm template lifeline deploy/chart/lifeline --namespace lifeline-system \
		--include-crds --no-hooks $(MANIFESTS_VALUES); } > deploy/manifests/lifeline.yaml
	@echo "==> protoc: the liveness protocol"
	@command -v protoc >/dev/null || { echo "protoc is missing: apt-get install protobuf-compiler"; exit 1; }
	protoc --plugin=protoc-gen-go=$(BIN)/protoc-gen-go --go_out=. --go_opt=module=github.com/lifeline-edge/lifeline \
		proto/lifeline/v1/*.proto

.PHONY: verify-generated
verify-generated: generate ## Fail when generated files differ from what is committed.
	@changed=$$(git status --porcelain --untracked-files=all -- $(GENERATED)); \
	if [ -n "$$changed" ]; then echo "generated files are stale; run make generate and commit:"; echo "$$changed"; exit 1; fi

##@ Images

# The images' version: stamped into the binaries (--version) and the images' labels, and their tag. By default the
# chart's appVersion, the tag the chart and the plain manifests run.
VERSION  ?= $(shell awk -F'"' '/^appVersion:/ { print $$2 }' deploy/chart/lifeline/Chart.yaml)
IMAGE_TAG ?= $(VERSION)
# The images are <IMAGE_REPOSITORY>/lifeline-controller:<IMAGE_TAG> and <IMAGE_REPOSITORY>/lifeline-agent:<IMAGE_TAG>.
IMAGE_REPOSITORY ?= lifeline
PLATFORMS ?= linux/amd64 linux/arm64
REVISION ?= $(shell git rev-parse HEAD 2>/dev/null)
IMAGE_SOURCE ?= https://$(shell $(GO) list -m)
# Every date in the images: the last commit's, so two builds of one commit are the same bytes.
SOURCE_DATE_EPOCH ?= $(shell git log -1 --format=%ct 2>/dev/null || echo 0)
DIST := $(CURDIR)/dist
IMAGE_LDFLAGS := -s -w -X main.version=$(VERSION) -X main.revision=$(REVISION)
comma := ,
empty :=
space := $(empty) $(empty)

.PHONY: images
images: $(BIN)/lifeline-images ## Build the controller's and the agent's images (PLATFORMS: linux/amd64, linux/arm64) into dist/images/, no engine needed.
	@for p in $(PLATFORMS); do echo "==> go build ./cmd/lifeline-controller ./cmd/lifeline-agent for $$p"; \
		GOOS=$${p%%/*} GOARCH=$${p#*/} $(GO_STATIC) build -ldflags '$(IMAGE_LDFLAGS)' \
			-o $(DIST)/bin/$${p%%/*}_$${p#*/}/ ./cmd/lifeline-controller ./cmd/lifeline-agent || exit 1; done
	@echo "==> writing the images"
	$(BIN)/lifeline-images --bin-dir $(DIST)/bin --out $(DIST)/images --repository $(IMAGE_REPOSITORY) \
		--tag $(IMAGE_TAG) --version $(VERSION) --revision '$(REVISION)' --source '$(IMAGE_SOURCE)' \
		--platforms $(subst $(space),$(comma),$(strip $(PLATFORMS))) --source-date-epoch $(SOURCE_DATE_EPOCH)

# The platforms of a release's images and of its kubectl plugin.
RELEASE_PLATFORMS ?= linux/amd64 linux/arm64
PLUGIN_PLATFORMS ?= linux/amd64 linux/arm64 darwin/amd64 darwin/arm64
# Where the release's plugin archives are downloaded from, as its krew manifest names them.
RELEASE_URL ?= https://github.com/lifeline-edge/lifeline/releases/download/v$(VERSION)

# A registry and path to push a release to (make release REGISTRY=registry.example/lifeline): the chart then pulls its
# images from there. Empty: the release stays in dist/release/.
REGISTRY ?=

.PHONY: release
release: $(BIN)/lifeline-images $(BIN)/helm ## A release in dist/release/ for VERSION=x.y.z: the images for linux/amd64 and linux/arm64 (OCI archives), the chart pinned to their digests (a tgz and an OCI artifact), kubectl-lifeline for linux and darwin with a krew manifest, SHA256SUMS; pushed to REGISTRY when one is named.
	@echo '$(VERSION)' | grep -Eq '^[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.-]+)?$$' || { echo "make release VERSION=x.y.z (a semantic version), not '$(VERSION)'"; exit 1; }
	$(MAKE) --no-print-directory images VERSION=$(VERSION) IMAGE_TAG=$(VERSION) PLATFORMS="$(RELEASE_PLATFORMS)" DIST=$(DIST) \
		IMAGE_REPOSITORY=$(or $(REGISTRY),$(IMAGE_REPOSITORY))
	PLUGIN_PLATFORMS="$(PLUGIN_PLATFORMS)" IMAGE_REPOSITORY=$(or $(REGISTRY),$(IMAGE_REPOSITORY)) \
		test/tools/release.sh '$(VERSION)' $(DIST)/images $(DIST)/release $(BIN)/helm $(GO) '$(RELEASE_URL)' $(SOURCE_DATE_EPOCH) \
		$(BIN)/lifeline-images
	$(if $(REGISTRY),@echo "==> pushing release $(VERSION) to $(REGISTRY)" && $(BIN)/lifeline-images push --registry $(REGISTRY) --version $(VERSION) $(DIST)/release)

.PHONY: images-nodes
images-nodes: ## What this machine's real nodes install: a release of this checkout for this machine's platform (dist/release/), and the sample images.
	@echo "==> a release for this machine's real nodes, and the sample images"
	$(MAKE) --no-print-directory release RELEASE_PLATFORMS=$(HOST_PLATFORM) PLUGIN_PLATFORMS=$(HOST_PLATFORM)
	$(MAKE) --no-print-directory images-samples

# The host's platform, for images that only this machine's real nodes run.
HOST_PLATFORM := linux/$(shell $(GO) env GOARCH)

.PHONY: images-samples
images-samples: $(BIN)/lifeline-images ## Build the pod sandbox's image and the sample worker under Sedna's example image names into dist/images/samples/, for real nodes without a registry.
	@echo "==> go build the sample worker (the pod sandbox's process too) for $(HOST_PLATFORM)"
	GOOS=linux GOARCH=$(notdir $(HOST_PLATFORM)) $(GO_STATIC) build -ldflags '-s -w' \
		-o $(DIST)/bin/linux_$(notdir $(HOST_PLATFORM))/lifeline-sampleworker ./test/workers
	$(BIN)/lifeline-images --samples --bin-dir $(DIST)/bin --out $(DIST)/images/samples --platforms $(HOST_PLATFORM) \
		--source-date-epoch $(SOURCE_DATE_EPOCH)

##@ Tools (pinned in test/tools/*/go.mod, built into bin/)

.PHONY: tools
tools: $(ALL_TOOLS) kubeedge ## Build the pinned tools that are missing or out of date.
	@echo "==> tools up to date in bin/: $(notdir $(ALL_TOOLS))"

# KubeEdge's own source at a pinned commit, with its vendor/ (the module proxy does not serve it), beside a clone.
KUBEEDGE_ARCHIVE ?= $(firstword $(wildcard $(CURDIR)/../shared/kubeedge/kubeedge-*.tar.xz))

.PHONY: kubeedge
kubeedge: ## Build cloudcore and edgecore from KubeEdge's source archive (pinned by test/tools/kubeedge/archive.sha256), when there is one.
	@test/tools/kubeedge/build.sh "$(KUBEEDGE_ARCHIVE)" "$(BIN)"

$(KUBE_TOOLS) &: test/tools/kube/go.mod test/tools/kube/go.sum
	@echo "==> building kube-apiserver, kube-controller-manager, kube-scheduler, kubectl, kubelet, kube-proxy from k8s.io/kubernetes $(KUBE_VERSION) (cold: about 6 min on 2 cores)"
	@cd test/tools/kube && $(PROGRESS) "kubernetes" $(GO) build -ldflags '$(KUBE_LDFLAGS)' -o $(BIN)/ k8s.io/kubernetes/cmd/kube-apiserver \
		k8s.io/kubernetes/cmd/kube-controller-manager k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubectl \
		k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kube-proxy
	@touch $(KUBE_TOOLS)

$(BIN)/etcd: test/tools/etcd/go.mod test/tools/etcd/go.sum test/tools/etcd/main.go
	@echo "==> building etcd from go.etcd.io/etcd/server/v3 $(call modver,test/tools/etcd,go.etcd.io/etcd/server/v3)"
	@cd test/tools/etcd && $(PROGRESS) "etcd" $(GO) build -o $@ .

$(BIN)/controller-gen: test/tools/gen/go.mod test/tools/gen/go.sum
	@echo "==> building controller-gen from sigs.k8s.io/controller-tools $(call modver,test/tools/gen,sigs.k8s.io/controller-tools)"
	@cd test/tools/gen && $(PROGRESS) "controller-gen" $(GO) build -o $@ sigs.k8s.io/controller-tools/cmd/controller-gen

$(BIN)/protoc-gen-go: test/tools/gen/go.mod test/tools/gen/go.sum
	@echo "==> building protoc-gen-go from google.golang.org/protobuf $(call modver,test/tools/gen,google.golang.org/protobuf)"
	@cd test/tools/gen && $(PROGRESS) "protoc-gen-go" $(GO) build -o $@ google.golang.org/protobuf/cmd/protoc-gen-go

$(BIN)/staticcheck: test/tools/gen/go.mod test/tools/gen/go.sum
	@echo "==> building staticcheck from honnef.co/go/tools $(call modver,test/tools/gen,honnef.co/go/tools)"
	@cd test/tools/gen && $(PROGRESS) "staticcheck" $(GO) build -o $@ honnef.co/go/tools/cmd/staticcheck

$(BIN)/kwok: test/tools/kwok/go.mod test/tools/kwok/go.sum
	@echo "==> building kwok from sigs.k8s.io/kwok $(call modver,test/tools/kwok,sigs.k8s.io/kwok)"
	@cd test/tools/kwok && $(PROGRESS) "kwok" $(GO) build -o $@ sigs.k8s.io/kwok/cmd/kwok

$(BIN)/kube-state-metrics: test/tools/ksm/go.mod test/tools/ksm/go.sum
	@echo "==> building kube-state-metrics from k8s.io/kube-state-metrics/v2 $(call modver,test/tools/ksm,k8s.io/kube-state-metrics/v2)"
	@cd test/tools/ksm && $(PROGRESS) "kube-state-metrics" $(GO) build -o $@ k8s.io/kube-state-metrics/v2

HELM_VERSION := $(call modver,test/tools/helm,helm.sh/helm/v3)
# As Helm's own release build: the version it reports, and the Kubernetes version `helm template` and `helm lint`
# assume without a cluster (that of the client-go it is built with, v0.x.y meaning v1.x.y).
HELM_KUBE_MINOR := $(word 2,$(subst ., ,$(call modver,test/tools/helm,k8s.io/client-go)))
HELM_LDFLAGS := -X helm.sh/helm/v3/internal/version.version=$(HELM_VERSION) -X helm.sh/helm/v3/internal/version.gitTreeState=clean \
	$(foreach pkg,helm.sh/helm/v3/pkg/chartutil helm.sh/helm/v3/pkg/lint/rules,-X $(pkg).k8sVersionMajor=1 -X $(pkg).k8sVersionMinor=$(HELM_KUBE_MINOR))

$(BIN)/helm: test/tools/helm/go.mod test/tools/helm/go.sum
	@echo "==> building helm from helm.sh/helm/v3 $(HELM_VERSION)"
	@cd test/tools/helm && $(PROGRESS) "helm" $(GO) build -ldflags '$(HELM_LDFLAGS)' -o $@ helm.sh/helm/v3/cmd/helm

$(BIN)/lifeline-images: test/tools/images/go.mod test/tools/images/go.sum $(wildcard test/tools/images/*.go)
	@echo "==> building lifeline-images with github.com/google/go-containerregistry $(call modver,test/tools/images,github.com/google/go-containerregistry)"
	@cd test/tools/images && $(GO) build -o $@ .

.PHONY: clean
clean: ## Remove bin/ and dist/.
	rm -rf $(BIN) $(DIST)
