package dev.palisade;

import static org.junit.jupiter.api.Assertions.fail;

import java.nio.file.Files;
import java.nio.file.Path;
import java.util.concurrent.atomic.AtomicInteger;

/** The agent the agent-tagged tests run against: at $PALISADE_AGENT_SOCKET, which they need. */
final class AgentFixture {
    private static final AtomicInteger SEQ = new AtomicInteger();

    private AgentFixture() {}

    static Path socket() {
        String s = System.getenv("PALISADE_AGENT_SOCKET");
        if (s == null || s.isEmpty()) {
            fail("PALISADE_AGENT_SOCKET is not set: these tests need a running palisade agent "
                    + "(make java-client-test, or tests/clients.rs, starts one)");
        }
        Path p = Path.of(s);
        if (!Files.exists(p)) {
            fail("PALISADE_AGENT_SOCKET=" + s + ": no such socket (is the agent running?)");
        }
        return p;
    }

    static Session open() {
        return Session.open(SessionOptions.defaults().socket(socket()).name("java-client-test"));
    }

    /** A Lease name of its own for each test (and each run: a short random part). */
    static String lease(String what) {
        return "java-" + what + "-" + Long.toString(System.nanoTime() % 1_000_000, 36) + "-" + SEQ.incrementAndGet();
    }

    /** Short leases keep the tests fast. */
    static AcquireOptions shortLease() {
        return AcquireOptions.defaults().durationSeconds(3);
    }
}
