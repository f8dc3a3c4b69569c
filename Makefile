# palisade: build, local control plane, tests.
#
#   make test           the whole suite: unit + integration tests against a real kube-apiserver (starts it)
#   make unit-test      only the tests that need no cluster (unit, model, property, doc examples)
#   make demo           the fencing story, end to end, on the local control plane (no node)
#   make bench          all benchmark figures in one run (~35 min on 2 cores): target/bench/results.{json,md,png},
#                       and the figures in docs/performance.md
#   make bench-peers    only the peers: client-go leader election, kube-leader-election, kubert
#   make bench-operator only the fenced-operator figures (palisade's and client-go's, ~4 min):
#                       target/bench-operator/results.md, docs/performance.md untouched
#   make chaos          the fault-injection suite (DURATION=10m SEED=<now>); see tests/chaos/
#   make cluster        start (or reuse) etcd + kube-apiserver + kube-controller-manager on 127.0.0.1,
#                       the image registry on 127.0.0.1:REGISTRY_PORT (crane, blobs in the cluster's
#                       state), and the node (kube-scheduler, containerd, kubelet; NODE=0: without it);
#                       HA=1: three etcd members and two kube-apiservers behind a link proxy, no node
#                       (ports and use: tests/controlplane/cluster.sh)
#   make node-deps      what the node needs: containerd/runc/CNI packages, kubelet, the pause image
#   make image-local    the images without a Docker engine, pushed to the registry (the kubelet pulls them)
#   make chart          helm package charts/palisade into target/charts/, helm push to oci://<registry>/charts
#   make chart-release  record Chart.yaml's version as released: charts/released/palisade-<version>.tgz
#   make demo-cluster   the fencing story with real pods on the node
#   make cluster-down   stop it and remove its state (and the databases')
#   make databases      start (or reuse) PostgreSQL, Redis and MariaDB on 127.0.0.1 (PG_PORT, REDIS_PORT, MYSQL_PORT)
#   make check          cargo fmt --check, clippy -D warnings, each feature set builds, cargo doc -D warnings
#                       (public, and with private items), the size limits of src/ and tests/
#   make crds           regenerate crds/, the chart's copy and docs/crd-reference.md from the Rust types
#   make chart-lint     helm lint --strict of charts/palisade
#   make promtool       promtool (Prometheus), which checks the chart's alerts and dashboard (make test builds it)
#   make image          build the container image (needs a Docker engine)
#   make conformance    every way to hold a Lease through one black-box suite (tests/conformance/)
#   make test-one TEST=name ARGS=...   one integration test target, after make test (or make cluster) started its parts
#   make go-client-check, python-client-check, java-client-check   the thin clients' tests that need no agent
#   make example-go-check, example-python-check, example-java-check   the examples/ that use them, on the node
#   make chaospod-check a real operator (controller-runtime's example, ChaosPods) frozen past its
#                       Lease, fenced by palisade and not: its stale writes from the audit log (tests/operators/)
#
# Control-plane binaries are built from Go modules under tests/controlplane/ and
# cached outside target/ (CACHE_DIR), keyed by version, so `cargo clean` keeps them.

SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c
# Go links take ~2 GiB each: never build two at once.
.NOTPARALLEL:

CACHE_DIR ?= $(HOME)/.cache/palisade
# Versions come from the go.mod files: the one place they are pinned.
gomod_version = $(shell awk '{for (i = 1; i < NF; i++) if ($$i == "$(1)" && $$(i+1) ~ /^v[0-9]/) {print $$(i+1); exit}}' $(2))
K8S_VERSION := $(call gomod_version,k8s.io/kubernetes,tests/controlplane/kube/go.mod)
K8S_MINOR := $(word 2,$(subst ., ,$(K8S_VERSION)))
ETCD_VERSION := $(call gomod_version,go.etcd.io/etcd/server/v3,tests/controlplane/etcd/go.mod)
HELM_VERSION := $(call gomod_version,helm.sh/helm/v3,tests/controlplane/helm/go.mod)
PROMETHEUS_VERSION := $(call gomod_version,github.com/prometheus/prometheus,tests/controlplane/promtool/go.mod)
CRANE_VERSION := $(call gomod_version,github.com/google/go-containerregistry,tests/controlplane/registry/go.mod)

# Cache directories are keyed by version and by a hash of the files the build reads, not
# by file times: a fresh clone's files are all newer than the cache, yet build the same.
content_key = $(shell cat $(1) | sha256sum | cut -c1-12)
KUBE_BIN := $(CACHE_DIR)/kubernetes-$(K8S_VERSION)-$(call content_key,tests/controlplane/kube/go.mod tests/controlplane/kube/go.sum)
ETCD_BIN := $(CACHE_DIR)/etcd-$(ETCD_VERSION)-$(call content_key,tests/controlplane/etcd/go.mod tests/controlplane/etcd/go.sum tests/controlplane/etcd/main.go)
HELM_BIN := $(CACHE_DIR)/helm-$(HELM_VERSION)-$(call content_key,tests/controlplane/helm/go.mod tests/controlplane/helm/go.sum)
PROMTOOL_BIN := $(CACHE_DIR)/promtool-$(PROMETHEUS_VERSION)-$(call content_key,tests/controlplane/promtool/go.mod tests/controlplane/promtool/go.sum)
# tests/chart_monitoring.rs runs it (promtool test rules, check rules).
export PROMTOOL := $(PROMTOOL_BIN)/promtool
CRANE_BIN := $(CACHE_DIR)/crane-$(CRANE_VERSION)-$(call content_key,tests/controlplane/registry/go.mod tests/controlplane/registry/go.sum)
export PALISADE_BIN_DIR := $(CACHE_DIR)/bin-k8s-$(K8S_VERSION)-etcd-$(ETCD_VERSION)-helm-$(HELM_VERSION)

CLUSTER_DIR := $(CURDIR)/target/cluster
export KUBECONFIG_TEST := $(CLUSTER_DIR)/kubeconfig
# The cluster's image registry (cluster.sh starts it): make image-local and make chart
# push to it, the node pulls from it, the tests find it here.
export REGISTRY_PORT ?= 15005
export PALISADE_TEST_REGISTRY := 127.0.0.1:$(REGISTRY_PORT)

GO_BUILD := CGO_ENABLED=0 go build -trimpath
KUBE_LDFLAGS := -s -w -X k8s.io/component-base/version.gitVersion=$(K8S_VERSION) \
	-X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$(K8S_MINOR) \
	-X k8s.io/component-base/version.gitTreeState=clean

CONTROLPLANE_BINS := $(KUBE_BIN)/kube-apiserver $(KUBE_BIN)/kube-controller-manager $(KUBE_BIN)/kubectl \
	$(ETCD_BIN)/etcd $(HELM_BIN)/helm $(CRANE_BIN)/crane

# --- the node (NODE=0: control plane only) ---------------------------------------
# HA=1: the replicated control plane (cluster.sh), which has no node.
export HA ?= 0
ifeq ($(HA),1)
export NODE := 0
else
export NODE ?= 1
endif
IMAGE_DIR := $(CURDIR)/target/images
NODE_BINS := $(KUBE_BIN)/kubelet $(KUBE_BIN)/kube-scheduler
ifeq ($(NODE),1)
CONTROLPLANE_BINS += $(NODE_BINS)
NODE_DEPS := node-deps
endif

.PHONY: databases databases-down databases-status
.PHONY: all build test unit-test check crds cluster cluster-down cluster-status \
	controlplane-bins linkproxy node-deps node-packages image-local chart chart-release demo-cluster demo demo-bins test-build test-bench-smoke test-suites test-chaos-ha test-examples bench bench-peers bench-clientgo bench-rust-peers bench-operator chaos clean-cache chart-lint image \
	conformance test-one

all: build

build:
	cargo build --release --locked

# --- the agent's thin clients and their examples ----------------------------------
# clients/go and examples/go-leader-redis; clients/python and examples/python-worker-postgres;
# clients/java (with its adapters), its conformance driver and examples/java-worker-postgres.
# Included here: after `all` (the default goal) and after IMAGE_DIR and CACHE_DIR, which
# their targets' names use (make expands a target's name as it reads the line).
include mk/go.mk mk/python.mk mk/java.mk mk/java-example.mk
# The test object stores (SeaweedFS, moto) of the object-store fence.
include mk/objectstores.mk

# --- control-plane binaries (cached by version) -------------------------------

controlplane-bins: $(CONTROLPLANE_BINS)
	@mkdir -p $(PALISADE_BIN_DIR)
	@for b in $(CONTROLPLANE_BINS); do ln -sf "$$b" $(PALISADE_BIN_DIR)/; done

# Each Go build keeps how long it took next to its binary (<binary>.seconds), which
# make demo prints: what a newcomer's first run waits for.
timed = t0=$$(date +%s); $(2); echo $$(($$(date +%s) - t0)) > $(1).seconds

$(KUBE_BIN)/%:
	@mkdir -p $(@D)
	@echo "building $* $(K8S_VERSION) (takes minutes, cached in $(@D))"
	$(call timed,$@,cd tests/controlplane/kube && $(GO_BUILD) -ldflags "$(KUBE_LDFLAGS)" -o $@.tmp k8s.io/kubernetes/cmd/$*)
	mv $@.tmp $@

$(ETCD_BIN)/etcd:
	@mkdir -p $(@D)
	@echo "building etcd $(ETCD_VERSION) (cached in $(@D))"
	$(call timed,$@,cd tests/controlplane/etcd && $(GO_BUILD) -ldflags "-s -w" -o $@.tmp .)
	mv $@.tmp $@

$(HELM_BIN)/helm:
	@mkdir -p $(@D)
	@echo "building helm $(HELM_VERSION) (cached in $(@D))"
	$(call timed,$@,cd tests/controlplane/helm && $(GO_BUILD) \
		-ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=$(HELM_VERSION)" -o $@.tmp helm.sh/helm/v3/cmd/helm)
	mv $@.tmp $@

# promtool, for the chart's PrometheusRule and dashboard (tests/chart_monitoring.rs). The
# tag remove_all_sd leaves out Prometheus' service-discovery plugins (AWS, Azure, GCE,
# Consul, ...; plugins/ in its module), which rule tests never use: ~2-4 min cold on 2 cores.
.PHONY: promtool
promtool: $(PROMTOOL)

$(PROMTOOL_BIN)/promtool:
	@mkdir -p $(@D)
	@echo "building promtool $(PROMETHEUS_VERSION) (cached in $(@D))"
	$(call timed,$@,cd tests/controlplane/promtool && $(GO_BUILD) -tags remove_all_sd \
		-ldflags "-s -w -X github.com/prometheus/common/version.Version=$(PROMETHEUS_VERSION)" \
		-o $@.tmp github.com/prometheus/prometheus/cmd/promtool)
	mv $@.tmp $@

# crane: the cluster's image registry (`crane registry serve`, cluster.sh) and the pushes
# of make image-local.
$(CRANE_BIN)/crane:
	@mkdir -p $(@D)
	@echo "building crane $(CRANE_VERSION) (cached in $(@D))"
	$(call timed,$@,cd tests/controlplane/registry && $(GO_BUILD) \
		-ldflags "-s -w -X github.com/google/go-containerregistry/cmd/crane/cmd.Version=$(CRANE_VERSION)" \
		-o $@.tmp github.com/google/go-containerregistry/cmd/crane)
	mv $@.tmp $@

# Debian packages of the node, installed when missing (as root, like CI).
NODE_PACKAGES := containerd runc containernetworking-plugins socat busybox-static
node-packages:
	@missing=""; for p in $(NODE_PACKAGES); do \
		dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q 'ok installed' || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
		echo "installing:$$missing"; apt-get update -qq && apt-get install -y -qq --no-install-recommends $$missing; \
	fi

node-deps: node-packages $(NODE_BINS) $(IMAGE_DIR)/pause.tar

# The pod sandbox image: a static pause program, imported into containerd by node.sh.
$(IMAGE_DIR)/pause.tar: tests/controlplane/images/pause.c tests/controlplane/images/docker-archive.sh
	@rm -rf $(IMAGE_DIR)/pause.root && mkdir -p $(IMAGE_DIR)/pause.root
	gcc -static -Os -s -o $(IMAGE_DIR)/pause.root/pause $<
	tests/controlplane/images/docker-archive.sh $@ palisade.local/pause:1 $(IMAGE_DIR)/pause.root \
		'{"Entrypoint":["/pause"],"User":"65535:65535"}'
	@rm -rf $(IMAGE_DIR)/pause.root

clean-cache:
	rm -rf $(CACHE_DIR)

# --- local control plane -------------------------------------------------------

# The HA plane's links (tests/support/bin/linkproxy.rs); cargo rebuilds it when changed.
export LINKPROXY := $(CURDIR)/target/debug/palisade-linkproxy
linkproxy:
	cargo build --locked --quiet -p palisade-test-support --bin palisade-linkproxy

cluster: controlplane-bins $(NODE_DEPS) $(if $(filter 1,$(HA)),linkproxy)
	@BIN_DIR=$(PALISADE_BIN_DIR) STATE_DIR=$(CLUSTER_DIR) tests/controlplane/cluster.sh up

cluster-down: databases-down objectstores-down
	@BIN_DIR=$(PALISADE_BIN_DIR) STATE_DIR=$(CLUSTER_DIR) tests/controlplane/cluster.sh down

cluster-status:
	@BIN_DIR=$(PALISADE_BIN_DIR) STATE_DIR=$(CLUSTER_DIR) tests/controlplane/cluster.sh status

# --- test databases (fencing in PostgreSQL, Redis and MariaDB) ---------------------
# tests/databases/databases.sh: installs the Debian packages when missing, data in
# DATABASES_DIR; tests find them through the URLs below.
PG_PORT ?= 15432
REDIS_PORT ?= 16379
MYSQL_PORT ?= 13306
DATABASES_DIR := $(CURDIR)/target/databases
export PALISADE_TEST_POSTGRES := postgres://postgres@127.0.0.1:$(PG_PORT)/postgres
export PALISADE_TEST_REDIS := redis://127.0.0.1:$(REDIS_PORT)/
export PALISADE_TEST_MYSQL := mysql://root@127.0.0.1:$(MYSQL_PORT)/
DATABASES_ENV = STATE_DIR=$(DATABASES_DIR) PG_PORT=$(PG_PORT) REDIS_PORT=$(REDIS_PORT) MYSQL_PORT=$(MYSQL_PORT)

databases:
	@$(DATABASES_ENV) tests/databases/databases.sh up

databases-down:
	@$(DATABASES_ENV) tests/databases/databases.sh down

databases-status:
	@$(DATABASES_ENV) tests/databases/databases.sh status

# --- Rust ------------------------------------------------------------------------

# The chart ships a byte-identical copy, and docs/crd-reference.md is generated (tests fail
# on drift). Each file is written whole or not at all (a failed build leaves the old one).
crds:
	cargo run --quiet --locked -- crds > crds/palisade.dev.yaml.tmp
	cargo run --quiet --locked -p palisade-test-support --bin palisade-crd-reference > docs/crd-reference.md.tmp
	mv crds/palisade.dev.yaml.tmp crds/palisade.dev.yaml
	cp crds/palisade.dev.yaml charts/palisade/files/crds.yaml
	mv docs/crd-reference.md.tmp docs/crd-reference.md

chart-lint: controlplane-bins
	PATH="$(PALISADE_BIN_DIR):$$PATH" helm lint --strict charts/palisade

# The container image (needs a Docker engine; none on the development machines).
IMAGE ?= ghcr.io/palisade-dev/palisade:$(shell awk '$$1 == "appVersion:" {gsub(/"/, "", $$2); print $$2}' charts/palisade/Chart.yaml)
image:
	docker build -t $(IMAGE) .

# The same image without a daemon: a static glibc build (rustls, no OpenSSL; the musl
# target of the Dockerfile needs a toolchain download), written as a `docker save`
# archive by tests/controlplane/images/docker-archive.sh and pushed by tag to the
# cluster's registry, from which the kubelet pulls it: REGISTRY_IMAGE. EXAMPLE_IMAGE
# (REGISTRY_EXAMPLE_IMAGE once pushed) adds busybox's POSIX shell and kubectl for examples/.
# PUSH_IMAGES records each pushed digest in IMAGE_DIR/<name>.digest, and fails, saying
# so, when no registry runs (make cluster starts it).
IMAGE_TAG := $(word 2,$(subst :, ,$(lastword $(subst /, ,$(IMAGE)))))
EXAMPLE_IMAGE ?= palisade.local/palisade-example:$(IMAGE_TAG)
REGISTRY_IMAGE := $(PALISADE_TEST_REGISTRY)/palisade:$(IMAGE_TAG)
REGISTRY_EXAMPLE_IMAGE := $(PALISADE_TEST_REGISTRY)/palisade-example:$(IMAGE_TAG)
PUSH_IMAGES := CRANE=$(CRANE_BIN)/crane tests/controlplane/registry/push.sh
STATIC_TARGET := x86_64-unknown-linux-gnu
STATIC_BIN := target/$(STATIC_TARGET)/release/palisade
image-local: $(CRANE_BIN)/crane $(IMAGE_DIR)/palisade.tar $(IMAGE_DIR)/palisade-example.tar
	@$(PUSH_IMAGES) $(IMAGE_DIR)/palisade.tar $(REGISTRY_IMAGE) $(IMAGE_DIR)/palisade-example.tar $(REGISTRY_EXAMPLE_IMAGE)

# The chart as a user gets it: packaged (its version from Chart.yaml) into target/charts/
# and pushed to oci://<registry>/charts/palisade, which tests/node/ installs.
CHART_VERSION = $(shell awk '$$1 == "version:" {gsub(/"/, "", $$2); print $$2; exit}' charts/palisade/Chart.yaml)
chart: controlplane-bins
	@curl -sf --max-time 3 -o /dev/null http://$(PALISADE_TEST_REGISTRY)/v2/ || { echo "chart: no image registry" \
		"answers at http://$(PALISADE_TEST_REGISTRY)/v2/ (make cluster starts it, on REGISTRY_PORT)" >&2; exit 1; }
	@rm -f target/charts/palisade-*.tgz
	PATH="$(PALISADE_BIN_DIR):$$PATH" helm package charts/palisade -d target/charts
	PATH="$(PALISADE_BIN_DIR):$$PATH" helm push target/charts/palisade-$(CHART_VERSION).tgz \
		oci://$(PALISADE_TEST_REGISTRY)/charts --plain-http

# A released chart is kept as it was packaged: the version-bump test compares the chart
# with it, and tests/chart_upgrade.rs upgrades from the newest one before Chart.yaml's.
chart-release: controlplane-bins
	@test ! -e charts/released/palisade-$(CHART_VERSION).tgz || { echo "chart-release: chart" \
		"$(CHART_VERSION) is released already (charts/released/); bump Chart.yaml's version" >&2; exit 1; }
	PATH="$(PALISADE_BIN_DIR):$$PATH" helm package charts/palisade -d charts/released

$(STATIC_BIN): Cargo.toml Cargo.lock $(shell find src -name '*.rs')
	RUSTFLAGS="-C target-feature=+crt-static" cargo build --release --locked --bin palisade --target $(STATIC_TARGET)
	@if readelf -lW $@ | grep -q 'program interpreter'; then \
		echo "$@ is dynamically linked; expected a static binary" >&2; exit 1; fi

$(IMAGE_DIR)/palisade.tar: $(STATIC_BIN) tests/controlplane/images/docker-archive.sh
	@rm -rf $@.root && mkdir -p $@.root/etc $@.root/tmp && chmod 1777 $@.root/tmp
	install -m 0755 -s $(STATIC_BIN) $@.root/palisade
	printf 'root:x:0:0:root:/:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/tmp:/sbin/nologin\n' > $@.root/etc/passwd
	printf 'root:x:0:\nnonroot:x:65532:\n' > $@.root/etc/group
	tests/controlplane/images/docker-archive.sh $@ $(IMAGE) $@.root \
		'{"User":"65532:65532","Entrypoint":["/palisade"],"Cmd":["controller"],"Env":["PATH=/"]}'
	@rm -rf $@.root

$(IMAGE_DIR)/palisade-example.tar: $(STATIC_BIN) $(KUBE_BIN)/kubectl tests/controlplane/images/docker-archive.sh
	@rm -rf $@.root && mkdir -p $@.root/bin $@.root/usr/local/bin $@.root/etc $@.root/tmp && chmod 1777 $@.root/tmp
	install -m 0755 -s $(STATIC_BIN) $@.root/usr/local/bin/palisade
	install -m 0755 $(KUBE_BIN)/kubectl $@.root/usr/local/bin/kubectl
	install -m 0755 /bin/busybox $@.root/bin/busybox
	for a in $$(/bin/busybox --list); do [ $$a = busybox ] || ln -sf busybox $@.root/bin/$$a; done
	printf 'root:x:0:0:root:/:/bin/sh\nnonroot:x:65532:65532:nonroot:/tmp:/bin/sh\n' > $@.root/etc/passwd
	printf 'root:x:0:\nnonroot:x:65532:\n' > $@.root/etc/group
	tests/controlplane/images/docker-archive.sh $@ $(EXAMPLE_IMAGE) $@.root \
		'{"User":"65532:65532","Entrypoint":["/usr/local/bin/palisade"],"Env":["PATH=/usr/local/bin:/bin","HOME=/tmp"]}'
	@rm -rf $@.root

# Each feature set a library user may pick builds on its own (cargo check: fast), the
# API docs build without warnings, and no source file passes 600 lines (no function in
# src/ passes 80: the lint in src/lib.rs, the threshold in clippy.toml); tests/ keeps
# its own limits, files at most 800 lines and functions at most 120
# (tests/support/bin/test_sizes.rs).
FEATURE_SETS := client fence client,fence postgres redis mysql s3 outbox controller agent cli operator
check:
	cargo fmt --all --check
	cargo clippy --locked --all-targets -- -D warnings
	cargo check --locked --quiet --no-default-features
	@for f in $(FEATURE_SETS); do echo "cargo check --no-default-features --features $$f"; \
		cargo check --locked --quiet --no-default-features --features $$f; done
	RUSTDOCFLAGS="-D warnings" cargo doc --locked --quiet --no-deps
	@# The rationale of each decision lives in the docs of the module that enforces it,
	@# private ones included (DESIGN.md's index links there).
	RUSTDOCFLAGS="-D warnings" cargo doc --locked --quiet --no-deps --document-private-items
	@heavy=$$(cargo tree --locked --no-default-features --features client,fence -e normal --prefix none \
		| { grep -oE '^(axum|prometheus-client|clap|tracing-subscriber) ' || true; } | sort -u | tr '\n' ' '); \
	if [ -n "$$heavy" ]; then echo "the client,fence build pulls in $$heavy(it must not)" >&2; exit 1; fi; \
	echo "the client,fence build pulls in none of axum, prometheus-client, clap, tracing-subscriber"
	@long=$$(find src -name '*.rs' -exec wc -l {} + | awk '$$2 != "total" && $$1 > 600 {print $$2 " (" $$1 " lines)"}'); \
	if [ -n "$$long" ]; then echo "split by concept, each file in src/ at most 600 lines: $$long" >&2; exit 1; fi; \
	echo "every file in src/ is at most 600 lines"
	cargo run --locked --quiet -p palisade-test-support --bin palisade-test-sizes

# The tests that need no cluster and no database, in seconds once built: the unit tests,
# the grant decision's model and property tests (which drive the real controller loop),
# the parsers' property tests, the file fence, the fault proxy, the image's build context, and the doc
# examples. (The chart's rendering tests need no cluster either, but helm, which
# `make controlplane-bins` builds: they run in `make test`.) `make test` runs them too.
unit-test:
	cargo test --locked --lib --bins --test input_properties --test fence --test image_context --test proxy
	cargo test --locked --doc

# The conformance suite's drivers: the Go client's, and the venv the Python one runs in
# (the Rust library's and palisade lock's are built by cargo).
CONFORMANCE_ENV = PALISADE_CONFORMANCE_GO=$(CURDIR)/$(GO_DRIVER_BIN) \
	PALISADE_CONFORMANCE_PYTHON="$(PYTHON_CONFORMANCE_DRIVER)" \
	PALISADE_CONFORMANCE_JAVA=$(CURDIR)/$(JAVA_DRIVER_BIN)
CONFORMANCE_ARGS ?=
conformance: cluster conformance-go-driver python-venv conformance-java-driver
	$(CONFORMANCE_ENV) cargo test --locked --test conformance -- $(CONFORMANCE_ARGS)

# The whole suite, in parts run in this order; each part's time goes to the log and to
# target/test-parts.tsv, so any run (CI's included) gives the figures of docs/testing.md's
# budget table. Integration tests (tests/*.rs) use the cluster `make cluster` starts; the
# examples of the thin clients run last, as pods on the node.
TEST_PARTS := controlplane-bins $(NODE_DEPS) cluster chart promtool databases objectstores conformance-go-driver python-venv \
	go-client-check python-client-check java-client-check conformance-java-driver linkproxy \
	$(if $(filter 1,$(NODE)),image-local example-go-image example-python-image example-java-image chaospod-image) \
	test-build test-bench-smoke test-suites test-chaos-ha $(if $(filter 1,$(NODE)),test-examples test-operators)
test:
	@mkdir -p target && : >target/test-parts.tsv && t0=$$(date +%s); \
	for part in $(TEST_PARTS); do \
		t=$$(date +%s); $(MAKE) --no-print-directory $$part || { echo "make test: $$part failed" >&2; exit 1; }; \
		now=$$(date +%s); printf '%s\t%s\n' $$part $$((now - t)) >>target/test-parts.tsv; \
		echo "make test: $$part took $$((now - t)) s ($$((now - t0)) s so far)"; \
	done

# Every test and bench target compiled once, so the parts below only run them.
test-build:
	cargo test --locked --no-run
	cargo test --locked --no-run --benches

test-bench-smoke: conformance-go-driver conformance-java-driver
	@echo "bench smoke run (figures from a debug build mean nothing; see make bench):"
	@rm -rf target/bench-smoke
	cargo test --locked --bench handover -- --rounds 3 --expiry-lanes 2 --expiry-rounds 1 \
		--steady 1 --warmup 0 --baseline 1 --out target/bench-smoke
	cargo test --locked --bench scale -- --sizes 20 --storm-duration 5 --out target/bench-smoke
	cargo test --locked --bench fence_db -- --rounds 5 --out target/bench-smoke
	cargo test --locked --bench fence_s3 -- --rounds 5 --out target/bench-smoke
	cargo test --locked --bench outbox -- --intents 200 --rounds 1 --out target/bench-smoke
	cargo test --locked --bench semaphore -- --rounds 3 --contenders 6 --permits 3 --seconds 2 \
		--out target/bench-smoke
	$(CONFORMANCE_ENV) cargo test --locked --bench agent -- --rounds 4 --leases 3 --steady 2 --out target/bench-smoke
	cargo test --locked --bench ha -- --rounds 3 --failovers 1 --out target/bench-smoke
	PATH="$(PALISADE_BIN_DIR):$$PATH" cargo test --locked --bench operator -- --rounds 20 --kills 2 \
		--out target/bench-smoke
	cp docs/performance.md target/bench-smoke/performance.md
	cargo test --locked --bench report -- --dir target/bench-smoke --smoke \
		--publish target/bench-smoke/performance.md

test-suites:
	$(CONFORMANCE_ENV) PATH="$(PALISADE_BIN_DIR):$$PATH" cargo test --locked -- --test-threads 4

test-chaos-ha:
	@echo "the fault-injection suite on the HA control plane, short run (make chaos HA=1 for 10 minutes):"
	$(CONFORMANCE_ENV) cargo test --locked --test chaos -- --ha --duration 45s --seed 1

test-examples:
	$(MAKE) --no-print-directory example-go-check example-python-check example-java-check

# Operators nobody on the project wrote, fenced (tests/operators/; mk/go.mk builds them).
.PHONY: test-operators
test-operators:
	$(MAKE) --no-print-directory chaospod-check

# One integration test target against what `make test` starts (run that, or `make cluster
# databases chart image-local`, first), with the environment `make test` gives it:
#   make test-one TEST=postgres ARGS='stale_writes --nocapture'
TEST ?=
ARGS ?=
test-one:
	@test -n "$(TEST)" || { echo "test-one: name the test target, e.g. make test-one TEST=postgres" >&2; exit 1; }
	$(CONFORMANCE_ENV) PATH="$(PALISADE_BIN_DIR):$$PATH" cargo test --locked --test $(TEST) -- $(ARGS)

# Benchmark figures (programs that print figures, not tests), in one run on the local
# control plane. Each part writes BENCH_DIR/<source>.json in the schema of
# benches/common/schema.rs: palisade-handover (benches/handover.rs, BENCH_ARGS), clientgo
# and rust-peers-* (the peers below), scale (benches/scale/, SCALE_ARGS), ha (benches/ha/:
# handovers across the two API servers of an HA plane of its own, and the failover gap
# when the leader's API server dies; HA_BENCH_ARGS), palisade-operator (benches/operator/:
# a fenced operator's admission cost, and its failover to the new leader's first
# accepted write; the chart installed for the run, helm from PALISADE_BIN_DIR;
# OPERATOR_BENCH_ARGS such as "--rounds 1000 --kills 60"); then
# benches/report.rs merges them into results.json, results.md (printed) and
# handover-latency.png. A part that fails is missing from the report ("not measured")
# and fails the target once the report is written.
BENCH_DIR := target/bench
# The scale bench's own defaults: 1,000 and 10,000 Leases; failover (20 kills, and 5
# with the old 15s/10s/2s timings) at 1,000; a storm at each size with bare-claim waiters,
# and at 1,000 a second one with library waiters and a third on 1,000 semaphores of 3.
SCALE_ARGS ?=
RUST_PEERS_TARGET := $(CURDIR)/target/rust-peers
bench: cluster databases objectstores linkproxy conformance-go-driver conformance-java-driver
	@rm -f $(BENCH_DIR)/*.json $(BENCH_DIR)/results.md $(BENCH_DIR)/*.png
	@mkdir -p $(BENCH_DIR)
	cargo bench --locked --no-run --bench handover --bench agent --bench report --bench ha --bench operator
	@failed=""; SECONDS=0; \
	cargo bench --locked --bench handover -- --out $(BENCH_DIR) $(BENCH_ARGS) || failed="$$failed handover"; \
	echo "make bench: palisade handover done at $$SECONDS s"; \
	$(MAKE) --no-print-directory bench-clientgo || failed="$$failed clientgo"; \
	echo "make bench: client-go done at $$SECONDS s"; \
	$(MAKE) --no-print-directory bench-rust-peers || failed="$$failed rust-peers"; \
	echo "make bench: Rust peers done at $$SECONDS s"; \
	cargo bench --locked --bench scale -- --out $(BENCH_DIR) $(SCALE_ARGS) || failed="$$failed scale"; \
	echo "make bench: scale done at $$SECONDS s"; \
	cargo bench --locked --bench fence_db -- --out $(BENCH_DIR) $(FENCE_DB_ARGS) || failed="$$failed fence-db"; \
	echo "make bench: fencing in PostgreSQL and Redis done at $$SECONDS s"; \
	cargo bench --locked --bench fence_s3 -- --out $(BENCH_DIR) $(FENCE_S3_ARGS) || failed="$$failed fence-s3"; \
	echo "make bench: the object-store fence done at $$SECONDS s"; \
	cargo bench --locked --bench outbox -- --out $(BENCH_DIR) $(OUTBOX_BENCH_ARGS) || failed="$$failed outbox"; \
	echo "make bench: the fenced outbox's relay done at $$SECONDS s"; \
	cargo bench --locked --bench semaphore -- --out $(BENCH_DIR) $(SEMAPHORE_BENCH_ARGS) || failed="$$failed semaphore"; \
	echo "make bench: semaphores done at $$SECONDS s"; \
	$(CONFORMANCE_ENV) cargo bench --locked --bench agent -- --out $(BENCH_DIR) $(AGENT_BENCH_ARGS) || failed="$$failed agent"; \
	echo "make bench: the agent against the library done at $$SECONDS s"; \
	cargo bench --locked --bench ha -- --out $(BENCH_DIR) $(HA_BENCH_ARGS) || failed="$$failed ha"; \
	echo "make bench: the HA control plane done at $$SECONDS s"; \
	PATH="$(PALISADE_BIN_DIR):$$PATH" cargo bench --locked --bench operator -- --out $(BENCH_DIR) \
		$(OPERATOR_BENCH_ARGS) || failed="$$failed operator"; \
	echo "make bench: fenced operators done at $$SECONDS s"; \
	publish=""; [ -n "$$failed" ] || publish="--publish docs/performance.md"; \
	cargo bench --locked --bench report -- --dir $(BENCH_DIR) $$publish || failed="$$failed report"; \
	if [ -n "$$failed" ]; then echo "make bench: failed:$$failed" >&2; exit 1; fi

# The peers for comparison: client-go's tools/leaderelection (benches/peers/clientgo:
# handovers and API cost, PEER_ARGS; then its failover mode, SIGKILL of the leading
# process to the standby's OnStartedLeading and to its first accepted write,
# FAILOVER_ARGS such as "--kills-default 5 --kills-tuned 20"), the Rust crates kube-leader-election and
# kubert (benches/peers/rust, RUST_PEER_ARGS).
bench-peers: bench-clientgo bench-rust-peers

bench-clientgo: cluster
	@mkdir -p $(BENCH_DIR)
	cd benches/peers/clientgo && CGO_ENABLED=0 go build -o $(CURDIR)/$(BENCH_DIR)/clientgo-bench .
	@failed=""; \
	$(BENCH_DIR)/clientgo-bench --kubeconfig $(KUBECONFIG_TEST) --out $(BENCH_DIR)/clientgo.json $(PEER_ARGS) \
		|| failed="$$failed handovers"; \
	$(BENCH_DIR)/clientgo-bench failover --kubeconfig $(KUBECONFIG_TEST) --out $(BENCH_DIR)/clientgo-failover.json \
		$(FAILOVER_ARGS) || failed="$$failed failover"; \
	if [ -n "$$failed" ]; then echo "bench-clientgo: failed:$$failed" >&2; exit 1; fi

# The fenced-operator figures alone, palisade's (benches/operator/, OPERATOR_BENCH_ARGS)
# and client-go's failover mode (FAILOVER_ARGS), with their report in OPERATOR_BENCH_DIR;
# nothing is published (make bench publishes every figure of one run at once).
OPERATOR_BENCH_DIR := target/bench-operator
bench-operator: cluster
	@rm -rf $(OPERATOR_BENCH_DIR) && mkdir -p $(OPERATOR_BENCH_DIR)
	cargo bench --locked --no-run --bench operator --bench report
	cd benches/peers/clientgo && CGO_ENABLED=0 go build -o $(CURDIR)/$(OPERATOR_BENCH_DIR)/clientgo-bench .
	@failed=""; \
	PATH="$(PALISADE_BIN_DIR):$$PATH" cargo bench --locked --bench operator -- --out $(OPERATOR_BENCH_DIR) \
		$(OPERATOR_BENCH_ARGS) || failed="$$failed operator"; \
	$(OPERATOR_BENCH_DIR)/clientgo-bench failover --kubeconfig $(KUBECONFIG_TEST) \
		--out $(OPERATOR_BENCH_DIR)/clientgo-failover.json $(FAILOVER_ARGS) || failed="$$failed clientgo-failover"; \
	cargo bench --locked --bench report -- --dir $(OPERATOR_BENCH_DIR) || failed="$$failed report"; \
	if [ -n "$$failed" ]; then echo "bench-operator: failed:$$failed" >&2; exit 1; fi

bench-rust-peers: cluster
	@mkdir -p $(BENCH_DIR)
	cd benches/peers/rust/kube-leader-election && CARGO_TARGET_DIR=$(RUST_PEERS_TARGET) cargo build --release --locked
	cd benches/peers/rust/kubert && CARGO_TARGET_DIR=$(RUST_PEERS_TARGET) cargo build --release --locked
	@failed=""; \
	$(RUST_PEERS_TARGET)/release/rustpeer-kle --kubeconfig $(KUBECONFIG_TEST) \
		--out $(BENCH_DIR)/rust-peers-kle.json $(RUST_PEER_ARGS) || failed="$$failed kube-leader-election"; \
	$(RUST_PEERS_TARGET)/release/rustpeer-kubert --kubeconfig $(KUBECONFIG_TEST) \
		--out $(BENCH_DIR)/rust-peers-kubert.json $(RUST_PEER_ARGS) || failed="$$failed kubert"; \
	if [ -n "$$failed" ]; then echo "bench-rust-peers: failed:$$failed" >&2; exit 1; fi

# The fault-injection suite on a control plane of its own (it crashes kube-apiserver
# and etcd; HA=1: on three etcd members and two API servers, docs/testing.md). `make
# test` runs it for 90 s with seed 1, and on the HA plane for 45 s; this runs DURATION with a new
# seed each time (printed, so a failing run can be repeated with SEED=). CHAOS_ARGS
# passes more flags, e.g. "--workers 8 --leases 4" for wider storms.
DURATION ?= 10m
SEED ?= $(shell date +%s)
CHAOS_ARGS ?=
chaos: controlplane-bins conformance-go-driver objectstores-venv $(if $(filter 1,$(HA)),linkproxy)
	$(CONFORMANCE_ENV) cargo test --locked --test chaos -- --duration $(DURATION) --seed $(SEED) \
		$(if $(filter 1,$(HA)),--ha) $(CHAOS_ARGS)

# The fencing story with real pods on the node; see tests/demo/demo-cluster.sh.
demo-cluster: cluster image-local
	KUBECONFIG=$(KUBECONFIG_TEST) KUBECTL=$(PALISADE_BIN_DIR)/kubectl HELM=$(PALISADE_BIN_DIR)/helm \
		tests/demo/demo-cluster.sh

# The fencing story with real processes; see tests/demo/demo.sh. Host processes on the
# bare control plane, etcd and kube-apiserver (a running cluster, node or not, is
# reused), so it builds only those, kubectl and palisade, cargo beside the Go builds
# (tests/demo/build.sh), and prints what each took.
DEMO_BINS := $(KUBE_BIN)/kube-apiserver $(KUBE_BIN)/kubectl $(ETCD_BIN)/etcd
demo-bins: $(DEMO_BINS)
	@mkdir -p $(PALISADE_BIN_DIR)
	@for b in $(DEMO_BINS); do ln -sf "$$b" $(PALISADE_BIN_DIR)/; done

demo:
	@MAKE="$(MAKE)" tests/demo/build.sh $(DEMO_BINS)
	@BIN_DIR=$(PALISADE_BIN_DIR) STATE_DIR=$(CLUSTER_DIR) BARE=1 tests/controlplane/cluster.sh up >/dev/null
	@KUBECONFIG=$(KUBECONFIG_TEST) PALISADE=$(CURDIR)/target/debug/palisade KUBECTL=$(PALISADE_BIN_DIR)/kubectl \
		tests/demo/demo.sh
