# The Java client (clients/java: the core and its adapters, one Maven reactor) and its
# conformance driver (tests/conformance/java). Included by the Makefile.
#
#   make java-resolve           the one online Maven run: everything the reactor's build and tests
#                               need (plugins, surefire's JUnit provider, test libraries) into
#                               ~/.m2, recorded by a stamp in CACHE_DIR keyed by the poms' hash;
#                               every other target runs Maven offline (-o)
#   make java-build             mvn -o install -DskipTests of the reactor, then each module's jar
#                               as $(JAVA_OUT)/<artifactId>.jar and the PostgreSQL JDBC driver as
#                               $(JAVA_OUT)/lib/postgresql.jar (for the driver, examples, benches)
#   make java-client-check      every module's tests but those tagged agent or postgres (no agent,
#                               no cluster, no database)
#   make java-client-test       every test of the reactor; needs PALISADE_AGENT_SOCKET (a running
#                               agent) and PALISADE_TEST_PG_URL (a JDBC URL with user and password)
#   make conformance-java-driver  $(JAVA_DRIVER_BIN)

.PHONY: java-resolve java-build java-client-check java-client-test conformance-java-driver

JAVA_CLIENT_DIR := clients/java
JAVA_OUT := target/clients/java
JAVA_CLIENT_JAR := $(JAVA_OUT)/palisade-client.jar
JAVA_DRIVER_BIN := target/clients/palisade-conformance-java

# The reactor's modules (each directory is its artifactId) and version, from the parent pom.
JAVA_MODULES := $(shell sed -n 's:.*<module>\(.*\)</module>.*:\1:p' $(JAVA_CLIENT_DIR)/pom.xml)
JAVA_VERSION := $(shell sed -n 's:^  <version>\(.*\)</version>.*:\1:p' $(JAVA_CLIENT_DIR)/pom.xml | head -1)
JAVA_PG_VERSION := $(shell sed -n 's:.*<postgresql.version>\(.*\)</postgresql.version>.*:\1:p' $(JAVA_CLIENT_DIR)/pom.xml)
JAVA_POMS := $(JAVA_CLIENT_DIR)/pom.xml $(foreach m,$(JAVA_MODULES),$(JAVA_CLIENT_DIR)/$(m)/pom.xml)
JAVA_SRCS := $(JAVA_POMS) $(shell find $(JAVA_CLIENT_DIR) -path '*/target' -prune -o -type f -path '*/src/*' -print)
JAVA_JARS := $(foreach m,$(JAVA_MODULES),$(JAVA_OUT)/$(m).jar)
JAVA_PG_JAR := $(JAVA_OUT)/lib/postgresql.jar
MAVEN_REPO ?= $(HOME)/.m2/repository
JAVA_RESOLVED := $(CACHE_DIR)/maven-clients-java-$(call content_key,$(JAVA_POMS))
MVN := mvn -B -q

java-resolve: $(JAVA_RESOLVED)

# Resolving by running the build and the tests that need nothing (their failures ignored:
# this is about downloads) is the one way that also fetches what is only resolved when
# used: surefire's JUnit Platform provider, and the reactor's modules for one another.
$(JAVA_RESOLVED): $(JAVA_POMS)
	cd $(JAVA_CLIENT_DIR) && $(MVN) install -DexcludedGroups=agent,postgres -Dmaven.test.failure.ignore=true
	cd $(JAVA_CLIENT_DIR) && $(MVN) -N dependency:get -Dartifact=org.postgresql:postgresql:$(JAVA_PG_VERSION)
	@mkdir -p $(@D) && touch $@

java-build: $(JAVA_JARS) $(JAVA_PG_JAR)

$(JAVA_JARS) $(JAVA_PG_JAR) &: $(JAVA_RESOLVED) $(JAVA_SRCS)
	cd $(JAVA_CLIENT_DIR) && $(MVN) -o install -DskipTests
	@mkdir -p $(JAVA_OUT)/lib
	for m in $(JAVA_MODULES); do cp $(JAVA_CLIENT_DIR)/$$m/target/$$m-$(JAVA_VERSION).jar $(JAVA_OUT)/$$m.jar; done
	cp $(MAVEN_REPO)/org/postgresql/postgresql/$(JAVA_PG_VERSION)/postgresql-$(JAVA_PG_VERSION).jar $(JAVA_PG_JAR)

java-client-check: $(JAVA_RESOLVED)
	cd $(JAVA_CLIENT_DIR) && $(MVN) -o test -DexcludedGroups=agent,postgres

java-client-test: $(JAVA_RESOLVED)
	@[ -n "$${PALISADE_AGENT_SOCKET:-}" ] || { echo "java-client-test: set PALISADE_AGENT_SOCKET to a running palisade agent's socket (or run make java-client-check)" >&2; exit 1; }
	@[ -n "$${PALISADE_TEST_PG_URL:-}" ] || { echo "java-client-test: set PALISADE_TEST_PG_URL to a JDBC URL of a PostgreSQL database, e.g. jdbc:postgresql://127.0.0.1:15432/postgres?user=postgres" >&2; exit 1; }
	cd $(JAVA_CLIENT_DIR) && $(MVN) -o test

# The conformance driver: tests/conformance/java/Driver.java compiled against the client's jar
# into $(JAVA_OUT)/driver/, and its launcher $(JAVA_DRIVER_BIN), which finds both next to
# itself (any cwd). The launcher execs the JVM, so that the suite's SIGKILL, SIGSTOP and SIGTERM
# of its pid reach the JVM. JVM flags for a fast start and little background work: C1 only,
# class-data sharing, the serial GC, no perf-data file. -XDstringConcat=inline: string
# concatenation as plain StringBuilder code, not an invokedynamic bootstrapped on first use
# (milliseconds each, on the grant's path). Not -Werror: javac always warns that
# sun.misc.Signal (the driver's SIGTERM handler) is internal API, and no -Xlint key turns it off.
JAVA_DRIVER_SRC := tests/conformance/java/Driver.java
JAVA_DRIVER_CLASSES := $(JAVA_OUT)/driver
JAVA_DRIVER_FLAGS := -XX:TieredStopAtLevel=1 -Xshare:auto -XX:+UseSerialGC -XX:-UsePerfData
# The jar and the classes as the launcher finds them: relative to its own directory.
JAVA_DRIVER_CP := $$here/$(patsubst $(dir $(JAVA_DRIVER_BIN))%,%,$(JAVA_CLIENT_JAR)):$$here/$(patsubst \
	$(dir $(JAVA_DRIVER_BIN))%,%,$(JAVA_DRIVER_CLASSES))

conformance-java-driver: java-build $(JAVA_DRIVER_BIN)

$(JAVA_DRIVER_BIN): $(JAVA_CLIENT_JAR) $(JAVA_DRIVER_SRC)
	@rm -rf $(JAVA_DRIVER_CLASSES) && mkdir -p $(JAVA_DRIVER_CLASSES) $(@D)
	javac --release 17 -Xlint:all -XDstringConcat=inline -cp $(JAVA_CLIENT_JAR) \
		-d $(JAVA_DRIVER_CLASSES) $(JAVA_DRIVER_SRC)
	printf '%s\n' '#!/bin/sh' \
		'# The Java client'"'"'s conformance driver (tests/conformance/java); written by make.' \
		'here=$$(cd "$$(dirname "$$0")" && pwd)' \
		'exec java $(JAVA_DRIVER_FLAGS) -cp "$(JAVA_DRIVER_CP)" Driver "$$@"' >$@.tmp
	chmod +x $@.tmp && mv $@.tmp $@
