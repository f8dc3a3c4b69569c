package dev.palisade.jdbc;

import dev.palisade.Grant;

import java.sql.Connection;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.util.Objects;
import java.util.OptionalLong;
import java.util.Set;

/**
 * PostgreSQL's {@code palisade.fence(key, token)} in the caller's JDBC transaction: one
 * statement before (or after) the protected write, in the same transaction, so that a
 * stale token aborts the transaction and with it the write.
 *
 * <pre>{@code
 * try (Grant grant = Palisade.acquire("billing")) {
 *     connection.setAutoCommit(false);
 *     JdbcFence.check(connection, grant);          // key "<namespace>/billing"
 *     insertLedgerRows(connection);
 *     connection.commit();
 * } catch (StaleTokenException stale) {
 *     connection.rollback();                       // a newer holder has written: stop
 * }
 * }</pre>
 *
 * <p>The function must be installed once, by a role that may create the schema
 * ({@code psql -v ON_ERROR_STOP=1 -f sql/palisade-fence.sql} or
 * {@code palisade fence --store postgres://... --create}); this class never installs it.
 * PostgreSQL only: palisade has no fence for MySQL.
 */
public final class JdbcFence {
    /** The SQLSTATE palisade.fence raises for a stale token. */
    public static final String STALE_TOKEN_SQLSTATE = "PF001";

    // A missing schema, function or table: the fence was never installed here.
    private static final Set<String> NOT_INSTALLED = Set.of("3F000", "42883", "42P01");

    private static final String FENCE = "SELECT palisade.fence(?, ?)";

    private JdbcFence() {}

    /**
     * The fence key of a grant, {@code <namespace>/<lease>}: the key {@code palisade fence}
     * and the other clients use, so Leases of one name in two namespaces never share a mark.
     */
    public static String key(Grant grant) {
        Objects.requireNonNull(grant, "grant");
        return grant.namespace() + "/" + grant.name();
    }

    /**
     * Fences {@code grant}'s token under its key ({@link #key(Grant)}) in the connection's
     * current transaction.
     *
     * @return the key's previous mark, empty for the key's first token
     * @throws StaleTokenException the token is lower than the key's highest admitted:
     *     the transaction is aborted; roll it back and stop writing
     * @throws IllegalStateException the connection is in autocommit mode
     * @throws SQLException anything else the database raised (40001 under REPEATABLE READ
     *     and SERIALIZABLE: retry the whole transaction; 55P03 after lock_timeout)
     */
    public static OptionalLong check(Connection connection, Grant grant) throws SQLException {
        Objects.requireNonNull(grant, "grant");
        return check(connection, key(grant), grant.token());
    }

    /**
     * Fences {@code token} under {@code key} in the connection's current transaction.
     * The same token may be fenced again (a holder writes many times with one token).
     *
     * @return the key's previous mark, empty for the key's first token
     * @throws StaleTokenException the token is lower than the key's highest admitted
     * @throws IllegalStateException the connection is in autocommit mode, where the fence
     *     would be a transaction of its own and protect no write
     * @throws SQLException anything else the database raised; a missing install names
     *     how to install, with the database's SQLSTATE
     */
    public static OptionalLong check(Connection connection, String key, long token) throws SQLException {
        Objects.requireNonNull(connection, "connection");
        Objects.requireNonNull(key, "key");
        if (connection.getAutoCommit()) {
            throw new IllegalStateException("palisade.fence of key \"" + key + "\" on a connection in autocommit mode "
                    + "would commit on its own and protect no write: call setAutoCommit(false) and fence in the "
                    + "transaction of the write");
        }
        try (PreparedStatement statement = connection.prepareStatement(FENCE)) {
            statement.setString(1, key);
            statement.setLong(2, token);
            try (ResultSet result = statement.executeQuery()) {
                result.next();
                long previous = result.getLong(1);
                return result.wasNull() ? OptionalLong.empty() : OptionalLong.of(previous);
            }
        } catch (SQLException e) {
            throw classify(e, key, token);
        }
    }

    /** The database's error, as this class documents it. */
    static SQLException classify(SQLException e, String key, long token) {
        String state = e.getSQLState();
        if (STALE_TOKEN_SQLSTATE.equals(state)) {
            return new StaleTokenException(key, token, StaleTokenException.highestIn(e.getMessage()), e);
        }
        if (state != null && NOT_INSTALLED.contains(state)) {
            return new SQLException("palisade.fence(text, bigint) is not installed in this database ("
                    + e.getMessage() + "): install it once, as a role that may create the schema, with "
                    + "psql -v ON_ERROR_STOP=1 -f sql/palisade-fence.sql or palisade fence --store postgres://... --create",
                    state, e.getErrorCode(), e);
        }
        return e;
    }
}
