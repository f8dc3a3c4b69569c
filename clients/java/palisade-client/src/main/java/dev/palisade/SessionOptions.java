package dev.palisade;

import java.net.URI;
import java.nio.file.Path;
import java.time.Duration;
import java.util.Optional;

/**
 * Where the agent is and how the session behaves. The agent is at {@link #socket(Path)} or
 * {@link #url(URI)} (the last one given wins), by default $PALISADE_AGENT_SOCKET, else
 * $PALISADE_AGENT_URL, else /run/palisade/agent.sock. Immutable: each method returns a
 * changed copy.
 */
public final class SessionOptions {
    private static final SessionOptions DEFAULTS = new SessionOptions(null, null, null, null);

    private final Path socket;
    private final URI url;
    private final Duration keepalive;
    private final String name;

    private SessionOptions(Path socket, URI url, Duration keepalive, String name) {
        this.socket = socket;
        this.url = url;
        this.keepalive = keepalive;
        this.name = name;
    }

    /** The agent found from the environment, the agent's keepalive (5 s), no name. */
    public static SessionOptions defaults() {
        return DEFAULTS;
    }

    /** The agent's Unix socket. */
    public SessionOptions socket(Path unixSocket) {
        if (unixSocket == null) {
            throw new IllegalArgumentException("socket must be a path, not null");
        }
        return new SessionOptions(unixSocket, null, keepalive, name);
    }

    /** The agent's loopback HTTP port, {@code http://127.0.0.1:PORT} (no path). */
    public SessionOptions url(URI loopbackHttp) {
        Address.ofUrl(loopbackHttp); // checks it
        return new SessionOptions(null, loopbackHttp, keepalive, name);
    }

    /** How long the session lives without a keepalive, 1 s .. 60 s (whole milliseconds). */
    public SessionOptions keepalive(Duration d) {
        if (d == null || d.compareTo(Duration.ofSeconds(1)) < 0 || d.compareTo(Duration.ofSeconds(60)) > 0) {
            throw new IllegalArgumentException("keepalive must be within 1 s..60 s, not " + d);
        }
        return new SessionOptions(socket, url, d, name);
    }

    /** A label for the agent's logs and metrics, at most 63 characters. */
    public SessionOptions name(String label) {
        if (label == null || label.length() > 63) {
            throw new IllegalArgumentException("name must be a string of at most 63 characters, not "
                    + (label == null ? "null" : label.length() + " characters"));
        }
        return new SessionOptions(socket, url, keepalive, label);
    }

    /** The socket given, if any. */
    public Optional<Path> socket() {
        return Optional.ofNullable(socket);
    }

    /** The URL given, if any. */
    public Optional<URI> url() {
        return Optional.ofNullable(url);
    }

    /** The keepalive given, if any. */
    public Optional<Duration> keepalive() {
        return Optional.ofNullable(keepalive);
    }

    /** The name given, if any. */
    public Optional<String> name() {
        return Optional.ofNullable(name);
    }

    @Override
    public String toString() {
        return "SessionOptions[socket=" + socket + ", url=" + url + ", keepalive=" + keepalive + ", name=" + name + "]";
    }
}
