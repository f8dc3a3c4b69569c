# The test object stores (tests/objectstores/objectstores.sh): SeaweedFS' S3 gateway,
# whose conditional PUTs are atomic, and moto's server mode, whose are not. Included by
# the Makefile.
#
#   make objectstores          start (or reuse) both on 127.0.0.1 (S3_PORT, BROKEN_S3_PORT)
#   make objectstores-down     stop both and remove their state
#   make objectstores-status   exit 0 when both answer
#
# Both come from PyPI, pinned in tests/objectstores/requirements.txt, into a venv cached
# outside target/ and keyed by the file's hash, so `cargo clean` keeps it.

S3_PORT ?= 18333
BROKEN_S3_PORT ?= 18334
OBJECTSTORES_DIR := $(CURDIR)/target/objectstores
OBJECTSTORES_VENV := $(CACHE_DIR)/objectstores-venv-$(call content_key,tests/objectstores/requirements.txt)
# The chaos suite starts servers of its own from the same venv.
export PALISADE_OBJECTSTORES_VENV := $(OBJECTSTORES_VENV)
# The tests' servers and credentials (tests/s3/, `palisade fence check`).
export PALISADE_TEST_S3 := http://127.0.0.1:$(S3_PORT)
export PALISADE_TEST_S3_BROKEN := http://127.0.0.1:$(BROKEN_S3_PORT)
export AWS_ACCESS_KEY_ID ?= palisade-test
export AWS_SECRET_ACCESS_KEY ?= palisade-test-secret
export AWS_REGION ?= us-east-1
OBJECTSTORES_ENV = STATE_DIR=$(OBJECTSTORES_DIR) VENV=$(OBJECTSTORES_VENV) S3_PORT=$(S3_PORT) \
	BROKEN_S3_PORT=$(BROKEN_S3_PORT)

.PHONY: objectstores objectstores-down objectstores-status objectstores-venv

objectstores-venv: $(OBJECTSTORES_VENV)/.installed

# .installed is written last, so an interrupted install is never taken for a complete
# one (made in place: a venv's scripts name its path, so it cannot be moved). No
# prerequisite: the directory's name holds the requirements' hash, and a fresh clone's
# file, newer than any stamp, must not make it again.
$(OBJECTSTORES_VENV)/.installed:
	rm -rf $(OBJECTSTORES_VENV)
	$(PYTHON) -m venv $(OBJECTSTORES_VENV)
	$(OBJECTSTORES_VENV)/bin/pip install --quiet --disable-pip-version-check \
		-r tests/objectstores/requirements.txt
	touch $@

objectstores: objectstores-venv
	@$(OBJECTSTORES_ENV) tests/objectstores/objectstores.sh up

objectstores-down:
	@$(OBJECTSTORES_ENV) tests/objectstores/objectstores.sh down

objectstores-status:
	@$(OBJECTSTORES_ENV) tests/objectstores/objectstores.sh status

# The object-store fence's cost against a plain PUT (benches/fence_s3.rs), into BENCH_DIR.
.PHONY: bench-fence-s3
bench-fence-s3: objectstores
	cargo bench --locked --bench fence_s3 -- --out $(or $(BENCH_DIR),target/bench)
