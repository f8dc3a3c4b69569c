package dev.palisade.jdbc;

import java.sql.SQLNonTransientException;
import java.util.OptionalLong;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

/**
 * palisade.fence refused a stale token (SQLSTATE {@code PF001}): a holder with a higher
 * token has written under the key since this token was granted. The transaction is
 * aborted; roll it back and stop. Non-transient: retrying with the same token fails
 * again. The driver's exception is the cause.
 */
public class StaleTokenException extends SQLNonTransientException {
    private static final long serialVersionUID = 1L;

    // palisade.fence's message: "... is lower than the highest admitted token 34".
    private static final Pattern HIGHEST = Pattern.compile("highest admitted token (\\d+)");

    private final String key;
    private final long token;
    private final OptionalLong highest;

    public StaleTokenException(String key, long token, OptionalLong highest, Throwable cause) {
        super(message(key, token, highest), JdbcFence.STALE_TOKEN_SQLSTATE, cause);
        this.key = key;
        this.token = token;
        this.highest = highest;
    }

    /** The fence key, e.g. {@code payments/billing}. */
    public String key() {
        return key;
    }

    /** The refused token. */
    public long token() {
        return token;
    }

    /** The key's highest admitted token, as the database reported it (empty if it could not be read). */
    public OptionalLong highest() {
        return highest;
    }

    static OptionalLong highestIn(String message) {
        if (message == null) {
            return OptionalLong.empty();
        }
        Matcher m = HIGHEST.matcher(message);
        try {
            return m.find() ? OptionalLong.of(Long.parseLong(m.group(1))) : OptionalLong.empty();
        } catch (NumberFormatException e) {
            return OptionalLong.empty();
        }
    }

    private static String message(String key, long token, OptionalLong highest) {
        return "write rejected: stale fencing token " + token + " for key \"" + key + "\" is lower than the highest "
                + "admitted token" + (highest.isPresent() ? " " + highest.getAsLong() : "")
                + "; the transaction is aborted: roll it back and stop writing";
    }
}
