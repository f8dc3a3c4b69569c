package dev.palisade;

/** No answer from the agent: no socket, connection refused or dropped, or no answer in time. */
public class AgentUnreachableException extends AgentException {
    private static final long serialVersionUID = 1L;

    /** Code {@code agent_unreachable}, no status. */
    public AgentUnreachableException(String message, Throwable cause) {
        super(0, "agent_unreachable", null, message, cause);
    }
}
