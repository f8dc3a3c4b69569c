package dev.palisade.spring.integration;

import dev.palisade.AcquireOptions;
import dev.palisade.LostReason;
import dev.palisade.Session;
import dev.palisade.SessionOptions;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Tag;
import org.junit.jupiter.api.Test;

import java.io.IOException;
import java.net.UnixDomainSocketAddress;
import java.nio.ByteBuffer;
import java.nio.channels.SocketChannel;
import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.ConcurrentModificationException;
import java.util.List;
import java.util.UUID;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assertions.fail;

/** Two registries on two sessions of a real agent ($PALISADE_AGENT_SOCKET). */
@Tag("agent")
class PalisadeLockAgentTest {
    // Longer than any wait here: only a release lets the other registry in.
    private static final AcquireOptions OPTIONS = AcquireOptions.defaults().durationSeconds(60);

    private final List<Session> sessions = new ArrayList<>();
    private PalisadeLockRegistry one;
    private PalisadeLockRegistry two;
    private String key;

    private Session openSession(String label) {
        String socket = System.getenv("PALISADE_AGENT_SOCKET");
        if (socket == null || socket.isEmpty()) {
            fail("PALISADE_AGENT_SOCKET is not set: these tests need a running palisade agent (see README.md, Tests)");
        }
        Session session = Session.open(SessionOptions.defaults().socket(Path.of(socket)).name(label));
        sessions.add(session);
        return session;
    }

    @BeforeEach
    void open() {
        one = new PalisadeLockRegistry(openSession("spring-test-1"), OPTIONS, Duration.ofSeconds(2));
        two = new PalisadeLockRegistry(openSession("spring-test-2"), OPTIONS, Duration.ofSeconds(2));
        key = "spring-" + UUID.randomUUID().toString().substring(0, 8);
    }

    @AfterEach
    void close() {
        sessions.forEach(Session::close);
    }

    @Test
    void mutualExclusionAcrossTwoRegistriesAndIncreasingTokens() throws Exception {
        int threadsPerRegistry = 2;
        int rounds = 3;
        AtomicInteger inside = new AtomicInteger();
        AtomicInteger overlaps = new AtomicInteger();
        List<Long> tokens = new ArrayList<>();
        ExecutorService pool = Executors.newFixedThreadPool(2 * threadsPerRegistry);
        try {
            List<Future<?>> workers = new ArrayList<>();
            for (int t = 0; t < 2 * threadsPerRegistry; t++) {
                PalisadeLockRegistry registry = t % 2 == 0 ? one : two;
                workers.add(pool.submit(() -> {
                    for (int r = 0; r < rounds; r++) {
                        PalisadeLock lock = registry.obtain(key);
                        lock.lock();
                        try {
                            if (inside.incrementAndGet() > 1) {
                                overlaps.incrementAndGet();
                            }
                            synchronized (tokens) {
                                tokens.add(lock.token());
                            }
                            Thread.sleep(20);
                            inside.decrementAndGet();
                        } finally {
                            lock.unlock();
                        }
                    }
                    return null;
                }));
            }
            for (Future<?> w : workers) {
                w.get(120, TimeUnit.SECONDS);
            }
        } finally {
            pool.shutdownNow();
        }
        assertEquals(0, overlaps.get(), "two holders at once");
        assertEquals(2 * threadsPerRegistry * rounds, tokens.size());
        for (int i = 1; i < tokens.size(); i++) {
            assertTrue(tokens.get(i) > tokens.get(i - 1), "tokens not strictly increasing in lock order: " + tokens);
        }
    }

    @Test
    void tryLockWithATimeoutFailsWhileHeldAndSucceedsAfterUnlock() throws Exception {
        PalisadeLock held = one.obtain(key);
        held.lock();
        long first = held.token();
        PalisadeLock other = two.obtain(key);
        CompletableFuture<Boolean> whileHeld = CompletableFuture.supplyAsync(() -> {
            try {
                long start = System.nanoTime();
                boolean got = other.tryLock(1, TimeUnit.SECONDS);
                assertTrue(System.nanoTime() - start >= TimeUnit.MILLISECONDS.toNanos(900), "gave up before its timeout");
                return got || other.tryLock();
            } catch (InterruptedException e) {
                throw new AssertionError(e);
            }
        });
        assertFalse(whileHeld.get(30, TimeUnit.SECONDS), "got the lock while the other registry held it");
        held.unlock();
        CompletableFuture<Long> after = CompletableFuture.supplyAsync(() -> {
            try {
                assertTrue(other.tryLock(10, TimeUnit.SECONDS), "not granted after unlock");
                try {
                    return other.token();
                } finally {
                    other.unlock();
                }
            } catch (InterruptedException e) {
                throw new AssertionError(e);
            }
        });
        long second = after.get(30, TimeUnit.SECONDS);
        assertTrue(second > first, "token " + second + " after " + first);
    }

    @Test
    void lockInterruptiblyIsInterruptedAndLeavesTheQueue() throws Exception {
        PalisadeLock held = one.obtain(key);
        held.lock();
        PalisadeLock waiting = two.obtain(key);
        CountDownLatch started = new CountDownLatch(1);
        CompletableFuture<Throwable> outcome = new CompletableFuture<>();
        Thread waiter = new Thread(() -> {
            started.countDown();
            try {
                waiting.lockInterruptibly();
                outcome.complete(null);
            } catch (Throwable e) {
                assertFalse(Thread.currentThread().isInterrupted(), "the interrupt status is cleared, as Lock says");
                assertFalse(waiting.isHeldByCurrentThread());
                outcome.complete(e);
            }
        });
        waiter.start();
        assertTrue(started.await(10, TimeUnit.SECONDS));
        Thread.sleep(500); // waiting in the agent's queue by now
        waiter.interrupt();
        assertInstanceOf(InterruptedException.class, outcome.get(30, TimeUnit.SECONDS));
        waiter.join(10_000);
        held.unlock();
        // The interrupted claim left the queue: the next one is granted at once, not after it.
        CompletableFuture<Boolean> next = CompletableFuture.supplyAsync(() -> {
            boolean got = waiting.tryLock();
            if (got) {
                waiting.unlock();
            }
            return got;
        });
        assertTrue(next.get(30, TimeUnit.SECONDS), "the Lease was not free after the interrupted waiter");
    }

    @Test
    void lockIsReentrantAndTheLeaseOutlivesInnerUnlocks() throws Exception {
        PalisadeLock lock = one.obtain(key);
        lock.lock();
        long token = lock.token();
        assertTrue(lock.tryLock());
        lock.lock();
        assertEquals(token, lock.token(), "one Lease, one token");
        lock.unlock();
        lock.unlock();
        assertTrue(lock.isHeldByCurrentThread());
        assertFalse(tryLockElsewhere(), "released by an inner unlock");
        lock.unlock();
        assertFalse(lock.isHeldByCurrentThread());
        assertTrue(tryLockElsewhere(), "not released by the outermost unlock");
    }

    private boolean tryLockElsewhere() throws Exception {
        return CompletableFuture.supplyAsync(() -> {
            PalisadeLock other = two.obtain(key);
            boolean got = other.tryLock();
            if (got) {
                other.unlock();
            }
            return got;
        }).get(30, TimeUnit.SECONDS);
    }

    @Test
    void lockIsNotInterruptible() {
        PalisadeLock lock = one.obtain(key);
        Thread.currentThread().interrupt();
        try {
            lock.lock();
            assertTrue(Thread.currentThread().isInterrupted(), "the interrupt is kept for the caller");
            assertTrue(lock.isHeldByCurrentThread());
            assertTrue(lock.token() > 0);
        } finally {
            Thread.interrupted();
            if (lock.isHeldByCurrentThread()) {
                lock.unlock();
            }
        }
    }

    @Test
    void executeLockedOfTheRegistryRunsUnderTheLease() throws Exception {
        long token = one.executeLocked(key, () -> one.obtain(key).token());
        assertTrue(token > 0);
        assertFalse(one.obtain(key).isHeldByCurrentThread());
        assertTrue(tryLockElsewhere(), "released after executeLocked");
    }

    @Test
    void unlockAfterTheGrantWasLostFreesTheLockAndSaysSo() throws Exception {
        Session own = openSession("spring-test-lost");
        PalisadeLock lock = new PalisadeLockRegistry(own, OPTIONS, Duration.ofSeconds(2)).obtain(key);
        lock.lock();
        // Another party ends the session at the agent: the grant is lost (SessionEnded).
        endSessionAtTheAgent(own.id());
        assertEquals(LostReason.SESSION_ENDED, lock.grant().lost().get(30, TimeUnit.SECONDS));
        ConcurrentModificationException e = assertThrows(ConcurrentModificationException.class, lock::unlock);
        assertTrue(e.getMessage().contains(key) && e.getMessage().contains("SessionEnded"), e.getMessage());
        assertFalse(lock.isHeldByCurrentThread());
    }

    /** DELETE /v1/sessions/{id} on the agent's socket, as any other client of the agent may send it. */
    private static void endSessionAtTheAgent(String id) throws IOException {
        String socket = System.getenv("PALISADE_AGENT_SOCKET");
        try (SocketChannel channel = SocketChannel.open(UnixDomainSocketAddress.of(socket))) {
            String request = "DELETE /v1/sessions/" + id + " HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n";
            channel.write(ByteBuffer.wrap(request.getBytes(StandardCharsets.US_ASCII)));
            ByteBuffer answer = ByteBuffer.allocate(4096);
            while (answer.hasRemaining() && channel.read(answer) >= 0) {
                // read until the agent closes the connection
            }
            String status = new String(answer.array(), 0, answer.position(), StandardCharsets.US_ASCII).lines().findFirst().orElse("");
            assertTrue(status.startsWith("HTTP/1.1 204"), "ending the session: " + status);
        }
    }

    @Test
    void aTtlCreatesTheLeaseWithThatDuration() throws Exception {
        PalisadeLock lock = one.obtain(key);
        assertTrue(lock.tryLock(Duration.ofSeconds(10), Duration.ofSeconds(42)));
        try {
            assertEquals(Duration.ofSeconds(42), lock.grant().duration());
        } finally {
            lock.unlock();
        }
    }
}
