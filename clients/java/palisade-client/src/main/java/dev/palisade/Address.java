package dev.palisade;

import java.net.URI;
import java.nio.file.Path;

/** Where the agent is: its Unix socket, or its loopback TCP port. */
record Address(Path path, String host, int port) {
    static final String DEFAULT_SOCKET = "/run/palisade/agent.sock";
    static final String SOCKET_ENV = "PALISADE_AGENT_SOCKET";
    static final String URL_ENV = "PALISADE_AGENT_URL";

    static Address ofSocket(Path path) {
        return new Address(path, null, 0);
    }

    /** {@code http://HOST:PORT}: the agent serves plain HTTP on loopback only. */
    static Address ofUrl(URI url) {
        if (url == null || !"http".equals(url.getScheme()) || url.getHost() == null
                || url.getUserInfo() != null || url.getQuery() != null || url.getFragment() != null
                || !(url.getRawPath() == null || url.getRawPath().isEmpty() || url.getRawPath().equals("/"))) {
            throw new IllegalArgumentException("url must be http://HOST:PORT without a path, not " + url);
        }
        return new Address(null, url.getHost(), url.getPort() < 0 ? 80 : url.getPort());
    }

    /** The options' socket or URL, else $PALISADE_AGENT_SOCKET, else $PALISADE_AGENT_URL, else the default socket. */
    static Address resolve(SessionOptions options) {
        if (options.socket().isPresent()) {
            return ofSocket(options.socket().get());
        }
        if (options.url().isPresent()) {
            return ofUrl(options.url().get());
        }
        String socket = System.getenv(SOCKET_ENV);
        if (socket != null && !socket.isEmpty()) {
            return ofSocket(Path.of(socket));
        }
        String url = System.getenv(URL_ENV);
        if (url != null && !url.isEmpty()) {
            try {
                return ofUrl(URI.create(url));
            } catch (IllegalArgumentException e) {
                throw new IllegalArgumentException(URL_ENV + ": " + e.getMessage(), e);
            }
        }
        return ofSocket(Path.of(DEFAULT_SOCKET));
    }

    @Override
    public String toString() {
        return path != null ? "unix:" + path : "http://" + host + ":" + port;
    }
}
