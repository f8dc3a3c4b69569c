package dev.palisade;

import java.time.Duration;
import java.util.Optional;

/**
 * Leases through the process-wide default session: opened on first use (and again after
 * it ended) from the environment ($PALISADE_AGENT_SOCKET, else $PALISADE_AGENT_URL, else
 * /run/palisade/agent.sock), closed by a shutdown hook.
 *
 * <pre>{@code
 * try (Grant grant = Palisade.acquire("billing")) {
 *     write(grant.token());
 * }
 * }</pre>
 */
public final class Palisade {
    private static final Object LOCK = new Object();
    private static Session current;
    private static boolean hooked;

    private Palisade() {}

    /** Acquires {@code name} with the default options, waiting as long as it takes; see {@link Session#acquire}. */
    public static Grant acquire(String name) throws InterruptedException {
        return defaultSession().acquire(name, AcquireOptions.defaults());
    }

    /** Acquires {@code name}, waiting as long as it takes; see {@link Session#acquire}. */
    public static Grant acquire(String name, AcquireOptions options) throws InterruptedException {
        return defaultSession().acquire(name, options);
    }

    /** Acquires {@code name} within {@code timeout}, else empty (the claim leaves the queue); see {@link Session#tryAcquire}. */
    public static Optional<Grant> tryAcquire(String name, Duration timeout, AcquireOptions options)
            throws InterruptedException {
        return defaultSession().tryAcquire(name, timeout, options);
    }

    /** The process's session with the agent, opened on first use and again after it ended. */
    public static Session defaultSession() {
        synchronized (LOCK) {
            if (current == null || current.isEnded()) {
                current = Session.open();
                if (!hooked) {
                    hooked = true;
                    Runtime.getRuntime().addShutdownHook(new Thread(Palisade::closeDefaultSession, "palisade-shutdown"));
                }
            }
            return current;
        }
    }

    private static void closeDefaultSession() {
        Session s;
        synchronized (LOCK) {
            s = current;
            current = null;
        }
        if (s != null) {
            s.close();
        }
    }
}
