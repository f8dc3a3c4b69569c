# The Java client (clients/java: the core and its adapters, one Maven reactor) and its
# conformance driver (tests/conformance/java). Included by the Makefile.
# (Being written: the targets below are placeholders that fail.)

.PHONY: java-build java-client-check conformance-java-driver

JAVA_CLIENT_DIR := clients/java
JAVA_OUT := target/clients/java
JAVA_CLIENT_JAR := $(JAVA_OUT)/palisade-client.jar
JAVA_DRIVER_BIN := target/clients/palisade-conformance-java

java-build java-client-check conformance-java-driver:
	@echo "$@: not written yet" >&2; exit 1
