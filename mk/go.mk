# The Go client (clients/go), its client-go integration (clients/go/kube, a module of its
# own), its conformance driver (tests/conformance/go) and the Go example
# (examples/go-leader-redis). Included by the Makefile.
#
#   make go-client-check        go vet of the five modules, and their tests that need no agent
#                               (nor a cluster); clients/go/pgtest's need PostgreSQL (make
#                               databases, a prerequisite: reused when running)
#   make go-client-test         every test of the client, the TestAgent* ones against the agent
#                               at PALISADE_AGENT_SOCKET (which they need)
#   make conformance-go-driver  target/clients/palisade-conformance-go
#   make example-go-image       $(IMAGE_DIR)/go-leader-redis.tar, pushed to the cluster's registry
#                               as REGISTRY_GO_IMAGE (the kubelet pulls it from there)
#   make example-go-check       the example on the node: deploy, fail the leader over, check Redis
#   make chaospod-image         controller-runtime's example operator (examples/crd: ChaosPods) with
#                               palisade's leader election (tests/operators/chaospod), pushed as
#                               REGISTRY_CHAOSPOD_IMAGE
#   make chaospod-check         a real operator's deposed leader, fenced and not: its stale writes
#                               counted from the API server's audit log

.PHONY: go-client-check go-client-test conformance-go-driver example-go-image example-go-check \
	chaospod-image chaospod-check

GO_CLIENT_DIR := clients/go
GO_DRIVER_DIR := tests/conformance/go
GO_EXAMPLE_DIR := examples/go-leader-redis
GO_CLIENT_SRCS := $(shell find $(GO_CLIENT_DIR) -name '*.go' -o -name '*.lua' -o -name go.mod)
GO_STATIC_BUILD := CGO_ENABLED=0 go build -trimpath -ldflags "-s -w"
GO_DRIVER_BIN := target/clients/palisade-conformance-go
EXAMPLE_GO_IMAGE := palisade.local/go-leader-redis:1
REGISTRY_GO_IMAGE := $(PALISADE_TEST_REGISTRY)/go-leader-redis:1

# Tests that need no agent: the client's TestAgent* ones need a running agent. pgtest (a
# module of its own, so that the client requires no driver) runs palisade.Enqueue against
# PALISADE_TEST_POSTGRES, in a database it creates and drops.
go-client-check: databases
	cd $(GO_CLIENT_DIR) && go vet ./... && go test -skip '^TestAgent' ./...
	cd $(GO_CLIENT_DIR)/pgtest && go vet ./... && go test -count=1 ./...
	cd $(GO_CLIENT_DIR)/kube && go vet ./... && go test -skip '^TestCluster' ./...
	cd $(GO_DRIVER_DIR) && go vet ./... && go test ./...
	cd $(GO_EXAMPLE_DIR) && go vet ./... && go test ./...

go-client-test:
	@[ -n "$${PALISADE_AGENT_SOCKET:-}" ] || { echo "go-client-test: set PALISADE_AGENT_SOCKET to a running palisade agent's socket" >&2; exit 1; }
	cd $(GO_CLIENT_DIR) && go vet ./... && go test -count=1 ./...

conformance-go-driver: $(GO_DRIVER_BIN)

$(GO_DRIVER_BIN): $(GO_CLIENT_SRCS) $(wildcard $(GO_DRIVER_DIR)/*.go $(GO_DRIVER_DIR)/go.mod)
	@mkdir -p $(@D)
	cd $(GO_DRIVER_DIR) && go build -o $(CURDIR)/$@ .

# A static binary alone in its image: nothing else runs in it. Pushed by tag (PUSH_IMAGES,
# in the Makefile: fails when no registry runs).
example-go-image: $(CRANE_BIN)/crane $(IMAGE_DIR)/go-leader-redis.tar
	@$(PUSH_IMAGES) $(IMAGE_DIR)/go-leader-redis.tar $(REGISTRY_GO_IMAGE)

$(IMAGE_DIR)/go-leader-redis.tar: $(GO_CLIENT_SRCS) $(wildcard $(GO_EXAMPLE_DIR)/*.go $(GO_EXAMPLE_DIR)/go.mod $(GO_EXAMPLE_DIR)/go.sum) \
		tests/controlplane/images/docker-archive.sh
	@rm -rf $@.root && mkdir -p $@.root
	cd $(GO_EXAMPLE_DIR) && $(GO_STATIC_BUILD) -o $@.root/go-leader-redis .
	tests/controlplane/images/docker-archive.sh $@ $(EXAMPLE_GO_IMAGE) $@.root \
		'{"User":"65532:65532","Entrypoint":["/go-leader-redis"]}'
	@rm -rf $@.root

# controller-runtime's example operator (examples/crd of sigs.k8s.io/controller-runtime, which
# nobody on the project wrote), with one file of ours (leadership.go: --election=client-go|palisade)
# and a patch of its main.go: tests/operators/chaospod/source.sh copies main.go from the Go module
# cache into target/ and lays the build out there, and the static binary goes alone in its image,
# like the example's. -mod=mod: the build's go.mod takes in what this checkout's clients/go/kube
# requires, should it have moved on.
CHAOSPOD_DIR := tests/operators/chaospod
CHAOSPOD_BUILD := $(CURDIR)/target/operators/chaospod
CHAOSPOD_SRCS := $(addprefix $(CHAOSPOD_DIR)/,source.sh leadership.go main.go.patch go.mod.build go.sum.build)
CHAOSPOD_IMAGE := palisade.local/chaospod:1
REGISTRY_CHAOSPOD_IMAGE := $(PALISADE_TEST_REGISTRY)/chaospod:1

chaospod-image: $(CRANE_BIN)/crane $(IMAGE_DIR)/chaospod.tar
	@$(PUSH_IMAGES) $(IMAGE_DIR)/chaospod.tar $(REGISTRY_CHAOSPOD_IMAGE)

$(IMAGE_DIR)/chaospod.tar: $(CHAOSPOD_SRCS) $(GO_CLIENT_SRCS) tests/controlplane/images/docker-archive.sh
	@rm -rf $@.root && mkdir -p $@.root
	$(CHAOSPOD_DIR)/source.sh $(CHAOSPOD_BUILD)/src
	cd $(CHAOSPOD_BUILD)/src && $(GO_STATIC_BUILD) -mod=mod -o $@.root/chaospod .
	tests/controlplane/images/docker-archive.sh $@ $(CHAOSPOD_IMAGE) $@.root \
		'{"User":"65532:65532","Entrypoint":["/chaospod"]}'
	@rm -rf $@.root

# The palisade image (image-local) brings the agent and the chart's controller; the audit
# log is the API server's (tests/controlplane/audit-policy.yaml says what it holds).
chaospod-check: cluster image-local chaospod-image
	KUBECONFIG=$(KUBECONFIG_TEST) KUBECTL=$(PALISADE_BIN_DIR)/kubectl HELM=$(PALISADE_BIN_DIR)/helm \
		PALISADE_IMAGE=$(REGISTRY_IMAGE) OPERATOR_IMAGE=$(REGISTRY_CHAOSPOD_IMAGE) \
		AUDIT_LOG=$(CLUSTER_DIR)/kube-apiserver-audit.log $(CHAOSPOD_DIR)/check.sh

# The palisade image (image-local) brings the agent.
example-go-check: cluster databases image-local example-go-image
	KUBECONFIG=$(KUBECONFIG_TEST) KUBECTL=$(PALISADE_BIN_DIR)/kubectl HELM=$(PALISADE_BIN_DIR)/helm \
		PALISADE_IMAGE=$(REGISTRY_IMAGE) GO_IMAGE=$(REGISTRY_GO_IMAGE) REDIS_PORT=$(REDIS_PORT) $(GO_EXAMPLE_DIR)/check.sh
