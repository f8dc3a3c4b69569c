package dev.palisade.jdbc;

import dev.palisade.Grant;

import java.sql.Connection;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.util.Objects;
import java.util.Set;

/**
 * PostgreSQL's {@code palisade.enqueue(key, token, payload)}, the fenced outbox, in the
 * caller's JDBC transaction: an intent to call an API that cannot check a fencing token
 * (a payment provider, a mailer), inserted in the transaction of the fenced write, and
 * delivered later by {@code palisade outbox relay} with the intent's id as its
 * {@code Idempotency-Key}.
 *
 * <pre>{@code
 * try (Grant grant = Palisade.acquire("billing")) {
 *     connection.setAutoCommit(false);
 *     insertCharge(connection, order);
 *     String intent = Outbox.enqueue(connection, grant, "{\"order\": 42, \"amount\": 1250}");
 *     connection.commit();                         // the write and its intent, or neither
 * } catch (StaleTokenException stale) {
 *     connection.rollback();                       // a newer holder has written: stop
 * }
 * }</pre>
 *
 * <p>{@code palisade.enqueue} runs {@code palisade.fence} first, so a stale holder's
 * intent is never inserted: its transaction aborts (SQLSTATE {@code PF001}), thrown here
 * as {@link StaleTokenException}, as {@link JdbcFence} does. Install
 * {@code sql/palisade-fence.sql}, then {@code sql/palisade-outbox.sql}, once, as a role
 * that may create the schema; this class never installs anything.
 */
public final class Outbox {
    // A missing schema or function: the fence or the outbox was never installed here.
    private static final Set<String> NOT_INSTALLED = Set.of("3F000", "42883");

    private static final String ENQUEUE = "SELECT palisade.enqueue(?, ?, ?::jsonb)";

    private Outbox() {}

    /**
     * Enqueues an intent under {@code grant}'s key ({@link JdbcFence#key(Grant)},
     * {@code <namespace>/<lease>}) and token in the connection's current transaction.
     *
     * @see #enqueue(Connection, String, long, String)
     */
    public static String enqueue(Connection connection, Grant grant, String jsonPayload) throws SQLException {
        Objects.requireNonNull(grant, "grant");
        return enqueue(connection, JdbcFence.key(grant), grant.token(), jsonPayload);
    }

    /**
     * Enqueues an intent under {@code key} with {@code token} in the connection's current
     * transaction: it commits with the transaction or not at all.
     *
     * @param jsonPayload what the relay POSTs, JSON text (checked by the database)
     * @return the intent's id (a uuid, as text): the {@code Idempotency-Key} the relay sends
     * @throws StaleTokenException the token is lower than the key's highest admitted: the
     *     transaction is aborted; roll it back and stop writing
     * @throws IllegalStateException the connection is in autocommit mode, where the intent
     *     would commit on its own, apart from the write it belongs to
     * @throws SQLException anything else the database raised (22P02 for a payload that is
     *     not JSON; 40001 under REPEATABLE READ and SERIALIZABLE: retry the whole
     *     transaction); a missing install names how to install, with the database's SQLSTATE
     */
    public static String enqueue(Connection connection, String key, long token, String jsonPayload)
            throws SQLException {
        Objects.requireNonNull(connection, "connection");
        Objects.requireNonNull(key, "key");
        Objects.requireNonNull(jsonPayload, "jsonPayload");
        if (connection.getAutoCommit()) {
            throw new IllegalStateException("palisade.enqueue of key \"" + key + "\" on a connection in autocommit "
                    + "mode would commit the intent on its own, apart from the write it belongs to: call "
                    + "setAutoCommit(false) and enqueue in the transaction of the write");
        }
        try (PreparedStatement statement = connection.prepareStatement(ENQUEUE)) {
            statement.setString(1, key);
            statement.setLong(2, token);
            statement.setString(3, jsonPayload);
            try (ResultSet result = statement.executeQuery()) {
                result.next();
                return result.getString(1);
            }
        } catch (SQLException e) {
            throw classify(e, key, token);
        }
    }

    private static SQLException classify(SQLException e, String key, long token) {
        String state = e.getSQLState();
        if (JdbcFence.STALE_TOKEN_SQLSTATE.equals(state)) {
            return new StaleTokenException(key, token, StaleTokenException.highestIn(e.getMessage()), e);
        }
        if (state != null && NOT_INSTALLED.contains(state)) {
            return new SQLException("palisade.enqueue(text, bigint, jsonb) is not installed in this database ("
                    + e.getMessage() + "): install it once, as a role that may create the schema, with "
                    + "psql -v ON_ERROR_STOP=1 -f sql/palisade-fence.sql -f sql/palisade-outbox.sql, or "
                    + "palisade fence --store postgres://... --create then palisade outbox install --store "
                    + "postgres://...", state, e.getErrorCode(), e);
        }
        return e;
    }
}
