package dev.palisade;

import java.util.Optional;

/**
 * Leader election in the style of client-go's RunOrDie: waits for the Lease, then runs
 * {@code leadership} in the calling thread with the grant. When the grant is lost the
 * calling thread is interrupted (the Java way to tell a thread to stop): leadership should
 * return soon, and until it does its writes are refused by the fence, which is what the
 * token is for. When leadership returns or throws, the Lease is released.
 *
 * <pre>{@code
 * LeaderElection.run("my-controller", AcquireOptions.defaults(), grant -> {
 *     while (true) {
 *         reconcile(grant.token());
 *         Thread.sleep(1000);            // throws InterruptedException once the grant is lost
 *     }
 * });
 * }</pre>
 */
public final class LeaderElection {
    private LeaderElection() {}

    /** The work of the leader, run while the grant is held. */
    @FunctionalInterface
    public interface Leadership {
        /** Leads with {@code grant}; return (or throw) to stop; interrupted when the grant is lost. */
        void lead(Grant grant) throws Exception;
    }

    /** {@link #run(Session, String, AcquireOptions, Leadership)} with {@link Palisade#defaultSession()}. */
    public static Optional<LostReason> run(String lease, AcquireOptions options, Leadership leadership) throws Exception {
        return run(Palisade.defaultSession(), lease, options, leadership);
    }

    /**
     * Leads once while holding {@code lease}: returns the loss reason, or empty when
     * leadership ended by returning. An exception of leadership propagates, except the
     * InterruptedException (or an interrupt status left set) that the loss caused: then
     * the reason is returned and the interrupt status cleared.
     */
    public static Optional<LostReason> run(Session session, String lease, AcquireOptions options, Leadership leadership)
            throws Exception {
        Grant grant = session.acquire(lease, options);
        Thread leader = Thread.currentThread();
        Object lock = new Object();
        boolean[] state = new boolean[2]; // [0]: leading is over, [1]: the leader was interrupted
        grant.lost().thenAccept(reason -> {
            if (reason == LostReason.RELEASED) {
                return;
            }
            synchronized (lock) {
                if (!state[0]) {
                    state[1] = true;
                    leader.interrupt();
                }
            }
        });
        try {
            leadership.lead(grant);
        } catch (InterruptedException e) {
            if (!interruptedByLoss(lock, state)) {
                throw e;
            }
        } finally {
            synchronized (lock) {
                state[0] = true;
            }
            grant.release();
        }
        if (interruptedByLoss(lock, state)) {
            Thread.interrupted(); // ours: the loss is the answer
        }
        Optional<LostReason> reason = grant.lostReason();
        return reason.filter(r -> r != LostReason.RELEASED);
    }

    private static boolean interruptedByLoss(Object lock, boolean[] state) {
        synchronized (lock) {
            return state[1];
        }
    }
}
