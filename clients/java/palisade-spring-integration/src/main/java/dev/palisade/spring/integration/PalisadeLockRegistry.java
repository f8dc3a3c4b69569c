package dev.palisade.spring.integration;

import dev.palisade.AcquireOptions;
import dev.palisade.Palisade;
import dev.palisade.Session;
import org.springframework.integration.support.locks.LockRegistry;

import java.time.Duration;
import java.util.Objects;
import java.util.concurrent.ConcurrentHashMap;
import java.util.function.Supplier;

/**
 * A Spring Integration {@link LockRegistry} on palisade Leases: {@code obtain("orders")}
 * is a {@link PalisadeLock} on the Lease {@code orders} (in the options' namespace, else
 * the agent's), the same lock object for the same key. Keys must be Strings that are DNS
 * labels; anything else is refused, never renamed.
 *
 * <p>A session holds a Lease once: use one registry per session (a second registry on the
 * same session gets {@code already_acquired} from the agent for a key the first holds).
 */
public final class PalisadeLockRegistry implements LockRegistry<PalisadeLock> {
    /** How long {@link PalisadeLock#tryLock()} waits for the agent to grant a free Lease, unless told otherwise. */
    public static final Duration DEFAULT_TRY_LOCK_TIMEOUT = Duration.ofSeconds(2);

    private final Supplier<Session> session;
    private final AcquireOptions options;
    private final Duration tryLockTimeout;
    private final ConcurrentHashMap<String, PalisadeLock> locks = new ConcurrentHashMap<>();

    /** On the process's default session ({@link Palisade#defaultSession()}, opened on the first lock). */
    public PalisadeLockRegistry() {
        this(Palisade::defaultSession, AcquireOptions.defaults(), DEFAULT_TRY_LOCK_TIMEOUT);
    }

    /** On the process's default session, with these options and tryLock() timeout. */
    public PalisadeLockRegistry(AcquireOptions options, Duration tryLockTimeout) {
        this(Palisade::defaultSession, options, tryLockTimeout);
    }

    public PalisadeLockRegistry(Session session) {
        this(session, AcquireOptions.defaults(), DEFAULT_TRY_LOCK_TIMEOUT);
    }

    /**
     * @param options namespace, holder identity and duration of the Leases (a ttl given
     *     to {@link PalisadeLock#lock(Duration)} replaces the duration)
     * @param tryLockTimeout how long {@link PalisadeLock#tryLock()} waits for the grant of a free Lease
     */
    public PalisadeLockRegistry(Session session, AcquireOptions options, Duration tryLockTimeout) {
        this(constant(Objects.requireNonNull(session, "session")), options, tryLockTimeout);
    }

    private PalisadeLockRegistry(Supplier<Session> session, AcquireOptions options, Duration tryLockTimeout) {
        this.session = session;
        this.options = Objects.requireNonNull(options, "options");
        this.tryLockTimeout = Objects.requireNonNull(tryLockTimeout, "tryLockTimeout");
        if (tryLockTimeout.isNegative()) {
            throw new IllegalArgumentException("tryLockTimeout " + tryLockTimeout + " is negative");
        }
    }

    /**
     * The lock of the Lease named {@code lockKey}; asks the agent nothing until locked.
     *
     * @throws IllegalArgumentException the key is not a String that is a DNS label
     */
    @Override
    public PalisadeLock obtain(Object lockKey) {
        String name = LeaseNames.require(lockKey);
        return locks.computeIfAbsent(name, n -> new PalisadeLock(n, session, options, tryLockTimeout));
    }

    private static Supplier<Session> constant(Session session) {
        return () -> session;
    }
}
