package dev.palisade;

/** The base of the exceptions of the palisade client (unchecked). */
public class PalisadeException extends RuntimeException {
    private static final long serialVersionUID = 1L;

    /** An exception with {@code message}. */
    public PalisadeException(String message) {
        super(message);
    }

    /** An exception with {@code message} caused by {@code cause}. */
    public PalisadeException(String message, Throwable cause) {
        super(message, cause);
    }
}
