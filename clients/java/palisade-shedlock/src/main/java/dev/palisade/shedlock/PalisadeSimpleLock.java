package dev.palisade.shedlock;

import dev.palisade.Grant;
import dev.palisade.PalisadeException;
import net.javacrumbs.shedlock.core.ClockProvider;
import net.javacrumbs.shedlock.core.LockConfiguration;
import net.javacrumbs.shedlock.core.SimpleLock;

import java.time.Duration;
import java.util.Deque;
import java.util.Optional;
import java.util.concurrent.Executors;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;

/** One lock of {@link PalisadeLockProvider}: its grant, until unlocked or extended. */
final class PalisadeSimpleLock implements FencedLock {
    private static final System.Logger LOG = System.getLogger(PalisadeLockProvider.class.getName());

    private final PalisadeLockProvider provider;
    private final LockConfiguration configuration;
    private final Grant grant;
    private final Deque<PalisadeSimpleLock> active;
    private final AtomicBoolean done = new AtomicBoolean();
    // Ended by an extend that found the grant gone: ShedLock's executor still unlocks it.
    private volatile boolean endedByExtend;

    PalisadeSimpleLock(PalisadeLockProvider provider, LockConfiguration configuration, Grant grant,
                       Deque<PalisadeSimpleLock> active) {
        this.provider = provider;
        this.configuration = configuration;
        this.grant = grant;
        this.active = active;
    }

    @Override
    public Grant grant() {
        return grant;
    }

    String name() {
        return configuration.getName();
    }

    /**
     * Releases the Lease, at once, or when lockAtLeastFor has passed. A release the agent
     * refuses is logged, not thrown: the Lease then ends with the session or at its deadline.
     */
    @Override
    public void unlock() {
        if (done.getAndSet(true)) {
            if (endedByExtend) {
                return;
            }
            throw new IllegalStateException("the ShedLock lock " + name() + " is already unlocked");
        }
        active.remove(this);
        PalisadeLockProvider.dropIfEmpty(active);
        Duration atLeast = Duration.between(ClockProvider.now(), configuration.getLockAtLeastUntil());
        if (atLeast.isNegative() || atLeast.isZero()) {
            release();
        } else {
            Timer.INSTANCE.schedule(this::release, atLeast.toNanos(), TimeUnit.NANOSECONDS);
        }
    }

    /**
     * The Lease stays held (the agent renews it), so extending only moves lockAtLeastFor.
     * A grant that is no longer valid cannot be extended: the lock ends, and the unlock
     * that ShedLock's executor still sends it does nothing.
     */
    @Override
    public Optional<SimpleLock> extend(Duration lockAtMostFor, Duration lockAtLeastFor) {
        if (done.get()) {
            throw new IllegalStateException("the ShedLock lock " + name() + " is already unlocked");
        }
        if (!grant.isValid()) {
            unlock();
            endedByExtend = true;
            return Optional.empty();
        }
        if (done.getAndSet(true)) {
            throw new IllegalStateException("the ShedLock lock " + name() + " is already unlocked");
        }
        PalisadeSimpleLock extended = new PalisadeSimpleLock(provider,
                new LockConfiguration(ClockProvider.now(), name(), lockAtMostFor, lockAtLeastFor), grant, active);
        active.remove(this);
        active.addFirst(extended);
        return Optional.of(extended);
    }

    private void release() {
        try {
            grant.release();
        } catch (PalisadeException e) {
            LOG.log(System.Logger.Level.WARNING, "releasing the Lease of ShedLock lock " + name() + ": " + e.getMessage(), e);
        } finally {
            provider.forget(name());
        }
    }

    @Override
    public String toString() {
        return "PalisadeSimpleLock[" + name() + ", token " + grant.token() + "]";
    }

    /** Releases deferred by lockAtLeastFor, on one daemon thread for the process. */
    private static final class Timer {
        static final ScheduledExecutorService INSTANCE = Executors.newSingleThreadScheduledExecutor(r -> {
            Thread t = new Thread(r, "palisade-shedlock-release");
            t.setDaemon(true);
            return t;
        });
    }
}
