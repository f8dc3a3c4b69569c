package dev.palisade.spring.integration;

import dev.palisade.AcquireOptions;
import dev.palisade.Grant;
import dev.palisade.LostReason;
import dev.palisade.Session;
import org.springframework.integration.support.locks.DistributedLock;

import java.time.Duration;
import java.util.ConcurrentModificationException;
import java.util.Optional;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.locks.Condition;
import java.util.concurrent.locks.ReentrantLock;
import java.util.function.Supplier;

/**
 * A {@link java.util.concurrent.locks.Lock} held as a palisade Lease, from
 * {@link PalisadeLockRegistry#obtain}.
 *
 * <ul>
 * <li>Reentrant, as {@link ReentrantLock}: the owning thread may lock again; the Lease is
 *     acquired by the outermost lock and released by the matching last unlock. Threads of
 *     one registry queue locally first, so the session asks for a Lease once.
 * <li>{@link #unlock()} by a thread that does not hold it: IllegalMonitorStateException.
 *     When the grant was lost while held, unlock still frees the lock, then throws
 *     ConcurrentModificationException naming the reason (as Spring's own distributed locks
 *     do): the critical section may not have been exclusive.
 * <li>The fencing token: {@link #token()} and {@link #grant()}, for the owning thread.
 * <li>A ttl ({@link #lock(Duration)}, {@link #tryLock(Duration, Duration)}) is the Lease's
 *     duration when the agent creates the Lease (rounded up to whole seconds, 1 s to
 *     86400 s); the agent renews the Lease while the session lives, so it bounds only how
 *     long a dead holder blocks the others.
 * <li>{@link #tryLock()} waits up to the registry's tryLock timeout (2 s by default) for
 *     the agent to grant a free Lease; {@link #tryLock(long, TimeUnit)} waits at most its
 *     own time, which must cover the agent's round trip (tens of milliseconds).
 * <li>{@link #newCondition()}: unsupported.
 * </ul>
 */
public final class PalisadeLock implements DistributedLock {
    private final String name;
    private final Supplier<Session> session;
    private final AcquireOptions options;
    private final Duration tryLockTimeout;
    private final ReentrantLock local = new ReentrantLock();
    private Grant grant; // guarded by local: set while held

    PalisadeLock(String name, Supplier<Session> session, AcquireOptions options, Duration tryLockTimeout) {
        this.name = name;
        this.session = session;
        this.options = options;
        this.tryLockTimeout = tryLockTimeout;
    }

    /** The Lease's name (the registry key). */
    public String name() {
        return name;
    }

    /** Whether the current thread holds this lock. */
    public boolean isHeldByCurrentThread() {
        return local.isHeldByCurrentThread();
    }

    /**
     * The grant of the Lease, for the thread that holds the lock.
     *
     * @throws IllegalMonitorStateException the current thread does not hold the lock
     */
    public Grant grant() {
        if (!local.isHeldByCurrentThread()) {
            throw new IllegalMonitorStateException("the palisade lock " + name + " is not held by this thread");
        }
        return grant;
    }

    /** The fencing token: send it with every write the lock protects. Only for the holding thread. */
    public long token() {
        return grant().token();
    }

    /** Waits as long as it takes; an interrupt does not stop it (the thread stays interrupted). */
    @Override
    public void lock() {
        lockUninterruptibly(options);
    }

    /** As {@link #lock()}, the Lease created with the duration {@code ttl} if it does not exist. */
    @Override
    public void lock(Duration ttl) {
        lockUninterruptibly(withTtl(ttl));
    }

    @Override
    public void lockInterruptibly() throws InterruptedException {
        local.lockInterruptibly();
        if (local.getHoldCount() > 1) {
            return;
        }
        boolean locked = false;
        try {
            grant = session.get().acquire(name, options);
            locked = true;
        } catch (InterruptedException e) {
            // Lock's contract: the interrupt status is cleared when InterruptedException is thrown.
            Thread.interrupted();
            throw e;
        } finally {
            if (!locked) {
                local.unlock();
            }
        }
    }

    /**
     * Locks if the Lease is granted within the registry's tryLock timeout. Interrupted
     * meanwhile, it returns false and the thread stays interrupted.
     */
    @Override
    public boolean tryLock() {
        if (!local.tryLock()) {
            return false;
        }
        if (local.getHoldCount() > 1) {
            return true;
        }
        try {
            return tryAcquire(tryLockTimeout, options);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            return false;
        }
    }

    @Override
    public boolean tryLock(long time, TimeUnit unit) throws InterruptedException {
        return tryLockWithin(Duration.ofNanos(unit.toNanos(time)), options);
    }

    /** As {@link #tryLock(long, TimeUnit)}, the Lease created with the duration {@code ttl} if it does not exist. */
    @Override
    public boolean tryLock(Duration waitTime, Duration ttl) throws InterruptedException {
        return tryLockWithin(waitTime, withTtl(ttl));
    }

    /**
     * Releases the Lease when the outermost lock is unlocked.
     *
     * @throws IllegalMonitorStateException the current thread does not hold the lock
     * @throws ConcurrentModificationException the grant had been lost while held (the lock is freed all the same)
     */
    @Override
    public void unlock() {
        if (!local.isHeldByCurrentThread()) {
            throw new IllegalMonitorStateException("the palisade lock " + name + " is not held by this thread");
        }
        if (local.getHoldCount() > 1) {
            local.unlock();
            return;
        }
        Grant held = grant;
        grant = null;
        try {
            held.release();
        } finally {
            local.unlock();
        }
        Optional<LostReason> reason = held.lostReason();
        if (reason.isPresent() && reason.get() != LostReason.RELEASED) {
            throw new ConcurrentModificationException("the palisade Lease " + held.namespace() + "/" + name
                    + " (token " + held.token() + ") was lost while locked (" + reason.get().wireName()
                    + "): the data it protects may have been written by another holder meanwhile");
        }
    }

    /** Unsupported: a condition cannot be waited on across processes. */
    @Override
    public Condition newCondition() {
        throw new UnsupportedOperationException("palisade locks have no conditions");
    }

    @Override
    public String toString() {
        return "PalisadeLock[" + name + (local.isLocked() ? ", locked" : ", unlocked") + "]";
    }

    private void lockUninterruptibly(AcquireOptions acquire) {
        local.lock();
        if (local.getHoldCount() > 1) {
            return;
        }
        boolean locked = false;
        boolean interrupted = false;
        try {
            while (!locked) {
                try {
                    grant = session.get().acquire(name, acquire);
                    locked = true;
                } catch (InterruptedException e) {
                    // lock() is not interruptible: wait again, and leave the thread interrupted.
                    Thread.interrupted();
                    interrupted = true;
                }
            }
        } finally {
            if (!locked) {
                local.unlock();
            }
            if (interrupted) {
                Thread.currentThread().interrupt();
            }
        }
    }

    private boolean tryLockWithin(Duration wait, AcquireOptions acquire) throws InterruptedException {
        long start = System.nanoTime();
        if (!local.tryLock(wait.toNanos(), TimeUnit.NANOSECONDS)) {
            return false;
        }
        if (local.getHoldCount() > 1) {
            return true;
        }
        Duration left = wait.minusNanos(System.nanoTime() - start);
        try {
            return tryAcquire(left.isNegative() ? Duration.ZERO : left, acquire);
        } catch (InterruptedException e) {
            Thread.interrupted();
            throw e;
        }
    }

    /** With the local lock held once: the Lease within {@code wait}, or the local lock given back. */
    private boolean tryAcquire(Duration wait, AcquireOptions acquire) throws InterruptedException {
        boolean locked = false;
        try {
            Optional<Grant> granted = session.get().tryAcquire(name, wait, acquire);
            if (granted.isPresent()) {
                grant = granted.get();
                locked = true;
            }
            return locked;
        } finally {
            if (!locked) {
                local.unlock();
            }
        }
    }

    private AcquireOptions withTtl(Duration ttl) {
        return options.durationSeconds(LeaseNames.durationSeconds(ttl));
    }
}
