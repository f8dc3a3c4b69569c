package dev.palisade.jdbc;

import org.junit.jupiter.api.Tag;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.ValueSource;

import java.sql.Connection;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.time.Duration;
import java.time.Instant;
import java.util.OptionalLong;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

/** JdbcFence against a real PostgreSQL with the repository's fence installed. */
@Tag("postgres")
class JdbcFenceTest {

    @Test
    void aCurrentTokensWriteCommits() throws SQLException {
        String key = TestDatabase.uniqueKey("current");
        try (Connection c = TestDatabase.connect()) {
            c.setAutoCommit(false);
            assertEquals(OptionalLong.empty(), JdbcFence.check(c, key, 7), "the key's first token has no previous mark");
            insert(c, key, 7, null);
            c.commit();
            // The same token again, and a higher one: both admitted, each returning the mark before it.
            assertEquals(OptionalLong.of(7), JdbcFence.check(c, key, 7));
            insert(c, key, 7, null);
            c.commit();
            assertEquals(OptionalLong.of(7), JdbcFence.check(c, key, 8));
            c.commit();
            assertEquals(2, rows(c, key, 7));
            assertEquals(8, mark(c, key));
        }
    }

    @Test
    void aLowerTokenAbortsTheTransactionAndItsWrite() throws SQLException {
        String key = TestDatabase.uniqueKey("stale");
        try (Connection c = TestDatabase.connect()) {
            c.setAutoCommit(false);
            JdbcFence.check(c, key, 34);
            c.commit();

            insert(c, key, 33, null); // the write first: the fence after it still aborts it
            StaleTokenException stale = assertThrows(StaleTokenException.class, () -> JdbcFence.check(c, key, 33));
            assertEquals(key, stale.key());
            assertEquals(33, stale.token());
            assertEquals(OptionalLong.of(34), stale.highest());
            assertEquals("PF001", stale.getSQLState());
            assertNotNull(stale.getCause(), "the driver's exception is kept");
            assertTrue(stale.getMessage().contains("stale fencing token 33 for key \"" + key + "\"")
                    && stale.getMessage().contains("highest admitted token 34"), stale.getMessage());
            // A program that ignores the refusal and commits anyway still writes nothing.
            try {
                c.commit();
            } catch (SQLException expected) {
                // pgjdbc reports that the server rolled the failed transaction back
            }
            c.rollback();
            assertEquals(0, rows(c, key, 33), "the stale transaction's row");
            assertEquals(34, mark(c, key));
        }
    }

    @Test
    void autocommitIsRefusedBeforeAnythingIsSent() throws SQLException {
        String key = TestDatabase.uniqueKey("autocommit");
        try (Connection c = TestDatabase.connect()) {
            assertTrue(c.getAutoCommit());
            IllegalStateException e = assertThrows(IllegalStateException.class, () -> JdbcFence.check(c, key, 1));
            assertTrue(e.getMessage().contains(key) && e.getMessage().contains("setAutoCommit(false)"), e.getMessage());
            c.setAutoCommit(false);
            assertEquals(-1, mark(c, key), "nothing was fenced");
        }
    }

    @Test
    void aDatabaseWithoutTheFenceSaysHowToInstallIt() throws SQLException {
        try (Connection c = TestDatabase.connectBare()) {
            c.setAutoCommit(false);
            SQLException e = assertThrows(SQLException.class, () -> JdbcFence.check(c, "ns/lease", 1));
            assertTrue(e.getMessage().contains("is not installed in this database")
                    && e.getMessage().contains("sql/palisade-fence.sql"), e.getMessage());
            assertEquals("3F000", e.getSQLState(), "the schema palisade is missing");
            c.rollback();
        }
    }

    @Test
    void badInputKeepsTheDatabasesError() throws SQLException {
        try (Connection c = TestDatabase.connect()) {
            c.setAutoCommit(false);
            SQLException negative = assertThrows(SQLException.class, () -> JdbcFence.check(c, "ns/lease", -1));
            assertEquals("22023", negative.getSQLState());
            c.rollback();
            SQLException empty = assertThrows(SQLException.class, () -> JdbcFence.check(c, "", 1));
            assertEquals("22023", empty.getSQLState());
            c.rollback();
        }
    }

    /**
     * Two writers race on one key, each fencing every transaction: the lower token writes
     * until the higher one's first commit, then is refused; every committed row of the
     * lower token comes before every row of the higher one (a counter row updated after
     * the fence, in the same transaction, numbers the commits).
     */
    @ParameterizedTest(name = "isolation {0}")
    @ValueSource(ints = {Connection.TRANSACTION_READ_COMMITTED, Connection.TRANSACTION_REPEATABLE_READ,
            Connection.TRANSACTION_SERIALIZABLE})
    void racingWritersEndWithTheHigherTokenOnly(int isolation) throws Exception {
        String key = TestDatabase.uniqueKey("race-" + isolation);
        long low = 100;
        long high = 200;
        int highWrites = 20;
        try (Connection c = TestDatabase.connect()) {
            try (PreparedStatement s = c.prepareStatement("INSERT INTO fence_seq (key, n) VALUES (?, 0)")) {
                s.setString(1, key);
                s.executeUpdate();
            }
        }
        CountDownLatch lowHasWritten = new CountDownLatch(5);
        AtomicInteger retries = new AtomicInteger();
        ExecutorService pool = Executors.newFixedThreadPool(2);
        try {
            Future<StaleTokenException> lowWriter = pool.submit(() -> {
                Instant deadline = Instant.now().plus(Duration.ofSeconds(60));
                try (Connection c = TestDatabase.connect()) {
                    c.setAutoCommit(false);
                    c.setTransactionIsolation(isolation);
                    while (Instant.now().isBefore(deadline)) {
                        try {
                            fencedWrite(c, key, low, retries);
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
                assertTrue(lowHasWritten.await(30, TimeUnit.SECONDS), "the lower token's first writes");
                try (Connection c = TestDatabase.connect()) {
                    c.setAutoCommit(false);
                    c.setTransactionIsolation(isolation);
                    for (int i = 0; i < highWrites; i++) {
                        fencedWrite(c, key, high, retries);
                    }
                }
                return highWrites;
            });
            assertEquals(highWrites, highWriter.get(90, TimeUnit.SECONDS));
            StaleTokenException refused = lowWriter.get(90, TimeUnit.SECONDS);
            assertNotNull(refused, "the lower token was never refused");
            assertEquals(low, refused.token());
            assertEquals(OptionalLong.of(high), refused.highest());
        } finally {
            pool.shutdownNow();
        }
        try (Connection c = TestDatabase.connect()) {
            assertEquals(highWrites, rows(c, key, high));
            assertTrue(rows(c, key, low) >= 5, "the lower token's writes before the higher one");
            try (PreparedStatement s = c.prepareStatement(
                    "SELECT max(seq) FILTER (WHERE token = ?), min(seq) FILTER (WHERE token = ?) FROM fenced_rows WHERE key = ?")) {
                s.setLong(1, low);
                s.setLong(2, high);
                s.setString(3, key);
                try (ResultSet r = s.executeQuery()) {
                    r.next();
                    assertTrue(r.getLong(1) < r.getLong(2),
                            "a row of the lower token committed after the higher token's first: " + r.getLong(1) + " >= " + r.getLong(2));
                }
            }
            c.setAutoCommit(false);
            assertEquals(high, mark(c, key));
        }
        if (isolation == Connection.TRANSACTION_READ_COMMITTED) {
            assertEquals(0, retries.get(), "READ COMMITTED queues on the mark and never fails to serialize");
        }
    }

    /** One fenced transaction: fence, number the commit, write; retried on a serialization failure. */
    private static void fencedWrite(Connection c, String key, long token, AtomicInteger retries) throws SQLException {
        while (true) {
            try {
                JdbcFence.check(c, key, token);
                long seq;
                try (PreparedStatement s = c.prepareStatement("UPDATE fence_seq SET n = n + 1 WHERE key = ? RETURNING n")) {
                    s.setString(1, key);
                    try (ResultSet r = s.executeQuery()) {
                        r.next();
                        seq = r.getLong(1);
                    }
                }
                insert(c, key, token, seq);
                c.commit();
                return;
            } catch (StaleTokenException stale) {
                throw stale;
            } catch (SQLException e) {
                c.rollback();
                if (!"40001".equals(e.getSQLState()) && !"40P01".equals(e.getSQLState())) {
                    throw e;
                }
                retries.incrementAndGet();
            }
        }
    }

    private static void insert(Connection c, String key, long token, Long seq) throws SQLException {
        try (PreparedStatement s = c.prepareStatement("INSERT INTO fenced_rows (key, token, seq) VALUES (?, ?, ?)")) {
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

    static long rows(Connection c, String key, long token) throws SQLException {
        try (PreparedStatement s = c.prepareStatement("SELECT count(*) FROM fenced_rows WHERE key = ? AND token = ?")) {
            s.setString(1, key);
            s.setLong(2, token);
            try (ResultSet r = s.executeQuery()) {
                r.next();
                return r.getLong(1);
            }
        }
    }

    /** The key's mark, -1 for none. */
    static long mark(Connection c, String key) throws SQLException {
        try (PreparedStatement s = c.prepareStatement("SELECT token FROM palisade.marks WHERE key = ?")) {
            s.setString(1, key);
            try (ResultSet r = s.executeQuery()) {
                return r.next() ? r.getLong(1) : -1;
            } finally {
                if (!c.getAutoCommit()) {
                    c.commit();
                }
            }
        }
    }
}
