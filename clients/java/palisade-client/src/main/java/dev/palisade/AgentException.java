package dev.palisade;

import java.util.Optional;
import java.util.OptionalInt;

/**
 * The agent refused a request, or answered what this client cannot read. {@link #code()}
 * is the agent's stable error code ({@code invalid_field}, {@code already_acquired},
 * {@code unknown_session}, ...), or the client's own {@code agent_unreachable} and
 * {@code unexpected_response}; {@link #field()} the request field at fault when one is.
 */
public class AgentException extends PalisadeException {
    private static final long serialVersionUID = 1L;

    private final int status;
    private final String code;
    private final String field;
    private final String detail;

    /** An error answer: HTTP {@code status} (0 when there was no answer), {@code code}, {@code field} (or null), {@code message}. */
    public AgentException(int status, String code, String field, String message) {
        this(status, code, field, message, null);
    }

    /** As the four-argument constructor, with the {@code cause}. */
    public AgentException(int status, String code, String field, String message, Throwable cause) {
        super(describe(status, code, field, message), cause);
        this.status = status;
        this.code = code;
        this.field = field;
        this.detail = message;
    }

    private static String describe(int status, String code, String field, String message) {
        return "palisade agent: " + (status > 0 ? status + " " : "") + code
                + (field != null ? " (" + field + ")" : "") + ": " + message;
    }

    /** The HTTP status of the answer; empty when there was none. */
    public OptionalInt status() {
        return status > 0 ? OptionalInt.of(status) : OptionalInt.empty();
    }

    /** The stable error code. */
    public String code() {
        return code;
    }

    /** The request field or parameter at fault, when the agent named one. */
    public Optional<String> field() {
        return Optional.ofNullable(field);
    }

    /** The agent's message alone (the rule in words), without status and code. */
    public String detail() {
        return detail;
    }
}
