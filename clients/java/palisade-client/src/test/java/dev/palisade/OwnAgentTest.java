package dev.palisade;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.time.Duration;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.Tag;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

/** Tests that need an agent of their own ({@link OwnAgent}): freezing the shared one would disturb the others. */
@Tag("agent")
@Timeout(value = 60, unit = TimeUnit.SECONDS)
class OwnAgentTest {
    /** A frozen agent (SIGSTOP) answers nothing: the grant must end at its local deadline by this client's clock. */
    @Test
    void aStoppedAgentsGrantEndsAtTheLocalDeadline() throws Exception {
        try (OwnAgent agent = new OwnAgent(); Session s = Session.open(SessionOptions.defaults().socket(agent.socket))) {
            Grant g = s.acquire(AgentFixture.lease("sigstop"), AcquireOptions.defaults().durationSeconds(3));
            assertTrue(g.isValid());
            agent.freeze();
            long stopAt = System.nanoTime();
            LostReason reason = g.lost().get(10, TimeUnit.SECONDS);
            long lostAfterMs = (System.nanoTime() - stopAt) / 1_000_000;
            assertEquals(LostReason.LOCAL_DEADLINE, reason, "lost by the client's own clock");
            assertFalse(g.isValid());
            assertEquals(Duration.ZERO, g.validFor());
            // validForMs is at most two thirds of the 3 s duration, counted from a send before
            // the stop: the deadline passes within 2 s of it (plus slack for the thread to wake).
            assertTrue(lostAfterMs <= 2500, "lost " + lostAfterMs + " ms after the stop");
            assertTrue(agent.isAlive(), "the agent was frozen, not dead: the client's clock decided");
            assertFalse(s.isEnded(), "the session lives until its keepalive is missed");
            agent.thaw(); // so that closing the session is answered at once
        }
    }

    /** No keepalive answered within the session's keepalive: the session ends, by this client's clock. */
    @Test
    void aStoppedAgentsSessionEndsWhenItsKeepaliveIsMissed() throws Exception {
        try (OwnAgent agent = new OwnAgent();
                Session s = Session.open(SessionOptions.defaults().socket(agent.socket).keepalive(Duration.ofSeconds(1)))) {
            assertEquals(Duration.ofSeconds(1), s.keepalive());
            Grant g = s.acquire(AgentFixture.lease("missed"), AcquireOptions.defaults().durationSeconds(6));
            agent.freeze();
            long stopAt = System.nanoTime();
            // validForMs is bounded by the session's end too: the grant ends at about the
            // same instant, by whichever of the two deadlines the clock reads first.
            LostReason grantReason = g.lost().get(10, TimeUnit.SECONDS);
            assertTrue(grantReason == LostReason.LOCAL_DEADLINE || grantReason == LostReason.KEEPALIVE_MISSED,
                    grantReason.toString());
            long until = System.nanoTime() + TimeUnit.SECONDS.toNanos(5);
            while (!s.isEnded() && System.nanoTime() < until) {
                Thread.sleep(20);
            }
            long endedAfterMs = (System.nanoTime() - stopAt) / 1_000_000;
            assertTrue(s.isEnded(), "the session ended");
            assertTrue(endedAfterMs <= 1500, "within the keepalive of the last answer: " + endedAfterMs + " ms");
            LeaseLostException e = assertThrows(LeaseLostException.class,
                    () -> s.acquire(AgentFixture.lease("after"), AgentFixture.shortLease()));
            assertEquals(LostReason.KEEPALIVE_MISSED, e.reason());
            agent.thaw();
        }
    }

    /** PALISADE_AGENT_URL's way: HTTP on a loopback TCP port. */
    @Test
    void aSessionOverLoopbackTcp() throws Exception {
        try (OwnAgent agent = new OwnAgent(); Session s = Session.open(SessionOptions.defaults().url(agent.url))) {
            String lease = AgentFixture.lease("tcp");
            try (Grant g = s.acquire(lease, AgentFixture.shortLease())) {
                assertTrue(g.isValid());
                assertTrue(g.check().compareTo(Duration.ZERO) > 0);
                assertTrue(s.tryAcquire(lease + "-other", Duration.ofSeconds(5), AgentFixture.shortLease())
                        .map(other -> {
                            other.release();
                            return true;
                        }).orElse(false));
            }
            assertFalse(s.isEnded());
        }
    }
}
