# Python: the thin client of `palisade agent` (clients/python), its conformance driver
# (tests/conformance/python) and examples/python-worker-postgres. Included by the Makefile.
#
#   make python-venv           target/venv: clients/python[test] (editable) and psycopg
#   make python-client-check   the client's tests that need no agent: the unit tests, and the
#                              outbox's against PostgreSQL (make databases, a prerequisite:
#                              reused when running; the Makefile exports PALISADE_TEST_POSTGRES)
#   make python-client-test    all of its tests; needs PALISADE_AGENT_SOCKET (a running agent)
#   make example-python-image  the worker's image, $(IMAGE_DIR)/python-worker-postgres.tar,
#                              pushed to the cluster's registry as REGISTRY_PYTHON_WORKER_IMAGE
#   make example-python-check  examples/python-worker-postgres/check.sh on the node

PYTHON ?= python3
PYTHON_VENV := $(CURDIR)/target/venv
PYTHON_VENV_BIN := $(PYTHON_VENV)/bin
# "PYTHON SCRIPT" of the conformance suite's Python driver (PALISADE_CONFORMANCE_PYTHON).
PYTHON_CONFORMANCE_DRIVER := $(PYTHON_VENV_BIN)/python $(CURDIR)/tests/conformance/python/driver.py

.PHONY: python-venv python-client-check python-client-test example-python-image example-python-check \
	mmdebstrap-package

python-venv: $(PYTHON_VENV)/.installed

# Made anew when the package's metadata changes; the install is editable, so edits of the
# sources need nothing. psycopg: for running the example's worker outside its image.
$(PYTHON_VENV)/.installed: clients/python/pyproject.toml mk/python.mk
	rm -rf $(PYTHON_VENV)
	$(PYTHON) -m venv $(PYTHON_VENV)
	$(PYTHON_VENV_BIN)/pip install --quiet --disable-pip-version-check -e 'clients/python[test]' 'psycopg>=3.1'
	touch $@

python-client-check: python-venv databases
	cd clients/python && $(PYTHON_VENV_BIN)/python -m pytest -q -m 'not agent'

python-client-test: python-venv databases
	@if [ -z "$${PALISADE_AGENT_SOCKET:-}" ]; then \
		echo "python-client-test: set PALISADE_AGENT_SOCKET to a running agent's socket (or run make python-client-check)" >&2; \
		exit 2; fi
	cd clients/python && $(PYTHON_VENV_BIN)/python -m pytest -q

# --- the example's image: a Debian root filesystem without a daemon ---------------

PYTHON_WORKER_IMAGE := palisade.local/python-worker-postgres:1
REGISTRY_PYTHON_WORKER_IMAGE := $(PALISADE_TEST_REGISTRY)/python-worker-postgres:1
# The interpreter, psycopg with libpq, and ldconfig: psycopg finds libpq through
# ctypes.util.find_library, which asks `ldconfig -p`.
PYTHON_IMAGE_PACKAGES := python3-minimal python3-psycopg libc-bin
# The host's own apt sources are the mirror (mmdebstrap reads the file).
DEBIAN_SOURCES ?= $(firstword $(wildcard /etc/apt/sources.list.d/debian.sources /etc/apt/sources.list))
DEBIAN_SUITE ?= $(shell . /etc/os-release && echo $$VERSION_CODENAME)
comma := ,
empty :=
space := $(empty) $(empty)
# An example image's user 65532 (nonroot, home /tmp) and its writable /tmp; used by the
# Python and Java examples' image rules.
image_nonroot_user = mkdir -p $(1)/tmp && chmod 1777 $(1)/tmp && \
	printf 'root:x:0:0:root:/root:/usr/sbin/nologin\nnonroot:x:65532:65532:nonroot:/tmp:/usr/sbin/nologin\n' \
		>$(1)/etc/passwd && \
	printf 'root:x:0:\nnonroot:x:65532:\n' >$(1)/etc/group
# Cached outside target/, keyed by the suite, the package list and the sources, so a
# second run (or a cargo clean) does not download again.
PYTHON_ROOTFS := $(CACHE_DIR)/debian-rootfs-$(DEBIAN_SUITE)-$(shell { echo '$(PYTHON_IMAGE_PACKAGES)'; \
	cat $(DEBIAN_SOURCES) 2>/dev/null; } | sha256sum | cut -c1-12).tar
PYTHON_IMAGE_ROOT := $(IMAGE_DIR)/python-worker-postgres.root

mmdebstrap-package:
	@command -v mmdebstrap >/dev/null || { echo "installing: mmdebstrap"; \
		apt-get update -qq && apt-get install -y -qq --no-install-recommends mmdebstrap; }

# --variant=extract: the packages and their dependencies unpacked, no maintainer
# scripts (nothing in the image runs them); no /dev (the runtime provides it).
$(PYTHON_ROOTFS): | mmdebstrap-package
	@mkdir -p $(@D)
	mmdebstrap --quiet --variant=extract --include=$(subst $(space),$(comma),$(PYTHON_IMAGE_PACKAGES)) \
		--skip=output/dev $(DEBIAN_SUITE) $@.tmp.tar $(DEBIAN_SOURCES)
	mv $@.tmp.tar $@

$(IMAGE_DIR)/python-worker-postgres.tar: $(PYTHON_ROOTFS) $(wildcard clients/python/src/palisade/*.py) \
		examples/python-worker-postgres/worker.py tests/controlplane/images/docker-archive.sh mk/python.mk
	@rm -rf $(PYTHON_IMAGE_ROOT) && mkdir -p $(PYTHON_IMAGE_ROOT)
	tar -C $(PYTHON_IMAGE_ROOT) -xf $(PYTHON_ROOTFS)
	@# What a container never reads: documentation, translations, package-manager state.
	cd $(PYTHON_IMAGE_ROOT) && rm -rf usr/share/doc usr/share/man usr/share/info usr/share/locale \
		usr/share/lintian usr/share/bug var/cache/* var/lib/apt/lists/* var/log/*
	$$(command -v ldconfig || echo /sbin/ldconfig) -r $(PYTHON_IMAGE_ROOT)
	install -d $(PYTHON_IMAGE_ROOT)/usr/lib/python3/dist-packages/palisade $(PYTHON_IMAGE_ROOT)/app
	install -m 0644 clients/python/src/palisade/*.py clients/python/src/palisade/py.typed \
		$(PYTHON_IMAGE_ROOT)/usr/lib/python3/dist-packages/palisade/
	install -m 0644 examples/python-worker-postgres/worker.py $(PYTHON_IMAGE_ROOT)/app/
	$(call image_nonroot_user,$(PYTHON_IMAGE_ROOT))
	tests/controlplane/images/docker-archive.sh $@ $(PYTHON_WORKER_IMAGE) $(PYTHON_IMAGE_ROOT) \
		'{"User":"65532:65532","Entrypoint":["/usr/bin/python3","-u","/app/worker.py"],"WorkingDir":"/app","Env":["PATH=/usr/bin:/bin","HOME=/tmp","PYTHONDONTWRITEBYTECODE=1"]}'
	@rm -rf $(PYTHON_IMAGE_ROOT)
	@echo "$@: $$(du -h $@ | cut -f1)"

# Pushed by tag (PUSH_IMAGES, in the Makefile: fails when no registry runs).
example-python-image: $(CRANE_BIN)/crane $(IMAGE_DIR)/python-worker-postgres.tar
	@$(PUSH_IMAGES) $(IMAGE_DIR)/python-worker-postgres.tar $(REGISTRY_PYTHON_WORKER_IMAGE)

example-python-check: cluster databases image-local example-python-image
	KUBECONFIG=$(KUBECONFIG_TEST) KUBECTL=$(PALISADE_BIN_DIR)/kubectl HELM=$(PALISADE_BIN_DIR)/helm \
		IMAGE=$(REGISTRY_IMAGE) WORKER_IMAGE=$(REGISTRY_PYTHON_WORKER_IMAGE) PG_PORT=$(PG_PORT) \
		examples/python-worker-postgres/check.sh
