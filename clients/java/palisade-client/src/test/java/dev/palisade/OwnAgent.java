package dev.palisade;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.fail;

import java.io.IOException;
import java.net.ServerSocket;
import java.net.URI;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.concurrent.TimeUnit;

/**
 * A `palisade agent` process of a test's own, in the namespace of the shared one (whose
 * controller grants its claims), on a Unix socket and a loopback TCP port. It needs the
 * palisade binary ($PALISADE_BIN, else target/debug/palisade) and the cluster's kubeconfig
 * ($KUBECONFIG, else target/cluster/kubeconfig).
 */
final class OwnAgent implements AutoCloseable {
    final Path socket;
    final URI url;
    private final Path log;
    private final Process process;
    private boolean stopped;

    OwnAgent() throws IOException, InterruptedException {
        String namespace;
        try (Session shared = AgentFixture.open()) {
            namespace = shared.namespace();
        }
        Path dir = Files.createTempDirectory("palisade-java-");
        socket = dir.resolve("agent.sock");
        log = dir.resolve("agent.log");
        int port;
        try (ServerSocket free = new ServerSocket(0)) {
            port = free.getLocalPort();
        }
        url = URI.create("http://127.0.0.1:" + port);
        ProcessBuilder builder = new ProcessBuilder(binary().toString(), "agent", "--namespace", namespace,
                "--socket", socket.toString(), "--listen", "127.0.0.1:" + port,
                "--token-dir", dir.resolve("leases").toString(), "--admin-addr", "127.0.0.1:0")
                .redirectErrorStream(true).redirectOutput(log.toFile());
        builder.environment().put("KUBECONFIG", kubeconfig().toString());
        process = builder.start();
        long until = System.nanoTime() + TimeUnit.SECONDS.toNanos(20);
        while (!Files.exists(socket)) {
            if (!process.isAlive() || System.nanoTime() > until) {
                process.destroyForcibly();
                fail("the agent did not start: " + Files.readString(log));
            }
            Thread.sleep(50);
        }
    }

    private static Path binary() {
        String env = System.getenv("PALISADE_BIN");
        Path p = env != null && !env.isEmpty() ? Path.of(env) : Repo.root().resolve("target/debug/palisade");
        if (!Files.isExecutable(p)) {
            fail("no palisade binary at " + p + " (set PALISADE_BIN, or `cargo build --bin palisade`)");
        }
        return p;
    }

    private static Path kubeconfig() {
        String env = System.getenv("KUBECONFIG");
        Path p = env != null && !env.isEmpty() ? Path.of(env) : Repo.root().resolve("target/cluster/kubeconfig");
        if (!Files.isReadable(p)) {
            fail("no kubeconfig at " + p + " (set KUBECONFIG; `make cluster` writes target/cluster/kubeconfig)");
        }
        return p;
    }

    boolean isAlive() {
        return process.isAlive();
    }

    /** Freezes the agent (SIGSTOP): it answers nothing, its connections stay open. */
    void freeze() throws IOException, InterruptedException {
        signal("STOP");
        stopped = true;
    }

    /** Thaws it (SIGCONT). */
    void thaw() throws IOException, InterruptedException {
        signal("CONT");
        stopped = false;
    }

    private void signal(String sig) throws IOException, InterruptedException {
        Process kill = new ProcessBuilder("kill", "-" + sig, Long.toString(process.pid())).inheritIO().start();
        assertEquals(0, kill.waitFor(), "kill -" + sig);
    }

    /** Thaws it if frozen, then stops it (SIGTERM: it releases its grants), or kills it after 10 s. */
    @Override
    public void close() throws IOException {
        try {
            if (stopped) {
                thaw();
            }
            process.destroy();
            if (!process.waitFor(10, TimeUnit.SECONDS)) {
                process.destroyForcibly();
            }
        } catch (InterruptedException e) {
            process.destroyForcibly();
            Thread.currentThread().interrupt();
        }
    }
}
