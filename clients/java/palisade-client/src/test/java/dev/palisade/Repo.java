package dev.palisade;

import java.nio.file.Files;
import java.nio.file.Path;

/** The repository's root, found by walking up from the working directory. */
final class Repo {
    private Repo() {}

    static Path root() {
        for (Path p = Path.of("").toAbsolutePath(); p != null; p = p.getParent()) {
            if (Files.isRegularFile(p.resolve("src/agent/openapi.yaml")) && Files.isDirectory(p.resolve("clients"))) {
                return p;
            }
        }
        throw new AssertionError("no src/agent/openapi.yaml above " + Path.of("").toAbsolutePath()
                + ": run the tests inside the palisade repository");
    }
}
