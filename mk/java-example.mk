# examples/java-worker-postgres: its image, built from Debian's JRE packages, and its
# check on the node. Included by the Makefile, after mk/python.mk (whose DEBIAN_SOURCES,
# DEBIAN_SUITE, comma, space, image_nonroot_user and mmdebstrap-package it uses) and
# mk/java.mk (whose rule makes the client's jars in JAVA_OUT and the PostgreSQL driver, JAVA_PG_JAR).
#
#   make example-java-image   the worker's image, $(IMAGE_DIR)/java-worker-postgres.tar,
#                             pushed to the cluster's registry as REGISTRY_JAVA_WORKER_IMAGE
#   make example-java-check   examples/java-worker-postgres/check.sh on the node

.PHONY: example-java-image example-java-check

JAVA_EXAMPLE_DIR := examples/java-worker-postgres
JAVA_WORKER_IMAGE := palisade.local/java-worker-postgres:1
REGISTRY_JAVA_WORKER_IMAGE := $(PALISADE_TEST_REGISTRY)/java-worker-postgres:1
JAVA_EXAMPLE_JARS := $(JAVA_OUT)/palisade-client.jar $(JAVA_OUT)/palisade-jdbc.jar $(JAVA_PG_JAR)
JAVAC ?= javac
JAR ?= jar

# What the JVM loads for this worker (ldd of bin/java, lib/server/libjvm.so and the
# libraries of java.base: libjava, libjimage, libnio, libnet, libzip): libc, libgcc_s,
# libstdc++ and zlib. The JRE's package itself is fetched without the dependencies it
# declares (CUPS, fontconfig, FreeType, HarfBuzz, LCMS, libjpeg, NSS, ALSA, PC/SC and
# theirs: AWT, printing, sound, PKCS#11 and smart cards, which a headless worker never
# loads; 57 MB more). --variant=extract runs no maintainer scripts: nothing here needs
# one (Debian's JRE ships its class-data archive, lib/server/classes.jsa, in the package;
# update-alternatives' /usr/bin/java is not made, so the entrypoint names the JVM's path).
JAVA_IMAGE_PACKAGES := libc6 libgcc-s1 libstdc++6 zlib1g
JAVA_IMAGE_JRE := openjdk-17-jre-headless
JAVA_IMAGE_JAVA := /usr/lib/jvm/java-17-openjdk-amd64/bin/java
# In the hook, apt is mmdebstrap's (its sources, its freshly read package lists).
JAVA_IMAGE_JRE_HOOK := cd "$$1/tmp" && APT_CONFIG="$$MMDEBSTRAP_APT_CONFIG" apt-get download -qq $(JAVA_IMAGE_JRE) \
	&& dpkg-deb --extract $(JAVA_IMAGE_JRE)_*.deb "$$1" && rm $(JAVA_IMAGE_JRE)_*.deb
# Cached outside target/, keyed like PYTHON_ROOTFS by the suite, the packages and the sources.
JAVA_ROOTFS := $(CACHE_DIR)/debian-rootfs-$(DEBIAN_SUITE)-$(shell { echo '$(JAVA_IMAGE_PACKAGES) $(JAVA_IMAGE_JRE)'; \
	cat $(DEBIAN_SOURCES) 2>/dev/null; } | sha256sum | cut -c1-12).tar
JAVA_IMAGE_ROOT := $(IMAGE_DIR)/java-worker-postgres.root
JAVA_EXAMPLE_CLASSES := target/examples/java-worker-postgres/classes

# The extract hook, not a customize hook: mmdebstrap's extract variant runs no customize hook.
$(JAVA_ROOTFS): | mmdebstrap-package
	@mkdir -p $(@D)
	mmdebstrap --quiet --variant=extract --include=$(subst $(space),$(comma),$(JAVA_IMAGE_PACKAGES)) \
		--extract-hook='$(JAVA_IMAGE_JRE_HOOK)' --skip=output/dev $(DEBIAN_SUITE) $@.tmp.tar $(DEBIAN_SOURCES)
	mv $@.tmp.tar $@

$(IMAGE_DIR)/java-worker-postgres.tar: $(JAVA_ROOTFS) $(JAVA_EXAMPLE_JARS) $(JAVA_EXAMPLE_DIR)/Worker.java \
		tests/controlplane/images/docker-archive.sh mk/java-example.mk
	@rm -rf $(JAVA_IMAGE_ROOT) $(JAVA_EXAMPLE_CLASSES) && mkdir -p $(JAVA_IMAGE_ROOT) $(JAVA_EXAMPLE_CLASSES)
	$(JAVAC) --release 17 -Xlint:all -Werror -cp $(subst $(space),:,$(JAVA_EXAMPLE_JARS)) \
		-d $(JAVA_EXAMPLE_CLASSES) $(JAVA_EXAMPLE_DIR)/Worker.java
	tar -C $(JAVA_IMAGE_ROOT) -xf $(JAVA_ROOTFS)
	@# What a container never reads: documentation, translations, package-manager state;
	@# javac's --release data (ct.sym) and the class-data archive for heaps over 32 GB.
	cd $(JAVA_IMAGE_ROOT) && rm -rf usr/share/doc usr/share/man usr/share/info usr/share/locale \
		usr/share/lintian usr/share/bug usr/share/gdb var/cache/* var/lib/apt/lists/* var/log/* \
		usr/lib/jvm/java-17-openjdk-amd64/man usr/lib/jvm/java-17-openjdk-amd64/lib/ct.sym \
		usr/lib/jvm/java-17-openjdk-amd64/lib/server/classes_nocoops.jsa
	$$(command -v ldconfig || echo /sbin/ldconfig) -r $(JAVA_IMAGE_ROOT)
	install -d $(JAVA_IMAGE_ROOT)/app/lib
	@# A fixed date in the jar, as in the layer: the same sources make the same image.
	$(JAR) --create --date=1980-01-02T00:00:00Z --file $(JAVA_IMAGE_ROOT)/app/worker.jar -C $(JAVA_EXAMPLE_CLASSES) .
	install -m 0644 $(JAVA_EXAMPLE_JARS) $(JAVA_IMAGE_ROOT)/app/lib/
	$(call image_nonroot_user,$(JAVA_IMAGE_ROOT))
	@# -XX:-UsePerfData: no hsperfdata file in /tmp, which the pod mounts read-only.
	tests/controlplane/images/docker-archive.sh $@ $(JAVA_WORKER_IMAGE) $(JAVA_IMAGE_ROOT) \
		'{"User":"65532:65532","Entrypoint":["$(JAVA_IMAGE_JAVA)","-XX:-UsePerfData","-cp","/app/worker.jar:/app/lib/*","Worker"],"WorkingDir":"/app","Env":["PATH=/usr/bin:/bin","HOME=/tmp"]}'
	@rm -rf $(JAVA_IMAGE_ROOT)
	@echo "$@: $$(du -h $@ | cut -f1)"

# Pushed by tag (PUSH_IMAGES, in the Makefile: fails when no registry runs).
example-java-image: $(CRANE_BIN)/crane $(IMAGE_DIR)/java-worker-postgres.tar
	@$(PUSH_IMAGES) $(IMAGE_DIR)/java-worker-postgres.tar $(REGISTRY_JAVA_WORKER_IMAGE)

example-java-check: cluster databases image-local example-java-image
	KUBECONFIG=$(KUBECONFIG_TEST) KUBECTL=$(PALISADE_BIN_DIR)/kubectl HELM=$(PALISADE_BIN_DIR)/helm \
		IMAGE=$(REGISTRY_IMAGE) WORKER_IMAGE=$(REGISTRY_JAVA_WORKER_IMAGE) PG_PORT=$(PG_PORT) \
		$(JAVA_EXAMPLE_DIR)/check.sh
