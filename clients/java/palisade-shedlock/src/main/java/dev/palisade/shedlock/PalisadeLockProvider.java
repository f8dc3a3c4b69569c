package dev.palisade.shedlock;

import dev.palisade.AcquireOptions;
import dev.palisade.AgentException;
import dev.palisade.Grant;
import dev.palisade.Palisade;
import dev.palisade.Session;
import net.javacrumbs.shedlock.core.LockConfiguration;
import net.javacrumbs.shedlock.core.LockProvider;
import net.javacrumbs.shedlock.core.SimpleLock;

import java.time.Duration;
import java.util.Deque;
import java.util.Objects;
import java.util.Optional;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ConcurrentLinkedDeque;
import java.util.function.Supplier;

/**
 * A ShedLock {@link LockProvider} on palisade Leases: the lock named {@code report} is the
 * Lease {@code report} (in the options' namespace, else the agent's), so the task runs
 * where the Lease is granted, with a fencing token.
 *
 * <ul>
 * <li>{@link #lock} waits at most the acquire timeout (2 s by default) for the grant; a
 *     Lease held elsewhere, or by this provider already, gives {@code Optional.empty()}.
 * <li>{@code lockAtMostFor} is the Lease's duration when the agent creates the Lease
 *     (rounded up to whole seconds, 1 s to 86400 s); an existing Lease keeps its own. The
 *     agent renews the Lease while the session lives, so a long task keeps its lock;
 *     the duration bounds only how long a dead holder blocks the others.
 * <li>{@code lockAtLeastFor}: {@link SimpleLock#unlock()} before it has passed keeps the
 *     Lease until then (released by a timer), as ShedLock's own providers do.
 * <li>The token: {@link #currentGrant()} inside the task, or {@link FencedLock#grant()}
 *     of the returned lock.
 * </ul>
 */
public final class PalisadeLockProvider implements LockProvider {
    /** How long {@link #lock} waits for a grant unless told otherwise. */
    public static final Duration DEFAULT_ACQUIRE_TIMEOUT = Duration.ofSeconds(2);

    /** The agent's bounds of durationSeconds. */
    static final long MIN_DURATION_SECONDS = 1;
    static final long MAX_DURATION_SECONDS = 86_400;

    // The locks each thread holds, innermost first, for currentGrant().
    private static final ThreadLocal<Deque<PalisadeSimpleLock>> ACTIVE = new ThreadLocal<>();

    private final Supplier<Session> session;
    private final AcquireOptions options;
    private final Duration acquireTimeout;
    // Names this provider holds or is acquiring: a session may hold a Lease once.
    private final Set<String> held = ConcurrentHashMap.newKeySet();

    /** On the process's default session ({@link Palisade#defaultSession()}, opened on first lock). */
    public PalisadeLockProvider() {
        this(Palisade::defaultSession, AcquireOptions.defaults(), DEFAULT_ACQUIRE_TIMEOUT);
    }

    /** On the process's default session, with these options and acquire timeout. */
    public PalisadeLockProvider(AcquireOptions options, Duration acquireTimeout) {
        this(Palisade::defaultSession, options, acquireTimeout);
    }

    public PalisadeLockProvider(Session session) {
        this(session, AcquireOptions.defaults(), DEFAULT_ACQUIRE_TIMEOUT);
    }

    /**
     * @param options namespace and holder identity of the Leases (their durationSeconds is
     *     replaced by each lock's lockAtMostFor)
     * @param acquireTimeout how long {@link #lock} waits for the grant of a free Lease
     */
    public PalisadeLockProvider(Session session, AcquireOptions options, Duration acquireTimeout) {
        this(constant(Objects.requireNonNull(session, "session")), options, acquireTimeout);
    }

    private PalisadeLockProvider(Supplier<Session> session, AcquireOptions options, Duration acquireTimeout) {
        this.session = session;
        this.options = Objects.requireNonNull(options, "options");
        this.acquireTimeout = Objects.requireNonNull(acquireTimeout, "acquireTimeout");
        if (acquireTimeout.isNegative()) {
            throw new IllegalArgumentException("acquireTimeout " + acquireTimeout + " is negative");
        }
    }

    /**
     * The grant of the innermost lock the current thread holds through any
     * PalisadeLockProvider (inside a ShedLock task: that task's), empty outside one.
     */
    public static Optional<Grant> currentGrant() {
        Deque<PalisadeSimpleLock> locks = ACTIVE.get();
        PalisadeSimpleLock innermost = locks == null ? null : locks.peekFirst();
        return innermost == null ? Optional.empty() : Optional.of(innermost.grant());
    }

    /** The grant of the lock named {@code lockName} that the current thread holds, if any. */
    public static Optional<Grant> currentGrant(String lockName) {
        Deque<PalisadeSimpleLock> locks = ACTIVE.get();
        if (locks != null) {
            for (PalisadeSimpleLock lock : locks) {
                if (lock.name().equals(lockName)) {
                    return Optional.of(lock.grant());
                }
            }
        }
        return Optional.empty();
    }

    /**
     * Acquires the Lease named as the lock, waiting at most the acquire timeout.
     *
     * @throws IllegalArgumentException the lock name is not a DNS label
     * @throws dev.palisade.AgentException the agent refused or could not be reached
     */
    @Override
    public Optional<SimpleLock> lock(LockConfiguration configuration) {
        String name = LeaseNames.require(configuration.getName());
        if (!held.add(name)) {
            return Optional.empty();
        }
        boolean locked = false;
        try {
            AcquireOptions acquire = options.durationSeconds(durationSeconds(configuration.getLockAtMostFor()));
            Optional<Grant> grant = session.get().tryAcquire(name, acquireTimeout, acquire);
            if (grant.isEmpty()) {
                return Optional.empty();
            }
            Deque<PalisadeSimpleLock> locks = ACTIVE.get();
            if (locks == null) {
                locks = new ConcurrentLinkedDeque<>();
                ACTIVE.set(locks);
            }
            PalisadeSimpleLock lock = new PalisadeSimpleLock(this, configuration, grant.get(), locks);
            locks.addFirst(lock);
            locked = true;
            return Optional.of(lock);
        } catch (InterruptedException e) {
            // ShedLock's lock() cannot throw it: no lock, and the thread stays interrupted.
            Thread.currentThread().interrupt();
            return Optional.empty();
        } catch (AgentException e) {
            if ("already_acquired".equals(e.code())) {
                // Another provider on this session holds it: held elsewhere, for ShedLock.
                return Optional.empty();
            }
            throw e;
        } finally {
            if (!locked) {
                held.remove(name);
            }
        }
    }

    /** lockAtMostFor as the Lease's durationSeconds: rounded up, within the agent's 1..86400. */
    static int durationSeconds(Duration lockAtMostFor) {
        long seconds = lockAtMostFor.getSeconds() + (lockAtMostFor.getNano() > 0 ? 1 : 0);
        return (int) Math.max(MIN_DURATION_SECONDS, Math.min(MAX_DURATION_SECONDS, seconds));
    }

    /** The lock is done with: the name may be locked again. */
    void forget(String name) {
        held.remove(name);
    }

    /** Forgets the thread's deque once it is empty, so pooled threads keep nothing. */
    static void dropIfEmpty(Deque<PalisadeSimpleLock> locks) {
        if (locks.isEmpty() && ACTIVE.get() == locks) {
            ACTIVE.remove();
        }
    }

    private static Supplier<Session> constant(Session session) {
        return () -> session;
    }
}
