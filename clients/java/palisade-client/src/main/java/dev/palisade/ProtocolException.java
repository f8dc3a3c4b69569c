package dev.palisade;

/** The bytes on a connection are not an HTTP/1.1 response (or not an event stream). */
final class ProtocolException extends Exception {
    private static final long serialVersionUID = 1L;

    ProtocolException(String message) {
        super(message);
    }
}
