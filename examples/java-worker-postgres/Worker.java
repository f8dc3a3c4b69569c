import dev.palisade.AcquireOptions;
import dev.palisade.AgentException;
import dev.palisade.Grant;
import dev.palisade.LeaderElection;
import dev.palisade.LeaseLostException;
import dev.palisade.LostReason;
import dev.palisade.Session;
import dev.palisade.SessionOptions;
import dev.palisade.jdbc.JdbcFence;
import dev.palisade.jdbc.StaleTokenException;
import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.PreparedStatement;
import java.sql.SQLException;
import java.time.Duration;
import java.time.ZonedDateTime;
import java.util.Optional;
import java.util.UUID;

/**
 * A worker that writes to PostgreSQL only while it holds a palisade Lease.
 *
 * <p>Each batch is one transaction that first calls {@code palisade.fence(key, token)} with the
 * grant's fencing token ({@link JdbcFence#check}): once a newer holder has written, PostgreSQL
 * refuses this holder's token (SQLSTATE PF001, {@link StaleTokenException}) and the whole
 * transaction with it, however late a paused or partitioned worker wakes up.
 *
 * <p>Environment: JDBC_URL (with user and password), LEASE (default java-worker), BATCH_ROWS (3),
 * WRITE_INTERVAL_MS between batches (200), PALISADE_AGENT_SOCKET (the agent's socket, default
 * /run/palisade/agent.sock), POD_NAME (recorded with every row).
 */
public final class Worker {
    private static final String TIME = "%1$tFT%1$tT.%1$tN%1$tz"; // of a ZonedDateTime, in log lines

    private final Connection db;
    private final String lease = env("LEASE", "java-worker");
    private final int batchRows = Integer.parseInt(env("BATCH_ROWS", "3"));
    private final long writeIntervalMs = Long.parseLong(env("WRITE_INTERVAL_MS", "200"));
    private final String writer = env("POD_NAME", "pid-" + ProcessHandle.current().pid());
    private final Thread mainThread = Thread.currentThread();
    private volatile boolean stopping;
    private boolean refused; // the last leadership ended with a write refused as stale

    private Worker(Connection db) {
        this.db = db;
    }

    public static void main(String[] args) throws Exception {
        // The client's log records (java.util.logging) on one line each, like the worker's own.
        System.setProperty("java.util.logging.SimpleFormatter.format", TIME + " %3$s %4$s: %5$s%6$s%n");
        String url = System.getenv("JDBC_URL");
        if (url == null || url.isEmpty()) {
            log("set JDBC_URL, e.g. jdbc:postgresql://127.0.0.1:5432/db?user=u");
            System.exit(2);
        }
        try (Connection db = DriverManager.getConnection(url)) {
            // Off: each batch is then one real transaction (BEGIN ... COMMIT), never a savepoint
            // (a refused fence inside a savepoint would leave the transaction going). pgjdbc's
            // autosave must stay at its default, never.
            db.setAutoCommit(false);
            new Worker(db).run();
        }
    }

    /** Holds the Lease and writes, again and again, until the pod stops (SIGTERM). */
    private void run() throws Exception {
        Runtime.getRuntime().addShutdownHook(new Thread(this::stop, "stop"));
        while (!stopping) {
            try (Session session = Session.open(SessionOptions.defaults().name("java-worker"))) {
                while (!stopping && !session.isEnded()) {
                    refused = false;
                    Optional<LostReason> lost = LeaderElection.run(session, lease, AcquireOptions.defaults(), this::lead);
                    lost.ifPresent(reason -> log("lost %s: %s", lease, reason.wireName()));
                    if (refused) {
                        // Not at once: a mark above the tokens this Lease hands out (fenced
                        // by hand, or from another cluster) would refuse each new grant.
                        sleepUnlessStopping(Duration.ofSeconds(1));
                    }
                }
            } catch (InterruptedException e) {
                if (!stopping) {
                    throw e;
                }
            } catch (AgentException | LeaseLostException e) {
                // The agent is not up yet, restarted, or ended the session: start over.
                log("%s; retrying in 1 s", e.getMessage());
                sleepUnlessStopping(Duration.ofSeconds(1));
            }
        }
        log("stopped");
    }

    /**
     * Writes batches while the grant is valid. LeaderElection interrupts this thread when the
     * grant is lost, and releases the Lease when this returns.
     */
    private void lead(Grant grant) throws SQLException {
        log("granted %s, token %d", JdbcFence.key(grant), grant.token());
        try {
            for (long batch = 0; grant.isValid() && !stopping; batch++) {
                if (!writeBatch(grant, batch)) {
                    refused = true;
                    return; // the Lease moved on; wait for it again
                }
                Thread.sleep(writeIntervalMs);
            }
        } catch (InterruptedException e) {
            // The grant was lost, or the pod is stopping: stop writing.
        } finally {
            // An interrupt that came during a JDBC call (which ignores interrupts) must not
            // cut the next acquire short.
            Thread.interrupted();
        }
    }

    /** One fenced transaction: the fence call, then the rows it protects. False when refused as stale. */
    private boolean writeBatch(Grant grant, long batch) throws SQLException {
        UUID txn = UUID.randomUUID();
        try {
            JdbcFence.check(db, grant); // SELECT palisade.fence('<namespace>/<lease>', token)
            try (PreparedStatement insert = db.prepareStatement(
                    "INSERT INTO java_worker_rows (txn, seq, token, writer, batch) VALUES (?, ?, ?, ?, ?)")) {
                for (int seq = 0; seq < batchRows; seq++) {
                    insert.setObject(1, txn);
                    insert.setInt(2, seq);
                    insert.setLong(3, grant.token());
                    insert.setString(4, writer);
                    insert.setLong(5, batch);
                    insert.addBatch();
                }
                insert.executeBatch();
            }
            db.commit();
            return true;
        } catch (StaleTokenException e) {
            db.rollback();
            log("write refused: %s", e.getMessage());
            return false;
        } catch (SQLException e) {
            db.rollback();
            throw e;
        }
    }

    /** SIGTERM (the pod deleted): stop writing, release the Lease at once, then exit. */
    private void stop() {
        stopping = true;
        mainThread.interrupt();
        try {
            mainThread.join(5_000);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
    }

    private void sleepUnlessStopping(Duration d) throws InterruptedException {
        try {
            Thread.sleep(d.toMillis());
        } catch (InterruptedException e) {
            if (!stopping) {
                throw e;
            }
        }
    }

    private static String env(String name, String otherwise) {
        String v = System.getenv(name);
        return v == null || v.isEmpty() ? otherwise : v;
    }

    private static void log(String format, Object... args) {
        System.err.println(String.format(TIME, ZonedDateTime.now()) + " worker: " + String.format(format, args));
    }
}
