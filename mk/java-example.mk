# examples/java-worker-postgres: its image, built from Debian's JRE packages, and its
# check on the node. Included by the Makefile.
# (Being written: the targets below are placeholders that fail.)

.PHONY: example-java-image example-java-check

example-java-image example-java-check:
	@echo "$@: not written yet" >&2; exit 1
