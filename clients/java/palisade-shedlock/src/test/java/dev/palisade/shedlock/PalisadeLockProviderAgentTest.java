package dev.palisade.shedlock;

import dev.palisade.AcquireOptions;
import dev.palisade.Grant;
import dev.palisade.Session;
import dev.palisade.SessionOptions;
import net.javacrumbs.shedlock.core.ClockProvider;
import net.javacrumbs.shedlock.core.DefaultLockingTaskExecutor;
import net.javacrumbs.shedlock.core.LockAssert;
import net.javacrumbs.shedlock.core.LockConfiguration;
import net.javacrumbs.shedlock.core.LockExtender;
import net.javacrumbs.shedlock.core.LockingTaskExecutor;
import net.javacrumbs.shedlock.core.SimpleLock;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Tag;
import org.junit.jupiter.api.Test;

import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Optional;
import java.util.UUID;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicInteger;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assertions.fail;

/** Two providers on two sessions of a real agent ($PALISADE_AGENT_SOCKET), through ShedLock's executor. */
@Tag("agent")
class PalisadeLockProviderAgentTest {
    private static final Duration ACQUIRE_TIMEOUT = Duration.ofSeconds(1);
    // Longer than any wait here: a Lease not released would stay held past each test.
    private static final Duration AT_MOST = Duration.ofSeconds(60);

    private Session first;
    private Session second;
    private PalisadeLockProvider one;
    private PalisadeLockProvider two;
    private String name;

    @BeforeEach
    void open() {
        String socket = System.getenv("PALISADE_AGENT_SOCKET");
        if (socket == null || socket.isEmpty()) {
            fail("PALISADE_AGENT_SOCKET is not set: these tests need a running palisade agent (see README.md, Tests)");
        }
        first = Session.open(SessionOptions.defaults().socket(Path.of(socket)).name("shedlock-test-1"));
        second = Session.open(SessionOptions.defaults().socket(Path.of(socket)).name("shedlock-test-2"));
        one = new PalisadeLockProvider(first, AcquireOptions.defaults(), ACQUIRE_TIMEOUT);
        two = new PalisadeLockProvider(second, AcquireOptions.defaults(), ACQUIRE_TIMEOUT);
        name = "shedlock-" + UUID.randomUUID().toString().substring(0, 8);
    }

    @AfterEach
    void close() {
        if (first != null) {
            first.close();
        }
        if (second != null) {
            second.close();
        }
    }

    private LockConfiguration config(Duration atLeast) {
        return new LockConfiguration(ClockProvider.now(), name, AT_MOST, atLeast);
    }

    @Test
    void onlyOneRunsAtATimeAndTheOtherGetsNoLockWhileItHolds() throws Exception {
        LockingTaskExecutor executorOne = new DefaultLockingTaskExecutor(one);
        LockingTaskExecutor executorTwo = new DefaultLockingTaskExecutor(two);
        CountDownLatch inside = new CountDownLatch(1);
        CountDownLatch finish = new CountDownLatch(1);
        AtomicInteger running = new AtomicInteger();
        AtomicInteger overlaps = new AtomicInteger();
        CompletableFuture<Long> firstRun = CompletableFuture.supplyAsync(() -> {
            long[] token = new long[1];
            executorOne.executeWithLock((Runnable) () -> {
                if (running.incrementAndGet() > 1) {
                    overlaps.incrementAndGet();
                }
                LockAssert.assertLocked();
                token[0] = PalisadeLockProvider.currentGrant().orElseThrow().token();
                inside.countDown();
                try {
                    assertTrue(finish.await(30, TimeUnit.SECONDS));
                } catch (InterruptedException e) {
                    Thread.currentThread().interrupt();
                }
                running.decrementAndGet();
            }, config(Duration.ZERO));
            return token[0];
        });
        assertTrue(inside.await(30, TimeUnit.SECONDS), "the first task never ran");

        AtomicBoolean secondRan = new AtomicBoolean();
        executorTwo.executeWithLock((Runnable) () -> secondRan.set(true), config(Duration.ZERO));
        assertFalse(secondRan.get(), "the second task ran while the first held the lock");
        assertEquals(Optional.empty(), two.lock(config(Duration.ZERO)), "a lock held elsewhere is Optional.empty()");
        assertEquals(Optional.empty(), one.lock(config(Duration.ZERO)), "a lock this provider holds is Optional.empty()");

        finish.countDown();
        long firstToken = firstRun.get(30, TimeUnit.SECONDS);
        long[] secondToken = new long[1];
        executorTwo.executeWithLock((Runnable) () -> {
            if (running.incrementAndGet() > 1) {
                overlaps.incrementAndGet();
            }
            secondToken[0] = PalisadeLockProvider.currentGrant(name).orElseThrow().token();
            running.decrementAndGet();
        }, config(Duration.ZERO));
        assertTrue(secondToken[0] > firstToken, "the token after the first run: " + secondToken[0] + " after " + firstToken);
        assertEquals(0, overlaps.get());
        assertEquals(Optional.empty(), PalisadeLockProvider.currentGrant(), "no grant outside a task");
    }

    @Test
    void theTokenIsVisibleInsideAndIncreasesAcrossRuns() {
        List<Long> tokens = new ArrayList<>();
        List<LockingTaskExecutor> executors = List.of(new DefaultLockingTaskExecutor(one), new DefaultLockingTaskExecutor(two));
        for (int run = 0; run < 4; run++) {
            int before = tokens.size();
            executors.get(run % 2).executeWithLock((Runnable) () -> {
                Grant grant = PalisadeLockProvider.currentGrant().orElseThrow();
                assertEquals(name, grant.name());
                assertTrue(grant.isValid());
                tokens.add(grant.token());
            }, config(Duration.ZERO));
            assertEquals(before + 1, tokens.size(), "run " + run + " did not get the lock");
        }
        for (int i = 1; i < tokens.size(); i++) {
            assertTrue(tokens.get(i) > tokens.get(i - 1), "tokens not strictly increasing: " + tokens);
        }
    }

    @Test
    void unlockReleasesAtOnce() {
        FencedLock held = (FencedLock) one.lock(config(Duration.ZERO)).orElseThrow();
        Grant grant = held.grant();
        assertEquals(grant.token(), held.token());
        held.unlock();
        assertFalse(grant.isValid(), "released");
        // With a 60 s Lease, only a release lets the other session in within its 1 s timeout.
        SimpleLock next = two.lock(config(Duration.ZERO)).orElseThrow(() -> new AssertionError("not released at once"));
        next.unlock();
        assertThrows(IllegalStateException.class, next::unlock, "unlocked twice");
        // And this provider may lock the name again.
        one.lock(config(Duration.ZERO)).orElseThrow().unlock();
    }

    @Test
    void lockAtLeastForKeepsTheLeaseUntilItPasses() throws InterruptedException {
        long start = System.nanoTime();
        one.lock(config(Duration.ofSeconds(3))).orElseThrow().unlock();
        assertEquals(Optional.empty(), two.lock(config(Duration.ZERO)), "released before lockAtLeastFor passed");
        assertTrue(System.nanoTime() - start < Duration.ofSeconds(3).toNanos(), "the check came too late to mean anything");
        Thread.sleep(Math.max(0, Duration.ofSeconds(3).toMillis() - (System.nanoTime() - start) / 1_000_000 + 200));
        two.lock(config(Duration.ZERO)).orElseThrow(() -> new AssertionError("still held after lockAtLeastFor")).unlock();
    }

    @Test
    void extendKeepsTheGrantAndTheExecutorStillReleasesIt() {
        long[] tokens = new long[2];
        new DefaultLockingTaskExecutor(one).executeWithLock((Runnable) () -> {
            tokens[0] = PalisadeLockProvider.currentGrant().orElseThrow().token();
            LockExtender.extendActiveLock(Duration.ofMinutes(2), Duration.ZERO);
            tokens[1] = PalisadeLockProvider.currentGrant(name).orElseThrow().token();
        }, config(Duration.ZERO));
        assertEquals(tokens[0], tokens[1], "one grant before and after extending");
        assertTrue(tokens[0] > 0);
        two.lock(config(Duration.ZERO)).orElseThrow(() -> new AssertionError("the extended lock was not released")).unlock();
    }

    @Test
    void aLostGrantCannotBeExtendedAndItsUnlockDoesNothing() {
        FencedLock lock = (FencedLock) one.lock(config(Duration.ZERO)).orElseThrow();
        lock.grant().release(); // gone under the lock's feet
        assertEquals(Optional.empty(), lock.extend(Duration.ofMinutes(1), Duration.ZERO));
        lock.unlock(); // what ShedLock's executor does after a failed extension
        one.lock(config(Duration.ZERO)).orElseThrow(() -> new AssertionError("the name stayed taken")).unlock();
    }
}
