// The Java client's conformance driver (clients/java/palisade-client), for tests/conformance:
// the protocol of tests/conformance/README.md through the client's public API only.
//
//   palisade-conformance-java --lease NAME [--namespace NS] [--duration-seconds N] [--keepalive-ms N]
//       [--grants N]
//
// The agent is at $PALISADE_AGENT_SOCKET. stdout: `granted <token> <claim UID> slot=<slot>
// fence-key=<key>`, then `write <token>` every 100 ms without looking at the grant; when the
// client reports the grant lost, `lost <reason>`, one more `write <token>` (the write in flight,
// which the fence must refuse) and exit 3; on a `release` line, stdin's end or SIGTERM, release,
// `released`, exit 0 (also while still waiting in acquire: the wait is given up). With --grants N
// (default 1), a `release` line before the N-th grant releases, says `released` and acquires the
// same Lease again in the same session (a long-running service's next acquire, in a warm JVM);
// stdin's end and SIGTERM still release and exit 0 at once. Diagnostics on stderr; exit 1 when no
// grant could be had, 2 on bad arguments.

import dev.palisade.AcquireOptions;
import dev.palisade.AgentException;
import dev.palisade.Grant;
import dev.palisade.LeaseLostException;
import dev.palisade.LostReason;
import dev.palisade.Session;
import dev.palisade.SessionOptions;

import java.io.BufferedReader;
import java.io.IOException;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.time.Duration;
import java.util.Optional;
import java.util.concurrent.BlockingQueue;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;

public final class Driver {
    private static final long WRITE_EVERY_NANOS = TimeUnit.MILLISECONDS.toNanos(100);
    private static final int EXIT_LOST = 3;

    /** What wakes the main thread: a request to quit, or a grant's loss (or release). */
    private record Event(String quit, Grant grant, LostReason lost) {}

    private final BlockingQueue<Event> events = new LinkedBlockingQueue<>();
    /** True while the main thread waits in acquire: a quit then interrupts it. */
    private final AtomicBoolean waiting = new AtomicBoolean();
    private final Thread main = Thread.currentThread();

    public static void main(String[] args) {
        Options options;
        try {
            options = Options.parse(args);
        } catch (IllegalArgumentException e) {
            System.err.println("driver: " + e.getMessage());
            System.err.println("usage: palisade-conformance-java --lease NAME [--namespace NS]"
                    + " [--duration-seconds N] [--keepalive-ms N] [--grants N]");
            System.exit(2);
            return;
        }
        int code = new Driver().run(options);
        System.out.flush();
        System.exit(code);
    }

    private static void say(String line) {
        synchronized (System.out) {
            System.out.println(line);
            System.out.flush();
        }
    }

    private int run(Options options) {
        // SIGTERM through sun.misc.Signal (jdk.unsupported), not a shutdown hook: the handler
        // replaces the JVM's own, so SIGTERM does not start the JVM's shutdown. The release then
        // runs on the main thread exactly as for a `release` line, with the client's threads
        // untouched, and the exit status is ours (0). A shutdown hook would run during shutdown,
        // concurrently with every other hook, and could only end with Runtime.halt, since the
        // JVM would otherwise exit 143.
        sun.misc.Signal.handle(new sun.misc.Signal("TERM"), signal -> quit("SIGTERM"));
        Thread stdin = new Thread(this::watchStdin, "stdin");
        stdin.setDaemon(true);
        stdin.start();

        Session session;
        try {
            SessionOptions sessionOptions = SessionOptions.defaults().name("conformance-java");
            String socket = System.getenv("PALISADE_AGENT_SOCKET");
            if (socket != null && !socket.isEmpty()) {
                sessionOptions = sessionOptions.socket(Path.of(socket));
            }
            if (options.keepaliveMs > 0) {
                sessionOptions = sessionOptions.keepalive(Duration.ofMillis(options.keepaliveMs));
            }
            session = Session.open(sessionOptions);
        } catch (AgentException e) {
            System.err.println("driver: session: " + e);
            return 1;
        }

        AcquireOptions acquireOptions = AcquireOptions.defaults();
        if (options.namespace != null) {
            acquireOptions = acquireOptions.namespace(options.namespace);
        }
        if (options.durationSeconds > 0) {
            acquireOptions = acquireOptions.durationSeconds(options.durationSeconds);
        }
        for (int n = 1; ; n++) {
            int code = grant(session, options.lease, acquireOptions, n < options.grants);
            if (code >= 0) {
                return code;
            }
        }
    }

    /**
     * Acquires the Lease, holds it until asked to quit or told it is lost, and releases it: -1
     * when the Lease is to be acquired again (a `release` line while {@code more} may follow),
     * otherwise the driver's exit status.
     */
    private int grant(Session session, String lease, AcquireOptions acquireOptions, boolean more) {
        Grant grant;
        try {
            grant = acquire(session, lease, acquireOptions);
        } catch (LeaseLostException e) {
            System.err.println("driver: acquire: " + e);
            say("lost " + e.reason().wireName());
            return EXIT_LOST;
        } catch (AgentException e) {
            System.err.println("driver: acquire: " + e);
            return 1;
        }
        if (grant == null) { // asked to quit before the grant: the wait was given up
            session.close();
            say("released");
            return 0;
        }

        long token = grant.token();
        // The slot and its key: the suite fences this grant's writes under that key.
        say("granted " + token + " " + grant.claimUid() + " slot=" + grant.slot()
                + " fence-key=" + grant.fenceKey());
        grant.lost().thenAccept(reason -> events.add(new Event(null, grant, reason)));
        String why = writeUntilEvent(grant, token);
        if (why == null) {
            return EXIT_LOST;
        }
        System.err.println("driver: " + why + ": releasing");
        try {
            grant.release();
        } catch (LeaseLostException e) {
            return lost(e.reason(), token);
        } catch (AgentException e) {
            System.err.println("driver: release: " + e);
            return 1;
        }
        // Lost before the release got there: the reason is the loss, not RELEASED.
        Optional<LostReason> reason = grant.lostReason();
        if (reason.isPresent() && reason.get() != LostReason.RELEASED) {
            return lost(reason.get(), token);
        }
        boolean again = more && why.equals("release");
        if (!again) {
            session.close();
        }
        say("released");
        return again ? -1 : 0;
    }

    /**
     * Acquires on the main thread, waiting as long as it takes (on this thread, so that the
     * grant reaches the `granted` line without a hand-off between threads); a request to quit
     * meanwhile interrupts the wait. The grant, or null once the wait was given up.
     */
    private Grant acquire(Session session, String lease, AcquireOptions options) {
        // A quit that came while no wait was under way (during a release) is in the queue:
        // quit() adds its event before it looks at this flag.
        waiting.set(true);
        if (quitPending() && waiting.compareAndSet(true, false)) {
            return null;
        }
        Grant grant;
        try {
            grant = session.acquire(lease, options);
        } catch (InterruptedException e) {
            return null; // only quit() interrupts this thread
        }
        if (!waiting.compareAndSet(true, false)) { // a quit came as it was granted: let it go
            Thread.interrupted(); // its interrupt, if it came after the acquire returned
            grant.release();
            return null;
        }
        return grant;
    }

    private boolean quitPending() {
        for (Event event : events) {
            if (event.quit != null) {
                return true;
            }
        }
        return false;
    }

    /** Writes every 100 ms until an event: the quit's reason, or null once the loss is said. */
    private String writeUntilEvent(Grant grant, long token) {
        long next = System.nanoTime() + WRITE_EVERY_NANOS;
        while (true) {
            Event event;
            try {
                event = events.poll(Math.max(0, next - System.nanoTime()), TimeUnit.NANOSECONDS);
            } catch (InterruptedException e) {
                throw new IllegalStateException("the main thread is never interrupted", e);
            }
            if (event == null) {
                // No validity check first: the suite's fence judges the write.
                say("write " + token);
                // Ticks missed (the process was stopped) are dropped, not made up in a burst.
                long now = System.nanoTime();
                next += WRITE_EVERY_NANOS;
                if (next - now <= 0) {
                    next = now + WRITE_EVERY_NANOS;
                }
                continue;
            }
            if (event.lost != null && event.grant == grant) {
                lost(event.lost, token);
                return null;
            }
            if (event.quit != null) {
                return event.quit;
            }
        }
    }

    private static int lost(LostReason reason, long token) {
        say("lost " + reason.wireName());
        say("write " + token);
        return EXIT_LOST;
    }

    private void quit(String why) {
        events.add(new Event(why, null, null));
        if (waiting.compareAndSet(true, false)) {
            System.err.println("driver: " + why + " before the grant: the wait is given up");
            main.interrupt();
        }
    }

    /** A `release` line, or stdin's end, is a request to quit (a `release` line, to let go). */
    private void watchStdin() {
        try (BufferedReader in = new BufferedReader(
                new InputStreamReader(System.in, StandardCharsets.UTF_8))) {
            String line;
            while ((line = in.readLine()) != null) {
                if (line.trim().equals("release")) {
                    quit("release");
                }
            }
        } catch (IOException e) {
            System.err.println("driver: stdin: " + e);
        }
        quit("stdin EOF");
    }

    /** The command line. */
    private static final class Options {
        String lease;
        String namespace;
        int durationSeconds;
        long keepaliveMs;
        int grants = 1;

        static Options parse(String[] args) {
            Options o = new Options();
            for (int i = 0; i < args.length; i++) {
                String flag = args[i];
                if (i + 1 >= args.length) {
                    throw new IllegalArgumentException(flag + " needs a value");
                }
                String value = args[++i];
                try {
                    switch (flag) {
                        case "--lease" -> o.lease = value;
                        case "--namespace" -> o.namespace = value;
                        case "--duration-seconds" -> o.durationSeconds = Integer.parseInt(value);
                        case "--keepalive-ms" -> o.keepaliveMs = Long.parseLong(value);
                        case "--grants" -> o.grants = Integer.parseInt(value);
                        default -> throw new IllegalArgumentException("unknown flag " + flag);
                    }
                } catch (NumberFormatException e) {
                    throw new IllegalArgumentException(flag + ": not a number: " + value);
                }
            }
            if (o.lease == null || o.lease.isEmpty()) {
                throw new IllegalArgumentException("--lease is required");
            }
            if (o.grants < 1) {
                throw new IllegalArgumentException("--grants must be at least 1");
            }
            return o;
        }
    }
}
