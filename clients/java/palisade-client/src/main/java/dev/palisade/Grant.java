package dev.palisade;

import java.time.Duration;
import java.util.Optional;
import java.util.concurrent.CompletableFuture;
import java.util.logging.Level;
import java.util.logging.Logger;

/**
 * A Lease this process holds, with its fencing token: send {@link #token()} with every
 * write the Lease protects.
 *
 * <p>{@link #isValid()} reads the clock: each answer of the agent naming the grant says
 * how long it is valid at most ({@code validForMs}), counted here from when that request
 * was sent (System.nanoTime), and the session asks again well before that runs out. Past
 * that local deadline the grant is lost ({@link LostReason#LOCAL_DEADLINE}), whatever the
 * agent answers later; a lost grant never comes back. {@link #lost()} completes when the
 * grant ends. {@link #close()} releases it (use try-with-resources). Thread-safe.
 */
public final class Grant implements AutoCloseable {
    private static final Logger LOG = Logger.getLogger("dev.palisade");

    private enum State { HELD, LOST, RELEASED }

    private final Session session;
    private final String name;
    private final String namespace;
    private final long token;
    private final String claim;
    private final String claimUid;
    private final String holderIdentity;
    private final int slot;
    private final String fenceKey;
    private final CompletableFuture<LostReason> lost = new CompletableFuture<>();
    private final Object lock = new Object();
    // Guarded by lock.
    private State state = State.HELD;
    private boolean letGo; // set by the first release: the agent stops renewing at once
    private long deadline; // System.nanoTime
    private long deadlineSent;
    private LostReason lostReason;
    private String lostMessage;
    private volatile Integer durationSeconds;

    Grant(Session session, Api.GrantInfo info, long sent) {
        this.session = session;
        this.name = info.name();
        this.namespace = info.namespace();
        this.token = info.token();
        this.claim = info.claim();
        this.claimUid = info.claimUid();
        this.holderIdentity = info.holderIdentity();
        // An agent from before semaphores names neither: every grant was slot 0 of a lock.
        this.slot = info.slot() == null ? 0 : info.slot();
        this.fenceKey = info.fenceKey() == null ? namespace + "/" + name : info.fenceKey();
        this.durationSeconds = info.durationSeconds();
        this.deadline = sent + info.validForMs() * 1_000_000L;
        this.deadlineSent = sent;
    }

    /** The fencing token: send it with every write the Lease protects. */
    public long token() {
        return token;
    }

    /**
     * The slot held: 0 on a lock; on a semaphore (a Lease with spec.permits above 1) one
     * of 0..permits-1, each with fencing tokens of its own.
     */
    public int slot() {
        return slot;
    }

    /**
     * The key the fences use for this grant's slot: {@code <namespace>/<name>} for slot 0
     * (a lock's key), {@code <namespace>/<name>#<slot>} above; fence with it and {@link #token()}.
     */
    public String fenceKey() {
        return fenceKey;
    }

    /** The Lease's name. */
    public String name() {
        return name;
    }

    /** The Lease's namespace. */
    public String namespace() {
        return namespace;
    }

    /** The LeaseClaim's name (null if the agent did not say). */
    public String claim() {
        return claim;
    }

    /** The LeaseClaim's UID, as the Lease's status names its holder (null if the agent did not say). */
    public String claimUid() {
        return claimUid;
    }

    /** The claim's holder identity (null if the agent did not say). */
    public String holderIdentity() {
        return holderIdentity;
    }

    /** The lease duration the grant is held under (ZERO if the agent did not say). */
    public Duration duration() {
        Integer d = durationSeconds;
        return d == null ? Duration.ZERO : Duration.ofSeconds(d);
    }

    /**
     * Completes with the reason when the grant ends: a loss, or {@link LostReason#RELEASED}
     * after release. A copy each call (completing it does nothing to the grant); its
     * callbacks run on the client's thread that saw the end: keep them short.
     */
    public CompletableFuture<LostReason> lost() {
        return lost.copy();
    }

    /** Held: not lost, not released (nor being released), before its local deadline. Reads the clock, no request. */
    public boolean isValid() {
        State s = now();
        synchronized (lock) {
            return s == State.HELD && !letGo;
        }
    }

    /** Time left before the local deadline; ZERO when not valid. */
    public Duration validFor() {
        if (!isValid()) {
            return Duration.ZERO;
        }
        long left;
        synchronized (lock) {
            left = deadline - System.nanoTime();
        }
        return left > 0 ? Duration.ofNanos(left) : Duration.ZERO;
    }

    /** Empty while held; the reason once lost; RELEASED after release. */
    public Optional<LostReason> lostReason() {
        State s = now();
        synchronized (lock) {
            if (s == State.LOST) {
                return Optional.of(lostReason);
            }
            if (s == State.RELEASED || letGo) {
                return Optional.of(LostReason.RELEASED);
            }
            return Optional.empty();
        }
    }

    /**
     * Asks the agent (a cheap GET from its memory, no API server call) and returns how long
     * the grant is valid at most, counted from this request's send. Throws
     * LeaseLostException when the grant is lost or released, also when its local deadline
     * passes before the agent answers; AgentException when the agent cannot be asked.
     */
    public Duration check() {
        raiseIfEnded();
        long sent = System.nanoTime();
        long budget;
        synchronized (lock) {
            budget = Math.max(1_000_000L, deadline - sent);
        }
        Transport.Response r;
        try {
            r = session.request(Endpoint.GET_GRANT, budget, namespace, name);
        } catch (AgentUnreachableException e) {
            raiseIfEnded();
            throw e;
        }
        if (r.status() != 200) {
            throw session.error(r);
        }
        update(sent, Api.grantFromAnswer(r.status(), r.body()));
        raiseIfEnded();
        long left;
        synchronized (lock) {
            left = deadline - System.nanoTime();
        }
        return left > 0 ? Duration.ofNanos(left) : Duration.ZERO;
    }

    /**
     * Releases the Lease: the next waiter gets it at once. Does nothing when the grant is
     * already lost or released. Not valid from the call on, even when the agent's answer is
     * an error (thrown here): the agent stops renewing it anyway. Not interruptible.
     */
    public void release() {
        if (now() != State.HELD) {
            return;
        }
        synchronized (lock) {
            if (state != State.HELD || letGo) {
                return;
            }
            letGo = true;
        }
        try {
            Transport.Response r = session.request(Endpoint.RELEASE, Api.ANSWER_MARGIN_NANOS, namespace, name);
            if (r.status() == 409) {
                // grant_lost: it was lost first; its state says why.
                AgentException err = Api.errorFromResponse(r.status(), r.body());
                whyLost(err);
            } else if (r.status() == 404) {
                end(State.LOST, LostReason.SESSION_ENDED, Api.errorFromResponse(r.status(), r.body()).detail());
            } else if (r.status() != 200) {
                throw Api.errorFromResponse(r.status(), r.body());
            }
        } finally {
            end(State.RELEASED, null, null);
        }
    }

    /** The same as {@link #release()}. */
    @Override
    public void close() {
        release();
    }

    @Override
    public String toString() {
        return "Grant[" + namespace + "/" + name + " token=" + token + " " + now() + "]";
    }

    private void whyLost(AgentException err) {
        Api.GrantInfo info = null;
        try {
            Transport.Response r = session.request(Endpoint.GET_GRANT, Api.ANSWER_MARGIN_NANOS, namespace, name);
            if (r.status() == 200) {
                info = Api.grantFromAnswer(r.status(), r.body());
            }
        } catch (AgentException e) {
            // the reason stays unknown
        }
        if (info != null && info.state().equals(Api.LOST) && info.lostReason() != null) {
            end(State.LOST, LostReason.fromWireOrRevoked(info.lostReason()),
                    info.lostMessage() != null ? info.lostMessage() : err.detail());
        } else {
            end(State.LOST, LostReason.REVOKED, err.detail());
        }
    }

    // -- state, for the session --------------------------------------------------------

    String key() {
        return Api.GrantInfo.key(namespace, name);
    }

    long deadline() {
        synchronized (lock) {
            return deadline;
        }
    }

    Integer durationSeconds() {
        return durationSeconds;
    }

    /** The state on the clock now: held past the local deadline is lost, then released in the background. */
    State now() {
        boolean due;
        boolean releaseIt;
        synchronized (lock) {
            due = state == State.HELD && System.nanoTime() - deadline >= 0;
            releaseIt = due && !letGo;
        }
        if (due && end(State.LOST, LostReason.LOCAL_DEADLINE, "validForMs ran out before the agent answered again")
                && releaseIt) {
            session.releaseLater(this);
        }
        synchronized (lock) {
            return state;
        }
    }

    /** The answer to a request sent at {@code sent} names this grant: its state, and while held a later deadline. */
    void update(long sent, Api.GrantInfo info) {
        apply(info);
        if (!info.state().equals(Api.HELD) || info.token() == null || info.token() != token) {
            return;
        }
        if (info.durationSeconds() != null) {
            durationSeconds = info.durationSeconds();
        }
        synchronized (lock) {
            long now = System.nanoTime();
            // Never after the last deadline passed, and never from an older request's answer.
            if (state == State.HELD && sent - deadlineSent >= 0 && now - deadline < 0) {
                deadline = sent + info.validForMs() * 1_000_000L;
                deadlineSent = sent;
            }
        }
    }

    /** A report of the grant's state (an event, or an answer). */
    void apply(Api.GrantInfo info) {
        Api.Verdict verdict = Api.judge(token, info);
        if (!verdict.lost()) {
            return;
        }
        boolean let;
        synchronized (lock) {
            let = letGo;
        }
        if (let && info.state().equals(Api.RELEASED)) {
            end(State.RELEASED, null, null);
        } else {
            end(State.LOST, verdict.reason(), verdict.message());
        }
    }

    /** Ends the grant: LOST with a reason, or RELEASED; false if it had ended already. */
    boolean end(State to, LostReason reason, String message) {
        synchronized (lock) {
            if (state != State.HELD) {
                return false;
            }
            state = to;
            if (to == State.LOST) {
                lostReason = reason;
                lostMessage = message;
            }
        }
        session.forget(this);
        lost.complete(to == State.LOST ? reason : LostReason.RELEASED);
        // The application first, the log after: a logger's first use can take milliseconds.
        if (to == State.LOST) {
            LOG.log(Level.WARNING, "lease {0}/{1} (token {2}) lost: {3}{4}", new Object[] {namespace, name,
                    String.valueOf(token), reason.wireName(), message == null ? "" : ": " + message});
        }
        return true;
    }

    /** Ends it as the session ended: lost with the session's reason, or released by close(). */
    void endWithSession(LostReason reason, String message) {
        if (reason == null) {
            end(State.RELEASED, null, null);
        } else {
            end(State.LOST, reason, message);
        }
    }

    boolean isHeldState() {
        return now() == State.HELD;
    }

    private void raiseIfEnded() {
        State s = now();
        synchronized (lock) {
            if (s == State.LOST) {
                throw new LeaseLostException(lostReason, lostMessage);
            }
            if (s == State.RELEASED || letGo) {
                throw new LeaseLostException(LostReason.RELEASED, "the grant was released");
            }
        }
    }
}
