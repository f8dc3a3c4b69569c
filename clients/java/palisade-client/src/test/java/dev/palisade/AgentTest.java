package dev.palisade;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.time.Duration;
import java.util.List;
import java.util.Optional;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicReference;
import org.junit.jupiter.api.Tag;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

/** The client against a real agent (at $PALISADE_AGENT_SOCKET). */
@Tag("agent")
@Timeout(value = 60, unit = TimeUnit.SECONDS)
class AgentTest {
    /** The session's claims of {@code lease} that are still live (waiting or held), asked of the agent. */
    private static List<Api.GrantInfo> liveClaims(Session s, String lease) {
        Transport.Response r = s.request(Endpoint.GET_SESSION, Api.ANSWER_MARGIN_NANOS);
        assertEquals(200, r.status(), r.text());
        return Api.sessionFromAnswer(r.status(), r.body()).grants().stream()
                .filter(g -> g.name().equals(lease) && (g.state().equals("waiting") || g.state().equals("held")))
                .toList();
    }

    @Test
    void acquireHoldsWithATokenAndReleaseFreesIt() throws Exception {
        String lease = AgentFixture.lease("basic");
        try (Session s = AgentFixture.open()) {
            assertFalse(s.id().isEmpty());
            assertFalse(s.namespace().isEmpty());
            assertEquals(Duration.ofSeconds(5), s.keepalive());
            Grant g = s.acquire(lease, AgentFixture.shortLease());
            assertTrue(g.token() > 0);
            assertEquals(lease, g.name());
            assertEquals(s.namespace(), g.namespace());
            assertEquals(Duration.ofSeconds(3), g.duration());
            assertTrue(g.claim() != null && !g.claim().isEmpty());
            assertTrue(g.claimUid() != null && !g.claimUid().isEmpty());
            assertTrue(g.isValid());
            assertTrue(g.lostReason().isEmpty());
            Duration left = g.validFor();
            assertTrue(left.compareTo(Duration.ZERO) > 0 && left.compareTo(Duration.ofSeconds(3)) <= 0, left.toString());
            assertFalse(g.lost().isDone());
            g.lost().complete(LostReason.EXPIRED); // a copy: the grant is not fooled
            assertTrue(g.isValid());
            assertFalse(g.lost().isDone());
            Duration checked = g.check();
            assertTrue(checked.compareTo(Duration.ZERO) > 0, checked.toString());
            AgentException twice = assertThrows(AgentException.class, () -> s.acquire(lease, AgentFixture.shortLease()));
            assertEquals("already_acquired", twice.code());
            assertEquals(409, twice.status().getAsInt());

            g.release();
            assertFalse(g.isValid());
            assertEquals(Duration.ZERO, g.validFor());
            assertEquals(Optional.of(LostReason.RELEASED), g.lostReason());
            assertEquals(LostReason.RELEASED, g.lost().get(1, TimeUnit.SECONDS));
            LeaseLostException e = assertThrows(LeaseLostException.class, g::check);
            assertEquals(LostReason.RELEASED, e.reason());
            g.release(); // idempotent
            assertTrue(liveClaims(s, lease).isEmpty());
        }
    }

    @Test
    void theGrantStaysValidPastItsFirstValidForByTheKeepalive() throws Exception {
        try (Session s = AgentFixture.open(); Grant g = s.acquire(AgentFixture.lease("renew"), AgentFixture.shortLease())) {
            Duration first = g.validFor();
            Thread.sleep(first.toMillis() + 1500);
            assertTrue(g.isValid(), "the session's GETs moved the deadline on");
            assertTrue(g.validFor().compareTo(Duration.ZERO) > 0);
            assertTrue(g.check().compareTo(Duration.ZERO) > 0);
        }
    }

    @Test
    void aSecondSessionWaitsAndGetsAHigherTokenAfterTheRelease() throws Exception {
        String lease = AgentFixture.lease("queue");
        try (Session first = AgentFixture.open(); Session second = AgentFixture.open()) {
            Grant g1 = first.acquire(lease, AgentFixture.shortLease());
            CompletableFuture<Grant> waiting = CompletableFuture.supplyAsync(() -> {
                try {
                    return second.acquire(lease, AgentFixture.shortLease());
                } catch (InterruptedException e) {
                    throw new IllegalStateException(e);
                }
            });
            Thread.sleep(1000);
            assertFalse(waiting.isDone(), "the second session must wait while the first holds");
            assertTrue(g1.isValid());
            long released = System.nanoTime();
            g1.release();
            Grant g2 = waiting.get(10, TimeUnit.SECONDS);
            long tookMs = (System.nanoTime() - released) / 1_000_000;
            assertTrue(g2.token() > g1.token(), g2.token() + " > " + g1.token());
            assertTrue(g2.isValid());
            assertTrue(tookMs < 5000, "the release handed the Lease over at once, not at expiry: " + tookMs + " ms");
            g2.release();
        }
    }

    @Test
    void tryAcquireTimesOutAndLeavesTheQueue() throws Exception {
        String lease = AgentFixture.lease("try");
        try (Session holder = AgentFixture.open(); Session other = AgentFixture.open()) {
            Grant g = holder.acquire(lease, AgentFixture.shortLease());
            long start = System.nanoTime();
            Optional<Grant> none = other.tryAcquire(lease, Duration.ofMillis(700), AgentFixture.shortLease());
            long tookMs = (System.nanoTime() - start) / 1_000_000;
            assertTrue(none.isEmpty());
            assertTrue(tookMs >= 650 && tookMs < 5000, tookMs + " ms");
            assertTrue(liveClaims(other, lease).isEmpty(), "the timed-out claim left the queue");
            g.release();
            // Nobody waits any more: a third session gets it at once.
            try (Session third = AgentFixture.open()) {
                Optional<Grant> got = third.tryAcquire(lease, Duration.ofSeconds(5), AgentFixture.shortLease());
                assertTrue(got.isPresent());
                assertTrue(got.get().token() > g.token());
                got.get().release();
            }
            // A free Lease within a zero timeout.
            Optional<Grant> free = other.tryAcquire(AgentFixture.lease("free"), Duration.ZERO, AgentFixture.shortLease());
            assertTrue(free.isEmpty() || free.get().isValid());
            free.ifPresent(Grant::release);
        }
    }

    @Test
    void anInterruptedAcquireLeavesTheQueueAndKeepsTheInterruptStatus() throws Exception {
        String lease = AgentFixture.lease("interrupt");
        try (Session holder = AgentFixture.open(); Session other = AgentFixture.open()) {
            Grant g = holder.acquire(lease, AgentFixture.shortLease());
            AtomicReference<Throwable> thrown = new AtomicReference<>();
            AtomicBoolean flagSet = new AtomicBoolean();
            Thread waiter = new Thread(() -> {
                try {
                    other.acquire(lease, AgentFixture.shortLease());
                } catch (Throwable t) {
                    thrown.set(t);
                    flagSet.set(Thread.currentThread().isInterrupted());
                }
            });
            waiter.start();
            Thread.sleep(800);
            assertTrue(waiter.isAlive(), "it waits for the Lease");
            assertEquals(1, liveClaims(other, lease).size(), "its claim waits in the queue");
            long start = System.nanoTime();
            waiter.interrupt();
            waiter.join(5000);
            assertFalse(waiter.isAlive());
            assertTrue(thrown.get() instanceof InterruptedException, String.valueOf(thrown.get()));
            assertTrue(flagSet.get(), "the interrupt status is set");
            assertTrue((System.nanoTime() - start) / 1_000_000 < 3000, "the interrupt ended the wait at once");
            assertTrue(liveClaims(other, lease).isEmpty(), "the interrupted claim left the queue");
            assertFalse(other.isEnded());
            g.release();
        }
    }

    @Test
    void openingASessionKeepsTheInterruptStatus() {
        Thread.currentThread().interrupt();
        try (Session s = AgentFixture.open()) {
            assertTrue(Thread.currentThread().isInterrupted(), "still set after open");
            assertFalse(s.isEnded());
        } finally {
            assertTrue(Thread.interrupted(), "still set after close");
        }
    }

    @Test
    void anAcquireStartedInterruptedThrowsAtOnce() {
        try (Session s = AgentFixture.open()) {
            Thread.currentThread().interrupt();
            assertThrows(InterruptedException.class, () -> s.acquire(AgentFixture.lease("pre"), AgentFixture.shortLease()));
            assertTrue(Thread.interrupted(), "the interrupt status stays set");
        }
    }

    @Test
    void theAgentsRefusalNamesTheField() {
        try (Session s = AgentFixture.open()) {
            AgentException e = assertThrows(AgentException.class, () -> s.acquire("Not_A_DNS_Label", AcquireOptions.defaults()));
            assertEquals(400, e.status().getAsInt());
            assertEquals("name", e.field().orElseThrow());
            assertFalse(s.isEnded());
        }
    }

    @Test
    void closingTheSessionReleasesItsGrants() throws Exception {
        String lease = AgentFixture.lease("close");
        Grant g;
        try (Session s = AgentFixture.open()) {
            g = s.acquire(lease, AgentFixture.shortLease());
            assertTrue(g.isValid());
        }
        assertFalse(g.isValid());
        assertEquals(LostReason.RELEASED, g.lost().get(1, TimeUnit.SECONDS));
        try (Session next = AgentFixture.open()) {
            long start = System.nanoTime();
            Optional<Grant> got = next.tryAcquire(lease, Duration.ofSeconds(5), AgentFixture.shortLease());
            assertTrue(got.isPresent(), "the closed session's Lease is free");
            assertTrue((System.nanoTime() - start) / 1_000_000 < 2500, "at once, not at expiry");
            assertTrue(got.get().token() > g.token());
            got.get().release();
        }
        LeaseLostException e = assertThrows(LeaseLostException.class, g::check);
        assertEquals(LostReason.RELEASED, e.reason());
    }

    @Test
    void aSessionEndedBehindTheClientsBackLosesItsGrants() throws Exception {
        try (Session s = AgentFixture.open()) {
            Grant g = s.acquire(AgentFixture.lease("ended"), AgentFixture.shortLease());
            endBehindItsBack(s);
            assertEquals(LostReason.SESSION_ENDED, g.lost().get(5, TimeUnit.SECONDS));
            assertFalse(g.isValid());
            assertTrue(s.isEnded());
            LeaseLostException e = assertThrows(LeaseLostException.class, () -> s.acquire("x", AcquireOptions.defaults()));
            assertEquals(LostReason.SESSION_ENDED, e.reason());
        }
    }

    /** DELETEs the session without the client knowing: the agent ends it, and its event stream. */
    static void endBehindItsBack(Session s) {
        Transport.Response r = s.request(Endpoint.END_SESSION, Api.ANSWER_MARGIN_NANOS);
        assertEquals(204, r.status(), r.text());
    }

    @Test
    void leaderElectionRunsTheLeaderAndInterruptsItOnLoss() throws Exception {
        String lease = AgentFixture.lease("leader");
        try (Session s = AgentFixture.open()) {
            AtomicReference<Grant> led = new AtomicReference<>();
            AtomicBoolean interrupted = new AtomicBoolean();
            Thread ender = new Thread(() -> {
                try {
                    while (led.get() == null) {
                        Thread.sleep(50);
                    }
                    Thread.sleep(500);
                    endBehindItsBack(s);
                } catch (InterruptedException e) {
                    Thread.currentThread().interrupt();
                }
            });
            ender.start();
            long start = System.nanoTime();
            Optional<LostReason> reason = LeaderElection.run(s, lease, AgentFixture.shortLease(), grant -> {
                led.set(grant);
                try {
                    while (true) {
                        assertTrue(grant.token() > 0);
                        Thread.sleep(100);
                    }
                } catch (InterruptedException e) {
                    interrupted.set(true);
                    throw e;
                }
            });
            ender.join();
            assertTrue(interrupted.get(), "the leader was interrupted");
            assertEquals(Optional.of(LostReason.SESSION_ENDED), reason);
            assertFalse(Thread.currentThread().isInterrupted(), "the loss's interrupt is not left behind");
            assertTrue((System.nanoTime() - start) / 1_000_000 < 10_000);
            assertFalse(led.get().isValid());
        }
    }

    @Test
    void leaderElectionReleasesWhenTheLeaderReturnsOrThrows() throws Exception {
        String lease = AgentFixture.lease("leader-ret");
        try (Session s = AgentFixture.open()) {
            AtomicReference<Grant> led = new AtomicReference<>();
            Optional<LostReason> reason = LeaderElection.run(s, lease, AgentFixture.shortLease(), grant -> {
                assertTrue(grant.isValid());
                led.set(grant);
            });
            assertEquals(Optional.empty(), reason);
            assertEquals(Optional.of(LostReason.RELEASED), led.get().lostReason());
            assertTrue(liveClaims(s, lease).isEmpty());
            IllegalStateException boom = new IllegalStateException("boom");
            IllegalStateException e = assertThrows(IllegalStateException.class,
                    () -> LeaderElection.run(s, lease, AgentFixture.shortLease(), grant -> {
                        led.set(grant);
                        throw boom;
                    }));
            assertEquals(boom, e);
            assertFalse(led.get().isValid());
            assertTrue(liveClaims(s, lease).isEmpty(), "released after the exception");
        }
    }

    @Test
    void theDefaultSessionComesFromTheEnvironment() throws Exception {
        AgentFixture.socket();
        Session s = Palisade.defaultSession();
        assertEquals(s, Palisade.defaultSession());
        try (Grant g = Palisade.acquire(AgentFixture.lease("default"), AgentFixture.shortLease())) {
            assertTrue(g.isValid());
        }
        s.close();
        Session again = Palisade.defaultSession();
        assertTrue(again != s && !again.isEnded(), "reopened after it ended");
        Optional<Grant> g = Palisade.tryAcquire(AgentFixture.lease("default"), Duration.ofSeconds(5), AgentFixture.shortLease());
        assertTrue(g.isPresent());
        g.get().release();
    }

    @Test
    void lostCompletesWithTheLossAfterAKeepaliveIsRefused() throws ExecutionException, InterruptedException {
        // The check of a grant whose session the agent forgot: a loss, not an error.
        try (Session s = AgentFixture.open()) {
            Grant g = s.acquire(AgentFixture.lease("forgot"), AgentFixture.shortLease());
            endBehindItsBack(s);
            assertThrows(LeaseLostException.class, g::check);
            assertEquals(LostReason.SESSION_ENDED, g.lost().get());
        }
    }
}
