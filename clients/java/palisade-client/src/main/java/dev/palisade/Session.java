package dev.palisade;

import java.io.IOException;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.logging.Level;
import java.util.logging.Logger;

/**
 * One application process's session with the agent.
 *
 * <p>Opening it creates the session and its event stream (read by a daemon thread); a
 * second daemon thread GETs the session every third of its keepalive and every sixth of
 * the shortest Lease duration held (a keepalive, and new deadlines for its grants), and
 * ends each grant at its local deadline. When no keepalive succeeds within the keepalive,
 * or the event stream ends, the session has ended and every grant of it is lost.
 * {@link #close()} ends it, releasing every Lease it holds or waits for. Thread-safe.
 */
public final class Session implements AutoCloseable {
    private static final Logger LOG = Logger.getLogger("dev.palisade");

    private final Address address;
    private final String id;
    private final String namespace;
    private final long keepaliveMs;
    private final Transport.Stream stream;
    private final Object lock = new Object();
    // Guarded by lock.
    private boolean stopped;
    private boolean woken;
    private LostReason endReason;
    private String endMessage;
    private final Map<String, Grant> grants = new HashMap<>();
    // The latest state the event stream reported for each Lease, for a grant whose
    // acquire answer comes after its events.
    private final Map<String, Api.GrantInfo> reports = new HashMap<>();
    // Releases of grants lost by their deadline, under way.
    private final Map<String, CountDownLatch> releases = new HashMap<>();

    private Session(SessionOptions options) {
        this.address = Address.resolve(options);
        long sent = System.nanoTime();
        Transport.Response r;
        try {
            r = Transport.request(address, "POST", Endpoint.CREATE_SESSION.target(), Json.write(Api.sessionBody(options)),
                    Api.ANSWER_MARGIN_NANOS, false);
        } catch (InterruptedException e) {
            throw new AssertionError("an uninterruptible request was interrupted", e);
        }
        if (r.status() != 201) {
            throw Api.errorFromResponse(r.status(), r.body());
        }
        Api.SessionInfo info = Api.sessionFromAnswer(r.status(), r.body());
        this.id = info.id();
        this.namespace = info.namespace();
        this.keepaliveMs = info.keepaliveMs();
        Transport.Stream s;
        try {
            s = new Transport.Stream(address, Endpoint.EVENTS.target(id), Api.ANSWER_MARGIN_NANOS);
            if (s.status() != 200) {
                byte[] body = s.readAll(Api.ANSWER_MARGIN_NANOS);
                s.close();
                throw Api.errorFromResponse(s.status(), body);
            }
        } catch (RuntimeException e) {
            deleteSession();
            throw e;
        }
        this.stream = s;
        Thread events = new Thread(this::readEvents, "palisade-events-" + id);
        events.setDaemon(true);
        Thread keepalive = new Thread(() -> keepalive(sent), "palisade-keepalive-" + id);
        keepalive.setDaemon(true);
        events.start();
        keepalive.start();
    }

    /** Opens a session with {@link SessionOptions#defaults()}. */
    public static Session open() {
        return open(SessionOptions.defaults());
    }

    /**
     * Opens a session; AgentException when the agent refuses, AgentUnreachableException when
     * there is none. Not interruptible (its requests are short): an interrupt status is kept.
     */
    public static Session open(SessionOptions options) {
        // The event stream's connection outlives this call: it must not hold the status aside.
        boolean interrupted = Thread.interrupted();
        try {
            return new Session(options);
        } finally {
            if (interrupted) {
                Thread.currentThread().interrupt();
            }
        }
    }

    /**
     * Acquires the Lease {@code name} and returns its Grant once held, waiting as long as it
     * takes. Interrupted, it leaves the queue and throws InterruptedException with the
     * interrupt status set. AgentException when the agent refuses (e.g. a bad name:
     * field "name"), LeaseLostException when the session ends meanwhile or the acquire failed.
     */
    public Grant acquire(String name, AcquireOptions options) throws InterruptedException {
        return acquire(name, options, -1).orElseThrow();
    }

    /**
     * As {@link #acquire}, but waits {@code timeout} at most: then the claim leaves the
     * queue and the result is empty.
     */
    public Optional<Grant> tryAcquire(String name, Duration timeout, AcquireOptions options) throws InterruptedException {
        if (timeout == null || timeout.isNegative()) {
            throw new IllegalArgumentException("timeout must be >= 0, not " + timeout);
        }
        long nanos;
        try {
            nanos = timeout.toNanos();
        } catch (ArithmeticException e) {
            nanos = Long.MAX_VALUE / 4;
        }
        return acquire(name, options, Math.min(nanos, Long.MAX_VALUE / 4));
    }

    /** The session's id. */
    public String id() {
        return id;
    }

    /** The agent's default namespace (its pod's): that of a Lease acquired without one. */
    public String namespace() {
        return namespace;
    }

    /** How long the session lives without a keepalive (the agent's answer). */
    public Duration keepalive() {
        return Duration.ofMillis(keepaliveMs);
    }

    /** Whether the session has ended (closed, or lost). */
    public boolean isEnded() {
        synchronized (lock) {
            return stopped;
        }
    }

    /** Ends the session: the agent releases every Lease it holds or waits for. Idempotent. */
    @Override
    public void close() {
        if (!finish(null, null)) {
            return;
        }
        deleteSession();
        stream.close();
    }

    @Override
    public String toString() {
        return "Session[" + id + " at " + address + (isEnded() ? " ended" : " open") + "]";
    }

    // -- acquire -----------------------------------------------------------------------

    /** Thrown inside acquire when its timeout passes. */
    private static final class TimedOut extends Exception {
        private static final long serialVersionUID = 1L;

        TimedOut() {
            super(null, null, false, false);
        }
    }

    private Optional<Grant> acquire(String name, AcquireOptions options, long timeoutNanos) throws InterruptedException {
        if (name == null || name.isEmpty()) {
            throw new IllegalArgumentException("name must be a non-empty string");
        }
        AcquireOptions opts = options == null ? AcquireOptions.defaults() : options;
        long start = System.nanoTime();
        if (Thread.currentThread().isInterrupted()) {
            throw new InterruptedException("acquire of " + name + " interrupted before it began");
        }
        raiseIfEnded();
        joinPendingReleases(name, opts.namespace().orElse(null));
        boolean answered = false;
        Api.GrantInfo info = null;
        try {
            int waitMs = Api.waitMsFor(remaining(start, timeoutNanos));
            long sent = System.nanoTime();
            Transport.Response r = call(Endpoint.ACQUIRE, Json.write(Api.acquireBody(name, opts, waitMs)),
                    waitMs * 1_000_000L + Api.ANSWER_MARGIN_NANOS);
            answered = true;
            if (r.status() != 200 && r.status() != 202) {
                throw error(r); // refused: no claim was made
            }
            info = Api.grantFromAnswer(r.status(), r.body());
            while (info.state().equals(Api.WAITING)) {
                raiseIfEnded();
                long left = remaining(start, timeoutNanos);
                if (timeoutNanos >= 0 && left <= 0) {
                    throw new TimedOut();
                }
                waitMs = Api.waitMsFor(left);
                sent = System.nanoTime();
                r = call(Endpoint.GET_GRANT, "?waitMs=" + waitMs, null, waitMs * 1_000_000L + Api.ANSWER_MARGIN_NANOS,
                        true, info.namespace(), info.name());
                if (r.status() != 200) {
                    throw error(r);
                }
                info = Api.grantFromAnswer(r.status(), r.body());
            }
            // validForMs is counted from the send of the request that carried it. A long poll
            // may be answered long after its send, leaving little of it: then a GET, answered
            // at once, gives the count a fresh start. (As the Go client; an extra request on
            // every grant costs the handover a round trip.)
            if (info.state().equals(Api.HELD)
                    && System.nanoTime() - sent > info.validForMs() * 1_000_000L / 2) {
                sent = System.nanoTime();
                r = call(Endpoint.GET_GRANT, null, Api.ANSWER_MARGIN_NANOS, info.namespace(), info.name());
                if (r.status() != 200) {
                    throw error(r);
                }
                info = Api.grantFromAnswer(r.status(), r.body());
            }
            if (info.state().equals(Api.HELD) && info.token() != null) {
                return Optional.of(register(info, sent));
            }
        } catch (TimedOut e) {
            abandon(name, opts, info);
            return Optional.empty();
        } catch (InterruptedException e) {
            abandon(name, opts, info);
            Thread.currentThread().interrupt();
            throw e;
        } catch (RuntimeException | Error e) {
            // Leave the queue: a waiting claim would be granted to nobody and hold the Lease up.
            if (info != null || !answered) {
                abandon(name, opts, info);
            }
            throw e;
        }
        if (info.state().equals(Api.LOST)) {
            throw new LeaseLostException(LostReason.fromWireOrRevoked(info.lostReason()),
                    info.lostMessage() == null ? "" : info.lostMessage());
        }
        throw new AgentException(200, "unexpected_response", null, "acquire answered state " + info.state());
    }

    private static long remaining(long start, long timeoutNanos) {
        return timeoutNanos < 0 ? -1 : Math.max(0, start + timeoutNanos - System.nanoTime());
    }

    /** A release of this Lease still under way would end the new grant: waits for it (a while). */
    private void joinPendingReleases(String name, String ns) throws InterruptedException {
        List<CountDownLatch> pending = new ArrayList<>();
        synchronized (lock) {
            for (Map.Entry<String, CountDownLatch> e : releases.entrySet()) {
                String key = e.getKey();
                if (key.endsWith("/" + name) && (ns == null || key.equals(Api.GrantInfo.key(ns, name)))) {
                    pending.add(e.getValue());
                }
            }
        }
        try {
            for (CountDownLatch done : pending) {
                done.await(Api.ANSWER_MARGIN_NANOS, TimeUnit.NANOSECONDS);
            }
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt(); // as every interrupted acquire leaves it
            throw e;
        }
    }

    /**
     * Releases the claim an unfinished acquire made; without its answer, whichever claims
     * of that name the session has that no Grant holds. Not interruptible.
     */
    private void abandon(String name, AcquireOptions opts, Api.GrantInfo info) {
        if (isEnded()) {
            return;
        }
        try {
            List<String[]> keys = new ArrayList<>();
            if (info != null) {
                keys.add(new String[] {info.namespace(), info.name()});
            } else {
                Transport.Response r = request(Endpoint.GET_SESSION, Api.ANSWER_MARGIN_NANOS);
                if (r.status() != 200) {
                    throw error(r);
                }
                String ns = opts.namespace().orElse(null);
                for (Api.GrantInfo g : Api.sessionFromAnswer(r.status(), r.body()).grants()) {
                    boolean known;
                    synchronized (lock) {
                        known = grants.containsKey(g.key());
                    }
                    if (g.name().equals(name) && (ns == null || g.namespace().equals(ns)) && !known
                            && (g.state().equals(Api.WAITING) || g.state().equals(Api.HELD))) {
                        keys.add(new String[] {g.namespace(), g.name()});
                    }
                }
            }
            for (String[] k : keys) {
                request(Endpoint.RELEASE, Api.ANSWER_MARGIN_NANOS, k[0], k[1]);
            }
        } catch (PalisadeException e) {
            LOG.log(Level.WARNING, "leaving the queue of " + name + ": " + e.getMessage());
        }
    }

    private Grant register(Api.GrantInfo info, long sent) {
        Grant grant = new Grant(this, info, sent);
        boolean ended;
        Api.GrantInfo report;
        LostReason reason;
        String message;
        synchronized (lock) {
            ended = stopped;
            reason = endReason;
            message = endMessage;
            if (!ended) {
                grants.put(grant.key(), grant);
            }
            report = reports.get(grant.key());
        }
        if (ended) {
            grant.endWithSession(reason != null ? reason : LostReason.SESSION_ENDED, message);
            return grant;
        }
        if (report != null) {
            grant.apply(report);
        }
        wake(); // its deadline and duration may call for an earlier refresh
        return grant;
    }

    // -- requests, for the grants ------------------------------------------------------

    /** Sends a request naming this session (and {@code params} after it); {@code query} starts with '?' or is empty. */
    private Transport.Response call(Endpoint endpoint, String query, String json, long timeoutNanos,
            boolean interruptible, String... params) throws InterruptedException {
        String[] all = new String[params.length + 1];
        all[0] = id;
        System.arraycopy(params, 0, all, 1, params.length);
        return Transport.request(address, endpoint.method, endpoint.target(all) + query, json, timeoutNanos, interruptible);
    }

    /** An interruptible request naming this session. */
    private Transport.Response call(Endpoint endpoint, String json, long timeoutNanos, String... params)
            throws InterruptedException {
        return call(endpoint, "", json, timeoutNanos, true, params);
    }

    /** A request naming this session that an interrupt does not stop (releases, checks, keepalives). */
    Transport.Response request(Endpoint endpoint, long timeoutNanos, String... params) {
        try {
            return call(endpoint, "", null, timeoutNanos, false, params);
        } catch (InterruptedException e) {
            throw new AssertionError("an uninterruptible request was interrupted", e);
        }
    }

    /** The exception for an error answer; unknown_session means the session ended. */
    RuntimeException error(Transport.Response r) {
        AgentException err = Api.errorFromResponse(r.status(), r.body());
        if (err.code().equals("unknown_session")) {
            end(LostReason.SESSION_ENDED, err.detail());
            return new LeaseLostException(LostReason.SESSION_ENDED, err.detail());
        }
        return err;
    }

    private void raiseIfEnded() {
        synchronized (lock) {
            if (stopped) {
                throw new LeaseLostException(endReason != null ? endReason : LostReason.RELEASED,
                        endMessage != null ? endMessage : "the session was closed");
            }
        }
    }

    /** Releases a grant lost by its local deadline, in the background: the agent would renew it for nobody. */
    void releaseLater(Grant grant) {
        CountDownLatch done = new CountDownLatch(1);
        synchronized (lock) {
            if (stopped) {
                return; // ending the session released it
            }
            releases.put(grant.key(), done);
        }
        Thread t = new Thread(() -> {
            try {
                request(Endpoint.RELEASE, Api.ANSWER_MARGIN_NANOS, grant.namespace(), grant.name());
            } catch (PalisadeException e) {
                LOG.log(Level.INFO, "releasing " + grant.key() + " after its deadline: " + e.getMessage());
            } finally {
                synchronized (lock) {
                    releases.remove(grant.key(), done);
                }
                done.countDown();
            }
        }, "palisade-release-" + grant.name());
        t.setDaemon(true);
        t.start();
    }

    void forget(Grant grant) {
        synchronized (lock) {
            grants.remove(grant.key(), grant);
        }
    }

    // -- the keepalive thread ------------------------------------------------------------

    private void wake() {
        synchronized (lock) {
            woken = true;
            lock.notifyAll();
        }
    }

    private List<Grant> held() {
        synchronized (lock) {
            return new ArrayList<>(grants.values());
        }
    }

    /**
     * GETs the session every min(keepalive/3, shortest duration/6), each request bounded by
     * that interval (an answer after a deadline would come too late for it), and ends each
     * grant at its deadline, on time; {@code lastOk} is when the last successful one was sent.
     */
    private void keepalive(long lastOk) {
        long lifetime = keepaliveMs * 1_000_000L;
        long retryAt = lastOk;
        while (!isEnded()) {
            for (Grant g : held()) {
                g.isHeldState(); // lost if past its deadline
            }
            long now = System.nanoTime();
            if (now - (lastOk + lifetime) >= 0) {
                end(LostReason.KEEPALIVE_MISSED, "no keepalive succeeded for " + keepaliveMs + " ms");
                return;
            }
            List<Grant> grantsNow = held();
            List<Integer> durations = new ArrayList<>();
            long firstDeadline = now + Long.MAX_VALUE / 4;
            for (Grant g : grantsNow) {
                if (g.durationSeconds() != null && g.durationSeconds() > 0) {
                    durations.add(g.durationSeconds());
                }
                if (g.deadline() - firstDeadline < 0) {
                    firstDeadline = g.deadline();
                }
            }
            if (firstDeadline - now <= 0) {
                continue; // one more lapsed since the clock was read
            }
            long interval = Api.refreshIntervalNanos(keepaliveMs, durations);
            long nextSend = later(lastOk + interval, retryAt);
            if (now - nextSend < 0) {
                long until = earlier(earlier(nextSend, lastOk + lifetime), firstDeadline);
                sleepUntil(until);
                continue;
            }
            long timeout = Math.min(interval, Math.min(lastOk + lifetime - now, firstDeadline - now));
            Transport.Response r;
            try {
                r = Transport.request(address, "GET", Endpoint.GET_SESSION.target(id), null, timeout, false);
            } catch (AgentException e) {
                r = null;
                if (isEnded()) {
                    return;
                }
                LOG.log(Level.WARNING, "keepalive of session " + id + " failed: " + e.getMessage());
            } catch (InterruptedException e) {
                throw new AssertionError("an uninterruptible request was interrupted", e);
            }
            if (r != null && r.status() == 200) {
                try {
                    refresh(now, Api.sessionFromAnswer(r.status(), r.body()).grants());
                    lastOk = now;
                    retryAt = now;
                    continue;
                } catch (AgentException e) {
                    LOG.log(Level.WARNING, "keepalive of session " + id + ": " + e.getMessage());
                }
            } else if (r != null && r.status() == 404) {
                end(LostReason.SESSION_ENDED, Api.errorFromResponse(r.status(), r.body()).detail());
                return;
            } else if (r != null) {
                LOG.log(Level.WARNING, "keepalive of session " + id + " failed: HTTP " + r.status() + " " + r.text());
            }
            // Retry sooner than the interval: the deadlines do not move.
            retryAt = System.nanoTime() + interval / 4;
        }
    }

    private static long later(long a, long b) {
        return a - b >= 0 ? a : b;
    }

    private static long earlier(long a, long b) {
        return a - b <= 0 ? a : b;
    }

    private void sleepUntil(long until) {
        synchronized (lock) {
            while (!woken && !stopped) {
                long left = until - System.nanoTime();
                if (left <= 0) {
                    break;
                }
                try {
                    TimeUnit.NANOSECONDS.timedWait(lock, left);
                } catch (InterruptedException e) {
                    return; // nobody interrupts this thread but to stop it; the loop checks
                }
            }
            woken = false;
        }
    }

    private void refresh(long sent, List<Api.GrantInfo> infos) {
        Map<String, Grant> now;
        synchronized (lock) {
            now = new HashMap<>(grants);
        }
        for (Api.GrantInfo info : infos) {
            Grant g = now.get(info.key());
            if (g != null) {
                g.update(sent, info);
            }
        }
    }

    // -- the event stream ----------------------------------------------------------------

    private void readEvents() {
        SseParser sse = new SseParser();
        String why = "the agent closed the event stream";
        try {
            stream.readBody(chunk -> {
                for (SseParser.Event event : sse.feed(chunk)) {
                    for (Api.GrantInfo info : Api.grantsOfEvent(event.event(), event.data())) {
                        report(info);
                    }
                }
            });
        } catch (IOException | ProtocolException e) {
            why = "the event stream broke: " + Transport.describe(e);
        } catch (IllegalArgumentException e) {
            why = "the event stream sent an event this client cannot read: " + e.getMessage();
        } catch (InterruptedException e) {
            why = "the event stream's thread was interrupted";
        } catch (RuntimeException e) {
            why = "the event stream's thread failed: " + e;
            LOG.log(Level.WARNING, why, e);
        }
        end(LostReason.SESSION_ENDED, why);
    }

    private void report(Api.GrantInfo info) {
        Grant grant;
        synchronized (lock) {
            reports.put(info.key(), info);
            grant = grants.get(info.key());
        }
        if (grant != null) {
            grant.apply(info);
        }
    }

    // -- the end -------------------------------------------------------------------------

    /** The session ended without close(): every grant is lost; closing the stream ends it at the agent too. */
    void end(LostReason reason, String message) {
        if (finish(reason, message)) {
            stream.close();
        }
    }

    /** Marks the session ended (reason null: closed) and ends its grants; false if it had ended already. */
    private boolean finish(LostReason reason, String message) {
        List<Grant> all;
        synchronized (lock) {
            if (stopped) {
                return false;
            }
            stopped = true;
            endReason = reason;
            endMessage = message;
            all = new ArrayList<>(grants.values());
            lock.notifyAll();
        }
        // The application first, the log after: a logger's first use can take milliseconds.
        for (Grant g : all) {
            g.endWithSession(reason, message);
        }
        if (reason != null) {
            LOG.log(Level.WARNING, "palisade session " + id + " ended: " + reason.wireName()
                    + (message != null ? ": " + message : ""));
        }
        return true;
    }

    private void deleteSession() {
        try {
            Transport.request(address, "DELETE", Endpoint.END_SESSION.target(id), null, Api.ANSWER_MARGIN_NANOS, false);
        } catch (AgentException e) {
            LOG.log(Level.WARNING, "ending session " + id + ": " + e.getMessage());
        } catch (InterruptedException e) {
            throw new AssertionError("an uninterruptible request was interrupted", e);
        }
    }
}
