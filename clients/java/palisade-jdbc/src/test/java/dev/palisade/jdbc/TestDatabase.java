package dev.palisade.jdbc;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.SQLException;
import java.sql.Statement;
import java.util.UUID;

import static org.junit.jupiter.api.Assertions.fail;

/**
 * The tests' PostgreSQL: $PALISADE_TEST_PG_URL (a JDBC URL), in a database of their own
 * with the repository's sql/palisade-fence.sql installed, as tests/postgres does. The
 * server is shared with other runs: keys are unique to each test.
 */
final class TestDatabase {
    static final String DB = "palisade_java_jdbc_tests";
    /** A database where the fence is never installed. */
    static final String BARE_DB = "palisade_java_jdbc_bare";

    private static boolean installed;

    private TestDatabase() {}

    static String serverUrl() {
        String url = System.getenv("PALISADE_TEST_PG_URL");
        if (url == null || url.isEmpty()) {
            fail("PALISADE_TEST_PG_URL is not set: these tests need a real PostgreSQL "
                    + "(a JDBC URL, e.g. jdbc:postgresql://127.0.0.1:15432/postgres?user=postgres; make databases starts one)");
        }
        return url;
    }

    /** {@code url} with its database replaced by {@code db}. */
    static String withDatabase(String url, String db) {
        String prefix = "jdbc:postgresql://";
        if (!url.startsWith(prefix)) {
            fail("PALISADE_TEST_PG_URL is not a jdbc:postgresql:// URL: " + url);
        }
        int query = url.indexOf('?');
        String base = query < 0 ? url : url.substring(0, query);
        String params = query < 0 ? "" : url.substring(query);
        int slash = base.indexOf('/', prefix.length());
        String hostPort = slash < 0 ? base : base.substring(0, slash);
        return hostPort + "/" + db + params;
    }

    /** A connection to the tests' database, the fence installed (autocommit on). */
    static synchronized Connection connect() throws SQLException {
        if (!installed) {
            create(DB);
            try (Connection c = DriverManager.getConnection(withDatabase(serverUrl(), DB));
                 Statement s = c.createStatement()) {
                s.execute(fenceSql());
                // Under a lock of its own: two runs creating a table at once collide in the catalog.
                s.execute("BEGIN; SELECT pg_advisory_xact_lock(4243); "
                        + "CREATE TABLE IF NOT EXISTS fenced_rows (id bigserial PRIMARY KEY, key text NOT NULL, "
                        + "token bigint NOT NULL, seq bigint); "
                        + "CREATE TABLE IF NOT EXISTS fence_seq (key text PRIMARY KEY, n bigint NOT NULL); COMMIT");
            }
            installed = true;
        }
        return DriverManager.getConnection(withDatabase(serverUrl(), DB));
    }

    /** A connection to a database where palisade.fence was never installed. */
    static Connection connectBare() throws SQLException {
        create(BARE_DB);
        return DriverManager.getConnection(withDatabase(serverUrl(), BARE_DB));
    }

    static String uniqueKey(String what) {
        return "jdbc-tests/" + what + "-" + UUID.randomUUID();
    }

    /** Creates {@code db} unless it exists (another run may create it at the same moment). */
    private static void create(String db) throws SQLException {
        try (Connection c = DriverManager.getConnection(serverUrl()); Statement s = c.createStatement()) {
            s.execute("CREATE DATABASE " + db);
        } catch (SQLException e) {
            // 42P04 duplicate_database; 23505 when two runs create it at once.
            if (!"42P04".equals(e.getSQLState()) && !"23505".equals(e.getSQLState())) {
                throw e;
            }
        }
    }

    private static String fenceSql() {
        String path = System.getProperty("palisade.fence.sql");
        if (path == null) {
            fail("the system property palisade.fence.sql (the repository's sql/palisade-fence.sql) is not set: "
                    + "run the tests with Maven, whose surefire configuration sets it");
        }
        try {
            return Files.readString(Path.of(path));
        } catch (IOException e) {
            return fail("reading the fence SQL " + path + ": " + e);
        }
    }
}
