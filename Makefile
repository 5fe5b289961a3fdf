# Kurma build. `make demo` and `make test` are the two entry points README.md
# promises; both install what they need on a fresh Debian machine (as root).
#
# Layout of what `make build` produces (all under bin/, ignored by git):
#   bin/<name>            every main package under cmd/ and plugins/
#   bin/cni/<plugin>      upstream CNI plugins, pinned in go.mod (tool directives)
#   bin/tools/            cnitool, etcd: test peers built from the module proxy
#   bin/k8s/              kube-apiserver, kube-controller-manager, kube-scheduler,
#                         kubelet, kube-proxy, kubectl (hack/k8s/go.mod)
#   bin/images/           images built from this repo (stager, test apps, netplugin)
#   bin/keys/             the stager signing key `make` generates (private key 0600)

SHELL := /bin/bash
GO ?= go
export PATH := /usr/local/go/bin:$(PATH)
export CGO_ENABLED ?= 0
BIN := $(CURDIR)/bin
# Heavy third-party builds are cached across runs in a folder keyed by a hash
# of their inputs.
CACHE_ROOT ?= /var/cache/kurma-build
# The key is the exact module versions the tools are built from, plus the Go
# version, so unrelated go.mod changes do not force a rebuild.
TOOLS_KEY := $(shell { $(GO) version; $(GO) list -deps -f '{{with .Module}}{{.Path}}@{{.Version}}{{end}}' $$($(GO) list tool) | sort -u; } | sha256sum | cut -c1-16)
TOOLS_CACHE := $(CACHE_ROOT)/tools-$(TOOLS_KEY)
UPSTREAM_CNI := bridge host-local loopback portmap ptp macvlan ipvlan static tuning bandwidth firewall
GO_TEST_FLAGS ?= -count=1 -timeout 40m

.PHONY: all build binaries tools k8s e2e coredns knp conformance-images conformance images image deps test-deps test test-race test-install test-unit demo bench fuzz clean lint

all: build

# deps: what kurmad and the demo need; test-deps adds the peers only the
# tests and benchmarks use (podman, runc, containerd).
deps:
	@hack/install-deps.sh

test-deps:
	@hack/install-deps.sh test

build: binaries tools k8s images image

binaries:
	@mkdir -p $(BIN)
	$(GO) build -trimpath -o $(BIN)/ ./cmd/...
	@# CNI plugins are exec'd for every ADD/DEL: stripped, they start about
	@# 3 ms sooner (see bench/cni).
	$(GO) build -trimpath -ldflags='-s -w' -o $(BIN)/ ./plugins/...

# Upstream CNI plugins and test peers, built once per go.sum and cached.
tools:
	@mkdir -p $(BIN)/cni $(BIN)/tools $(CACHE_ROOT)
	@if [ ! -f $(TOOLS_CACHE)/.done ]; then \
	  echo "building pinned upstream tools into $(TOOLS_CACHE)"; \
	  tmp=$$(mktemp -d $(CACHE_ROOT)/.tmp.XXXXXX) && mkdir -p $$tmp/cni $$tmp/tools && \
	  for p in $$($(GO) list tool | grep containernetworking/plugins/); do \
	    $(GO) build -trimpath -o $$tmp/cni/$$(basename $$p) $$p || exit 1; done && \
	  $(GO) build -trimpath -o $$tmp/tools/cnitool github.com/containernetworking/cni/cnitool && \
	  $(GO) build -trimpath -o $$tmp/tools/etcd go.etcd.io/etcd/server/v3 && \
	  touch $$tmp/.done && { mv -T $$tmp $(TOOLS_CACHE) 2>/dev/null || rm -rf $$tmp; }; \
	fi
	@cp -f $(TOOLS_CACHE)/cni/* $(BIN)/cni/ && cp -f $(TOOLS_CACHE)/tools/* $(BIN)/tools/

# Kubernetes components for the real-cluster tests (internal/testutil/kubecluster)
# and benchmarks, from the nested module hack/k8s (so the main go.mod stays
# light). A cold build takes 10-20 min on 2 cores, so the binaries are cached
# under a key of that module's go.mod/go.sum, the version stamped in and the
# Go version, and hard-linked (or copied) into bin/k8s.
K8S_VERSION := v1.37.1
K8S_KEY := $(shell { $(GO) version; echo $(K8S_VERSION); cat hack/k8s/go.mod hack/k8s/go.sum; } | sha256sum | cut -c1-16)
K8S_CACHE := $(CACHE_ROOT)/k8s-$(K8S_KEY)
K8S_LDFLAGS := -s -w $(foreach p,k8s.io/component-base/version k8s.io/client-go/pkg/version,\
	-X $(p).gitVersion=$(K8S_VERSION) -X $(p).gitMajor=$(word 1,$(subst ., ,$(K8S_VERSION:v%=%))) \
	-X $(p).gitMinor=$(word 2,$(subst ., ,$(K8S_VERSION))) -X $(p).gitTreeState=clean \
	-X $(p).buildDate=1970-01-01T00:00:00Z)
k8s:
	@mkdir -p $(BIN)/k8s $(CACHE_ROOT)
	@if [ ! -f $(K8S_CACHE)/.done ]; then \
	  echo "building Kubernetes $(K8S_VERSION) into $(K8S_CACHE) (cold: 10-20 min)"; \
	  tmp=$$(mktemp -d $(CACHE_ROOT)/.tmp.XXXXXX) && \
	  ( cd hack/k8s && nice -n 5 $(GO) build -trimpath -ldflags='$(K8S_LDFLAGS)' -o $$tmp/ $$($(GO) list tool) ) || \
	    { rm -rf $$tmp; exit 1; }; \
	  touch $$tmp/.done && { mv -T $$tmp $(K8S_CACHE) 2>/dev/null || rm -rf $$tmp; }; \
	fi
	@for f in $(K8S_CACHE)/kube*; do ln -f $$f $(BIN)/k8s/ 2>/dev/null || cp -f $$f $(BIN)/k8s/; done

# The upstream e2e suite (sig-network and NetworkPolicy specs only), agnhost
# and the ginkgo CLI for test/conformance, from the nested module hack/e2e
# (same require/replace blocks as hack/k8s, so most packages come from the
# build cache `make k8s` fills). Cached like k8s: cold ~5 min after a warm
# k8s build, then seconds.
E2E_KEY := $(shell { $(GO) version; echo $(K8S_VERSION); cat hack/e2e/go.mod hack/e2e/go.sum hack/e2e/*.go; } | sha256sum | cut -c1-16)
E2E_CACHE := $(CACHE_ROOT)/e2e-$(E2E_KEY)
e2e:
	@mkdir -p $(BIN)/e2e $(CACHE_ROOT)
	@if [ ! -f $(E2E_CACHE)/.done ]; then \
	  echo "building the e2e suite, agnhost and ginkgo into $(E2E_CACHE)"; \
	  tmp=$$(mktemp -d $(CACHE_ROOT)/.tmp.XXXXXX) && \
	  ( cd hack/e2e && nice -n 5 $(GO) test -c -vet=off -trimpath -ldflags='$(K8S_LDFLAGS)' -o $$tmp/e2e.test . && \
	    nice -n 5 $(GO) build -trimpath -ldflags='$(K8S_LDFLAGS)' -o $$tmp/ $$($(GO) list tool) ) || \
	    { rm -rf $$tmp; exit 1; }; \
	  touch $$tmp/.done && { mv -T $$tmp $(E2E_CACHE) 2>/dev/null || rm -rf $$tmp; }; \
	fi
	@for f in e2e.test agnhost ginkgo; do ln -f $(E2E_CACHE)/$$f $(BIN)/e2e/ 2>/dev/null || cp -f $(E2E_CACHE)/$$f $(BIN)/e2e/; done

# CoreDNS for the conformance cluster's kube-dns (a trimmed main in the
# nested module hack/coredns), cached the same way.
COREDNS_KEY := $(shell { $(GO) version; cat hack/coredns/go.mod hack/coredns/go.sum hack/coredns/*.go; } | sha256sum | cut -c1-16)
COREDNS_CACHE := $(CACHE_ROOT)/coredns-$(COREDNS_KEY)
coredns:
	@mkdir -p $(BIN)/coredns $(CACHE_ROOT)
	@if [ ! -f $(COREDNS_CACHE)/.done ]; then \
	  echo "building CoreDNS into $(COREDNS_CACHE)"; \
	  tmp=$$(mktemp -d $(CACHE_ROOT)/.tmp.XXXXXX) && \
	  ( cd hack/coredns && nice -n 5 $(GO) build -trimpath -ldflags='-s -w' -o $$tmp/coredns . ) || \
	    { rm -rf $$tmp; exit 1; }; \
	  touch $$tmp/.done && { mv -T $$tmp $(COREDNS_CACHE) 2>/dev/null || rm -rf $$tmp; }; \
	fi
	@ln -f $(COREDNS_CACHE)/coredns $(BIN)/coredns/ 2>/dev/null || cp -f $(COREDNS_CACHE)/coredns $(BIN)/coredns/

# kube-network-policies v0.8.0, the NetworkPolicy peer of test/conformance
# (CONFORMANCE_SET=netpol) and bench/k8s/netpol, from the nested module
# hack/knp, cached the same way.
KNP_KEY := $(shell { $(GO) version; cat hack/knp/go.mod hack/knp/go.sum; } | sha256sum | cut -c1-16)
KNP_CACHE := $(CACHE_ROOT)/knp-$(KNP_KEY)
knp:
	@mkdir -p $(BIN)/knp $(CACHE_ROOT)
	@if [ ! -f $(KNP_CACHE)/.done ]; then \
	  echo "building kube-network-policies into $(KNP_CACHE)"; \
	  tmp=$$(mktemp -d $(CACHE_ROOT)/.tmp.XXXXXX) && \
	  ( cd hack/knp && nice -n 5 $(GO) build -trimpath -ldflags='-s -w' -o $$tmp/kube-network-policies sigs.k8s.io/kube-network-policies/cmd ) || \
	    { rm -rf $$tmp; exit 1; }; \
	  touch $$tmp/.done && { mv -T $$tmp $(KNP_CACHE) 2>/dev/null || rm -rf $$tmp; }; \
	fi
	@ln -f $(KNP_CACHE)/kube-network-policies $(BIN)/knp/ 2>/dev/null || cp -f $(KNP_CACHE)/kube-network-policies $(BIN)/knp/

# The offline images of the upstream e2e suite (hack/conformance-images.sh).
conformance-images: binaries e2e coredns
	@hack/conformance-images.sh $(BIN)

# The upstream sig-network specs against the real cluster, Kurma (no
# kube-proxy) and the kube-proxy (nftables) + bridge + portmap peer in the
# same run (test/conformance). CONFORMANCE_SET=conformance (the 47
# [Conformance] specs) or network (all of [sig-network] but [Feature:...],
# [Disruptive] and cloud-only specs) or netpol ([Feature:NetworkPolicy],
# peer kube-network-policies); CONFORMANCE_PEERS=kurma,kube-proxy (default:
# the set's);
# CONFORMANCE_FOCUS=<regexp> reruns some specs (reports under <set>-focus);
# CONFORMANCE_NODES=2 runs each peer's cluster with two nodes, so that the
# specs needing two run (reports under <set>-2nodes).
CONFORMANCE_SET ?= conformance
CONFORMANCE_PEERS ?=
CONFORMANCE_NODES ?= 1
conformance: test-deps build conformance-images knp
	KURMA_BIN_DIR=$(BIN) KURMA_CONFORMANCE_SET=$(CONFORMANCE_SET) KURMA_CONFORMANCE_PEERS=$(CONFORMANCE_PEERS) \
	  KURMA_CONFORMANCE_FOCUS='$(CONFORMANCE_FOCUS)' KURMA_CONFORMANCE_NODES=$(CONFORMANCE_NODES) \
	  $(GO) test -count=1 -timeout 4h -v -run '^TestUpstream$$' ./test/conformance 2>&1 | tee $(BIN)/conformance-$(CONFORMANCE_SET)-$(CONFORMANCE_NODES)n.log; exit $${PIPESTATUS[0]}

# Images built from this repo's programs (see hack/build-images.sh).
# (networking: the netplugin image packs bin/cni, hence tools.)
images: binaries tools
	@hack/build-images.sh $(BIN)

# The image of the Kubernetes install (deploy/kubernetes,
# docs/install-kubernetes.md): kurma-agent, kurma-k8s-watcher,
# kurma-controller and the kurma-k8s shim, static and stripped, as an OCI
# layout (bin/images/kurma-oci) and a docker-save tarball
# (bin/images/kurma.tar) named kurma.dev/kurma:$(IMAGE_TAG). No VCS stamp:
# the same sources and Go give the same digest.
IMAGE_TAG ?= latest
image:
	@mkdir -p $(BIN)/image-bin $(BIN)/images
	CGO_ENABLED=0 $(GO) build -trimpath -buildvcs=false -ldflags='-s -w' -o $(BIN)/image-bin/ \
	  ./cmd/kurma-agent ./cmd/kurma-k8s-watcher ./cmd/kurma-controller ./plugins/kurma-k8s
	$(GO) run ./hack/kurma-image --bin $(BIN)/image-bin --tag kurma.dev/kurma:$(IMAGE_TAG) \
	  --nft "$$(command -v nft || echo nft-not-installed)" --layout $(BIN)/images/kurma-oci --tarball $(BIN)/images/kurma.tar

# Test binaries are compiled in parallel first. Then every package that
# uses host-wide resources runs one at a time (HOST_PKGS: the default bridge
# kurma0, /var/lib/kurma-network, /etc/cni and /opt/cni, podman and
# containerd state; and the pod manager's warm spare stage-init, a copy of
# the host's mount namespace, which pins the private host mounts, such as
# other tests' netns binds, that existed when it started), and the other
# packages, which name everything they make uniquely and start no spare,
# run in parallel.
HOST_PKGS := kurma.dev/kurma/internal/pod kurma.dev/kurma/internal/network/manager \
	kurma.dev/kurma/test/e2e kurma.dev/kurma/test/cniconformance \
	kurma.dev/kurma/internal/testutil/kubecluster kurma.dev/kurma/internal/kube/services \
	kurma.dev/kurma/internal/kube/podports kurma.dev/kurma/internal/kube/cnid \
	kurma.dev/kurma/deploy/kubernetes kurma.dev/kurma/test/k8se2e kurma.dev/kurma/test/k8sservices \
	kurma.dev/kurma/test/k8sinstall kurma.dev/kurma/test/k8snetpol kurma.dev/kurma/test/conformance
# The host is snapshotted before the tests and compared after them
# (test/hostsnap): a run that leaves a link, netns, nft table, mount,
# cgroup, state entry or changed forwarding sysctl behind fails.
# HOSTCHECK=0 skips the comparison (on a machine where other work changes
# the host while the tests run).
HOSTSNAP := $(BIN)/.hostsnap.json
HOSTCHECK ?= 1
test: test-deps build conformance-images
	$(GO) mod tidy -diff
	$(GO) run ./test/hostsnap save $(HOSTSNAP)
	KURMA_BIN_DIR=$(BIN) $(GO) test -count=1 -run '^$$' ./... >/dev/null
	KURMA_BIN_DIR=$(BIN) $(GO) test $(GO_TEST_FLAGS) $$($(GO) list ./... | grep -vxF $(HOST_PKGS:%=-e %))
	KURMA_BIN_DIR=$(BIN) $(GO) test -p 1 $(GO_TEST_FLAGS) $(HOST_PKGS)
	@$(MAKE) --no-print-directory test-race
	@if [ "$(HOSTCHECK)" != 0 ]; then $(GO) run ./test/hostsnap check $(HOSTSNAP); fi

# The Kubernetes, controller and agent packages and pkg/ under the race
# detector (cgo: gcc and libc6-dev come with test-deps). -short skips the
# long multi-host and 1,000-cycle tests; the packages that start real
# clusters run one at a time, as in test.
RACE_PKGS := ./internal/kube/... ./internal/controller/... ./internal/agent/... ./pkg/...
test-race: test-deps build
	CGO_ENABLED=1 KURMA_BIN_DIR=$(BIN) $(GO) test -race -short -p 1 -count=1 -timeout 40m $(RACE_PKGS)

# The install as documented (test/k8sinstall, part of test) on its own.
test-install: test-deps build
	KURMA_BIN_DIR=$(BIN) $(GO) test -count=1 -timeout 20m ./test/k8sinstall

# Pure-logic tests only: no root, no build artefacts needed.
test-unit:
	$(GO) test -count=1 -short ./...

# The demo needs no Kubernetes build (make k8s: minutes on a fresh machine).
demo: deps binaries tools images
	@hack/demo.sh $(BIN)

# Every benchmark under bench/ (each a main package printing its figures;
# cnitimer and floorcni are plugins the k8s benchmark installs, not
# benchmarks).
BENCHES = run podstart stager image netplugin netattach controller agent cni lb k8s k8s/services k8s/reach k8s/watcherrss
bench: test-deps build
	@for d in $(BENCHES); do echo "== bench/$$d"; KURMA_BIN_DIR=$(BIN) $(GO) run ./bench/$$d || exit 1; done

# Short coverage-guided run of every fuzz target (FUZZTIME per target).
FUZZTIME ?= 20s
fuzz:
	@hack/fuzz.sh $(FUZZTIME)

lint:
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); exit 1; }
	$(GO) mod tidy -diff
	$(GO) vet ./...

clean:
	rm -rf $(BIN)
