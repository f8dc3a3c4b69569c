package dev.palisade;

/** The grant is no longer held (lost, or released: {@link LostReason#RELEASED}); {@link #reason()} says why. */
public class LeaseLostException extends PalisadeException {
    private static final long serialVersionUID = 1L;

    private final LostReason reason;

    /** The grant ended for {@code reason}; {@code message} says more (may be empty). */
    public LeaseLostException(LostReason reason, String message) {
        super("lease lost: " + reason.wireName() + (message == null || message.isEmpty() ? "" : ": " + message));
        this.reason = reason;
    }

    /** Why the grant ended. */
    public LostReason reason() {
        return reason;
    }
}
