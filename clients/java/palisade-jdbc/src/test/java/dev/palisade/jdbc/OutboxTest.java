package dev.palisade.jdbc;

import dev.palisade.AcquireOptions;
import dev.palisade.Grant;
import dev.palisade.Session;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Tag;
import org.junit.jupiter.api.Test;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.sql.Statement;
import java.time.Duration;
import java.time.Instant;
import java.util.HashSet;
import java.util.OptionalLong;
import java.util.Set;
import java.util.UUID;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assertions.fail;

/**
 * Outbox.enqueue against a real PostgreSQL ($PALISADE_TEST_PG_URL), in a database of the
 * class's own, palisade_java_outbox_&lt;random&gt;, with the repository's
 * sql/palisade-fence.sql and sql/palisade-outbox.sql installed; dropped at the end.
 */
@Tag("postgres")
class OutboxTest {
    private static final String DB = "palisade_java_outbox_" + UUID.randomUUID().toString().replace("-", "").substring(0, 12);
    private static final String UUID_TEXT = "[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}";

    @BeforeAll
    static void createDatabase() throws SQLException {
        try (Connection c = DriverManager.getConnection(TestDatabase.serverUrl()); Statement s = c.createStatement()) {
            s.execute("CREATE DATABASE " + DB);
        }
        try (Connection c = connect(); Statement s = c.createStatement()) {
            s.execute(sql("palisade-fence.sql"));
            s.execute(sql("palisade-outbox.sql"));
            s.execute("CREATE TABLE ledger (id bigserial PRIMARY KEY, key text NOT NULL, token bigint NOT NULL, seq bigint);"
                    + "CREATE TABLE commit_seq (key text PRIMARY KEY, n bigint NOT NULL)");
        }
    }

    @AfterAll
    static void dropDatabase() throws SQLException {
        try (Connection c = DriverManager.getConnection(TestDatabase.serverUrl()); Statement s = c.createStatement()) {
            s.execute("DROP DATABASE IF EXISTS " + DB + " WITH (FORCE)");
        }
    }

    @Test
    void theIntentCommitsWithTheFencedWrite() throws SQLException {
        String key = TestDatabase.uniqueKey("outbox-current");
        try (Connection c = connect()) {
            c.setAutoCommit(false);
            write(c, key, 7, null);
            String id = Outbox.enqueue(c, key, 7, "{\"charge\": {\"amount\": 1250, \"currency\": \"EUR\"}}");
            assertTrue(id.matches(UUID_TEXT), id);
            c.commit();
            try (PreparedStatement s = c.prepareStatement("SELECT key, token, state, "
                    + "payload = '{\"charge\": {\"amount\": 1250, \"currency\": \"EUR\"}}'::jsonb FROM palisade.outbox WHERE id = ?::uuid")) {
                s.setString(1, id);
                try (ResultSet r = s.executeQuery()) {
                    assertTrue(r.next(), "the committed intent " + id);
                    assertEquals(key, r.getString(1));
                    assertEquals(7, r.getLong(2));
                    assertEquals("pending", r.getString(3));
                    assertTrue(r.getBoolean(4), "the payload as sent");
                }
            }
            // The same token again (a holder writes many times with one token), then a higher one.
            Set<String> ids = new HashSet<>(Set.of(id, Outbox.enqueue(c, key, 7, "[1, 2]"), Outbox.enqueue(c, key, 8, "{}")));
            c.commit();
            assertEquals(3, ids.size());
            assertEquals(3, intents(c, key, 7) + intents(c, key, 8));
        }
    }

    @Test
    void aStaleTokenInsertsNothingAndAbortsTheWrite() throws SQLException {
        String key = TestDatabase.uniqueKey("outbox-stale");
        try (Connection c = connect()) {
            c.setAutoCommit(false);
            Outbox.enqueue(c, key, 34, "{\"n\": 34}");
            c.commit();

            write(c, key, 33, null); // the write first: the refused enqueue after it aborts it too
            StaleTokenException stale = assertThrows(StaleTokenException.class, () -> Outbox.enqueue(c, key, 33, "{\"n\": 33}"));
            assertEquals(key, stale.key());
            assertEquals(33, stale.token());
            assertEquals(OptionalLong.of(34), stale.highest());
            assertEquals("PF001", stale.getSQLState());
            assertNotNull(stale.getCause(), "the driver's exception is kept");
            // A program that ignores the refusal and commits anyway writes nothing.
            try {
                c.commit();
            } catch (SQLException expected) {
                // pgjdbc reports that the server rolled the failed transaction back
            }
            c.rollback();
            assertEquals(0, intents(c, key, 33), "the stale token's intent");
            assertEquals(0, ledgerRows(c, key), "the stale token's write");
            assertEquals(1, intents(c, key, 34));
        }
    }

    @Test
    void theIntentIsRolledBackWithItsTransaction() throws SQLException {
        String key = TestDatabase.uniqueKey("outbox-rollback");
        try (Connection c = connect()) {
            c.setAutoCommit(false);
            Outbox.enqueue(c, key, 5, "{}");
            c.rollback();
            assertEquals(0, intents(c, key, 5));
        }
    }

    @Test
    void autocommitIsRefusedBeforeAnythingIsSent() throws SQLException {
        String key = TestDatabase.uniqueKey("outbox-autocommit");
        try (Connection c = connect()) {
            assertTrue(c.getAutoCommit());
            IllegalStateException e = assertThrows(IllegalStateException.class, () -> Outbox.enqueue(c, key, 1, "{}"));
            assertTrue(e.getMessage().contains(key) && e.getMessage().contains("setAutoCommit(false)"), e.getMessage());
            c.setAutoCommit(false);
            assertEquals(-1, JdbcFenceTest.mark(c, key), "nothing was fenced");
        }
    }

    @Test
    void badInputKeepsTheDatabasesError() throws SQLException {
        try (Connection c = connect()) {
            c.setAutoCommit(false);
            SQLException notJson = assertThrows(SQLException.class, () -> Outbox.enqueue(c, "ns/lease", 1, "{\"unterminated\": "));
            assertEquals("22P02", notJson.getSQLState());
            c.rollback();
            SQLException negative = assertThrows(SQLException.class, () -> Outbox.enqueue(c, "ns/lease", -1, "{}"));
            assertEquals("22023", negative.getSQLState());
            c.rollback();
            assertThrows(NullPointerException.class, () -> Outbox.enqueue(c, "ns/lease", 1, null));
        }
    }

    @Test
    void aDatabaseWithoutTheOutboxSaysHowToInstallIt() throws SQLException {
        // The fence alone (JdbcFence's database): palisade.enqueue is missing.
        try (Connection c = TestDatabase.connect()) {
            c.setAutoCommit(false);
            SQLException e = assertThrows(SQLException.class, () -> Outbox.enqueue(c, "ns/lease", 1, "{}"));
            assertTrue(e.getMessage().contains("is not installed in this database")
                    && e.getMessage().contains("sql/palisade-outbox.sql"), e.getMessage());
            assertEquals("42883", e.getSQLState(), "the function palisade.enqueue is missing");
            c.rollback();
        }
    }

    @Test
    @Tag("agent")
    void aGrantEnqueuesUnderNamespaceSlashLeaseAndItsSuccessorRefusesIt() throws Exception {
        String lease = "outbox-" + UUID.randomUUID().toString().substring(0, 8);
        try (Session session = JdbcFenceGrantTest.openSession(); Connection c = connect()) {
            c.setAutoCommit(false);
            Grant first = session.acquire(lease, AcquireOptions.defaults());
            String key = JdbcFence.key(first);
            Outbox.enqueue(c, first, "{\"holder\": 1}");
            c.commit();
            assertEquals(1, intents(c, key, first.token()), "the intent under <namespace>/<lease>");
            first.release();
            try (Grant second = session.acquire(lease, AcquireOptions.defaults())) {
                Outbox.enqueue(c, second, "{\"holder\": 2}");
                c.commit();
                // The first holder, paused past its release, comes back with its grant.
                StaleTokenException e = assertThrows(StaleTokenException.class, () -> Outbox.enqueue(c, first, "{}"));
                assertEquals(key, e.key());
                assertEquals(OptionalLong.of(second.token()), e.highest());
                c.rollback();
                assertEquals(1, intents(c, key, first.token()));
            }
        }
    }

    /**
     * Two holders of one key race, each enqueueing in every transaction: the lower token
     * enqueues until the higher one's first commit, then is refused, and no intent of the
     * lower token commits after one of the higher (a counter row, updated after the
     * enqueue in the same transaction, numbers the commits).
     */
    @Test
    void racingHoldersEnqueueInTokenOrder() throws Exception {
        String key = TestDatabase.uniqueKey("outbox-race");
        long low = 100;
        long high = 200;
        int highWrites = 20;
        try (Connection c = connect(); PreparedStatement s = c.prepareStatement("INSERT INTO commit_seq (key, n) VALUES (?, 0)")) {
            s.setString(1, key);
            s.executeUpdate();
        }
        CountDownLatch lowHasWritten = new CountDownLatch(5);
        CountDownLatch highIsDone = new CountDownLatch(1);
        ExecutorService pool = Executors.newFixedThreadPool(2);
        try {
            Future<StaleTokenException> lowWriter = pool.submit(() -> {
                Instant deadline = Instant.now().plus(Duration.ofSeconds(60));
                try (Connection c = connect()) {
                    c.setAutoCommit(false);
                    // Until refused; at most 3 transactions once the higher token is done (the
                    // fence refuses the first).
                    for (int after = 0; after < 3 && Instant.now().isBefore(deadline); ) {
                        if (highIsDone.getCount() == 0) {
                            after++;
                        }
                        try {
                            numbered(c, key, low);
                            lowHasWritten.countDown();
                        } catch (StaleTokenException stale) {
                            c.rollback();
                            return stale;
                        }
                    }
                }
                return null;
            });
            Future<Integer> highWriter = pool.submit(() -> {
                try {
                    assertTrue(lowHasWritten.await(30, TimeUnit.SECONDS), "the lower token's first writes");
                    try (Connection c = connect()) {
                        c.setAutoCommit(false);
                        for (int i = 0; i < highWrites; i++) {
                            numbered(c, key, high);
                        }
                    }
                    return highWrites;
                } finally {
                    highIsDone.countDown();
                }
            });
            assertEquals(highWrites, highWriter.get(90, TimeUnit.SECONDS));
            StaleTokenException refused = lowWriter.get(90, TimeUnit.SECONDS);
            assertNotNull(refused, "the lower token was never refused");
            assertEquals(low, refused.token());
            assertEquals(OptionalLong.of(high), refused.highest());
        } finally {
            pool.shutdownNow();
        }
        try (Connection c = connect(); PreparedStatement s = c.prepareStatement(
                "SELECT max(seq) FILTER (WHERE token = ?), min(seq) FILTER (WHERE token = ?) FROM ledger WHERE key = ?")) {
            assertEquals(highWrites, intents(c, key, high));
            s.setLong(1, low);
            s.setLong(2, high);
            s.setString(3, key);
            try (ResultSet r = s.executeQuery()) {
                r.next();
                assertTrue(r.getLong(1) < r.getLong(2),
                        "an intent of the lower token committed after the higher token's first: " + r.getLong(1) + " >= " + r.getLong(2));
            }
        }
    }

    /** One holder's transaction: enqueue, number the commit, write. */
    private static void numbered(Connection c, String key, long token) throws SQLException {
        Outbox.enqueue(c, key, token, "{\"holder\": " + token + "}");
        long seq;
        try (PreparedStatement s = c.prepareStatement("UPDATE commit_seq SET n = n + 1 WHERE key = ? RETURNING n")) {
            s.setString(1, key);
            try (ResultSet r = s.executeQuery()) {
                r.next();
                seq = r.getLong(1);
            }
        }
        write(c, key, token, seq);
        c.commit();
    }

    private static Connection connect() throws SQLException {
        return DriverManager.getConnection(TestDatabase.withDatabase(TestDatabase.serverUrl(), DB));
    }

    /** The repository's sql/NAME, next to the fence SQL that surefire names. */
    private static String sql(String name) {
        String fence = System.getProperty("palisade.fence.sql");
        if (fence == null) {
            fail("the system property palisade.fence.sql (the repository's sql/palisade-fence.sql) is not set: "
                    + "run the tests with Maven, whose surefire configuration sets it");
        }
        Path path = Path.of(fence).resolveSibling(name);
        try {
            return Files.readString(path);
        } catch (IOException e) {
            return fail("reading " + path + ": " + e);
        }
    }

    private static void write(Connection c, String key, long token, Long seq) throws SQLException {
        try (PreparedStatement s = c.prepareStatement("INSERT INTO ledger (key, token, seq) VALUES (?, ?, ?)")) {
            s.setString(1, key);
            s.setLong(2, token);
            if (seq == null) {
                s.setNull(3, java.sql.Types.BIGINT);
            } else {
                s.setLong(3, seq);
            }
            s.executeUpdate();
        }
    }

    private static long intents(Connection c, String key, long token) throws SQLException {
        return count(c, "SELECT count(*) FROM palisade.outbox WHERE key = ? AND token = ?", key, token);
    }

    private static long ledgerRows(Connection c, String key) throws SQLException {
        return count(c, "SELECT count(*) FROM ledger WHERE key = ? AND token >= ?", key, 0);
    }

    private static long count(Connection c, String query, String key, long token) throws SQLException {
        try (PreparedStatement s = c.prepareStatement(query)) {
            s.setString(1, key);
            s.setLong(2, token);
            try (ResultSet r = s.executeQuery()) {
                r.next();
                return r.getLong(1);
            } finally {
                if (!c.getAutoCommit()) {
                    c.commit();
                }
            }
        }
    }
}
