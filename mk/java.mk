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
# into $(JAVA_DRIVER_DIR) (its classes, as a jar too), and its launcher $(JAVA_DRIVER_BIN), which
# finds them next to itself (any cwd). The launcher execs the JVM, so that the suite's SIGKILL,
# SIGSTOP and SIGTERM of its pid reach the JVM. JVM flags for a fast start and little background
# work: C1 only, the serial GC, no perf-data file, and class-data sharing from an archive made
# here of the JDK's default class list and every class of the client's and the driver's jars
# (parsed and verified once, not on the grant's path; a stale or unusable archive is ignored:
# -Xshare:auto). The JVM's own warnings go to stderr, never into the protocol on stdout.
# -XDstringConcat=inline: string concatenation as plain StringBuilder code, not an
# invokedynamic bootstrapped on first use (milliseconds each, on the grant's path). Not
# -Werror: javac always warns that sun.misc.Signal (the driver's SIGTERM handler) is internal
# API, and no -Xlint key turns that off.
JAVA_DRIVER_SRC := tests/conformance/java/Driver.java
JAVA_DRIVER_DIR := $(JAVA_OUT)/driver
JAVA_DRIVER_JAR := $(JAVA_DRIVER_DIR)/driver.jar
JAVA_DRIVER_CDS := $(JAVA_DRIVER_DIR)/driver.jsa
# The launcher's paths: relative to its own directory.
java_driver_rel = $$here/$(patsubst $(dir $(JAVA_DRIVER_BIN))%,%,$(1))
JAVA_DRIVER_FLAGS := -XX:TieredStopAtLevel=1 -XX:+UseSerialGC -XX:-UsePerfData \
	-Xshare:auto -XX:SharedArchiveFile="$(call java_driver_rel,$(JAVA_DRIVER_CDS))" \
	-Xlog:disable -Xlog:all=warning:stderr
JAVA_DRIVER_CP := $(call java_driver_rel,$(JAVA_CLIENT_JAR)):$(call java_driver_rel,$(JAVA_DRIVER_JAR))

conformance-java-driver: java-build $(JAVA_DRIVER_BIN)

$(JAVA_DRIVER_BIN): $(JAVA_CLIENT_JAR) $(JAVA_DRIVER_SRC) mk/java.mk
	@rm -rf $(JAVA_DRIVER_DIR) && mkdir -p $(JAVA_DRIVER_DIR)/classes $(@D)
	javac --release 17 -Xlint:all -XDstringConcat=inline -cp $(JAVA_CLIENT_JAR) \
		-d $(JAVA_DRIVER_DIR)/classes $(JAVA_DRIVER_SRC)
	jar cf $(JAVA_DRIVER_JAR) -C $(JAVA_DRIVER_DIR)/classes .
	{ cat "$$(java -XshowSettings:properties -version 2>&1 | sed -n 's/^ *java.home = //p')/lib/classlist" \
		2>/dev/null; for j in $(JAVA_CLIENT_JAR) $(JAVA_DRIVER_JAR); do jar tf $$j; done \
		| sed -n 's/\.class$$//p'; } >$(JAVA_DRIVER_DIR)/classlist
	java -Xshare:dump -XX:SharedClassListFile=$(JAVA_DRIVER_DIR)/classlist \
		-XX:SharedArchiveFile=$(JAVA_DRIVER_CDS) -cp $(CURDIR)/$(JAVA_CLIENT_JAR):$(CURDIR)/$(JAVA_DRIVER_JAR) \
		>$(JAVA_DRIVER_DIR)/cds.log 2>&1 || { cat $(JAVA_DRIVER_DIR)/cds.log >&2; exit 1; }
	printf '%s\n' '#!/bin/sh' \
		'# The Java client'"'"'s conformance driver (tests/conformance/java); written by make.' \
		'here=$$(cd "$$(dirname "$$0")" && pwd)' \
		'exec java $(JAVA_DRIVER_FLAGS) -cp "$(JAVA_DRIVER_CP)" Driver "$$@"' >$@.tmp
	chmod +x $@.tmp && mv $@.tmp $@
