package dev.palisade;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assertions.fail;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.Tag;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

/**
 * A frozen agent (SIGSTOP) answers nothing: the grant must end at its local deadline by
 * this client's own clock. The test starts an agent of its own for that (freezing the
 * shared one would disturb the other tests), in the namespace of the shared one, whose
 * controller grants its claims. It needs the palisade binary ($PALISADE_BIN, else
 * target/debug/palisade) and the cluster's kubeconfig ($KUBECONFIG, else
 * target/cluster/kubeconfig).
 */
@Tag("agent")
@Timeout(value = 60, unit = TimeUnit.SECONDS)
class StoppedAgentTest {
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

    private static void signal(Process p, String sig) throws IOException, InterruptedException {
        Process kill = new ProcessBuilder("kill", "-" + sig, Long.toString(p.pid())).inheritIO().start();
        assertEquals(0, kill.waitFor(), "kill -" + sig);
    }

    @Test
    void aStoppedAgentsGrantEndsAtTheLocalDeadline() throws Exception {
        String namespace;
        try (Session shared = AgentFixture.open()) {
            namespace = shared.namespace();
        }
        Path dir = Files.createTempDirectory("palisade-java-");
        Path socket = dir.resolve("agent.sock");
        Path log = dir.resolve("agent.log");
        ProcessBuilder builder = new ProcessBuilder(binary().toString(), "agent", "--namespace", namespace,
                "--socket", socket.toString(), "--token-dir", dir.resolve("leases").toString(),
                "--admin-addr", "127.0.0.1:0")
                .redirectErrorStream(true).redirectOutput(log.toFile());
        builder.environment().put("KUBECONFIG", kubeconfig().toString());
        Process agent = builder.start();
        boolean stopped = false;
        try {
            long until = System.nanoTime() + TimeUnit.SECONDS.toNanos(20);
            while (!Files.exists(socket)) {
                if (!agent.isAlive() || System.nanoTime() > until) {
                    fail("the agent did not start: " + Files.readString(log));
                }
                Thread.sleep(50);
            }
            try (Session s = Session.open(SessionOptions.defaults().socket(socket))) {
                Grant g = s.acquire(AgentFixture.lease("sigstop"), AcquireOptions.defaults().durationSeconds(3));
                assertTrue(g.isValid());
                signal(agent, "STOP");
                stopped = true;
                long stopAt = System.nanoTime();
                LostReason reason = g.lost().get(10, TimeUnit.SECONDS);
                long lostAfterMs = (System.nanoTime() - stopAt) / 1_000_000;
                assertEquals(LostReason.LOCAL_DEADLINE, reason, "lost by the client's own clock");
                assertFalse(g.isValid());
                assertEquals(Duration.ZERO, g.validFor());
                // validForMs is at most two thirds of the 3 s duration, counted from a send
                // before the stop: the deadline passes within 2 s of it (and some slack for
                // the keepalive thread to wake).
                assertTrue(lostAfterMs <= 2500, "lost " + lostAfterMs + " ms after the stop");
                assertTrue(agent.isAlive(), "the agent was frozen, not dead: the client's clock decided");
                assertFalse(s.isEnded(), "the session lives until its keepalive is missed");
                // Thawed, so that closing the session is answered at once.
                signal(agent, "CONT");
                stopped = false;
            }
        } finally {
            if (stopped) {
                signal(agent, "CONT");
            }
            agent.destroy();
            if (!agent.waitFor(10, TimeUnit.SECONDS)) {
                agent.destroyForcibly();
            }
        }
    }
}
