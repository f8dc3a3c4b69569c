package dev.palisade;

import java.io.ByteArrayOutputStream;
import java.io.Closeable;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.util.function.Consumer;

/** HTTP/1.1 to the agent: one connection per request ({@code Connection: close}). */
final class Transport {
    static final String USER_AGENT = "palisade-java";
    private static final int READ_SIZE = 64 * 1024;

    private Transport() {}

    /** A whole answer: its status and body. */
    record Response(int status, byte[] body) {
        String text() {
            return new String(body, StandardCharsets.UTF_8);
        }
    }

    /** The request's bytes; {@code json} (when not null) is sent as the body. */
    static byte[] buildRequest(String method, String target, String json, String accept) {
        StringBuilder head = new StringBuilder()
                .append(method).append(' ').append(target).append(" HTTP/1.1\r\n")
                .append("Host: localhost\r\n")
                .append("User-Agent: ").append(USER_AGENT).append("\r\n")
                .append("Accept: ").append(accept).append("\r\n")
                .append("Connection: close\r\n");
        byte[] payload = json == null ? new byte[0] : json.getBytes(StandardCharsets.UTF_8);
        if (json != null) {
            head.append("Content-Type: application/json\r\n");
        }
        if (json != null || method.equals("POST") || method.equals("PUT") || method.equals("PATCH")) {
            head.append("Content-Length: ").append(payload.length).append("\r\n");
        }
        head.append("\r\n");
        byte[] h = head.toString().getBytes(StandardCharsets.ISO_8859_1);
        byte[] out = new byte[h.length + payload.length];
        System.arraycopy(h, 0, out, 0, h.length);
        System.arraycopy(payload, 0, out, h.length, payload.length);
        return out;
    }

    /**
     * Sends one request and reads its whole answer within {@code timeoutNanos}. An
     * interruptible request throws InterruptedException when the thread is interrupted
     * meanwhile; another keeps going and restores the interrupt status after.
     */
    static Response request(Address address, String method, String target, String json, long timeoutNanos,
            boolean interruptible) throws InterruptedException {
        long deadline = deadlineIn(timeoutNanos);
        try (Connection conn = Connection.open(address, deadline, interruptible)) {
            conn.writeAll(buildRequest(method, target, json, "application/json"), deadline);
            HttpResponseParser parser = new HttpResponseParser(method);
            ByteArrayOutputStream out = new ByteArrayOutputStream();
            ByteBuffer buf = ByteBuffer.allocate(READ_SIZE);
            while (!parser.isDone()) {
                buf.clear();
                int n = conn.read(buf, deadline);
                out.writeBytes(n < 0 ? parser.feedEof() : parser.feed(buf.array(), 0, n));
            }
            return new Response(parser.status(), out.toByteArray());
        } catch (IOException | ProtocolException e) {
            throw new AgentUnreachableException(method + " " + target + " at " + address + ": " + describe(e), e);
        }
    }

    static long deadlineIn(long timeoutNanos) {
        long d = System.nanoTime() + Math.max(1, timeoutNanos);
        return d == 0 ? 1 : d; // 0 means no deadline to Connection
    }

    static String describe(Exception e) {
        return e.getMessage() != null ? e.getMessage() : e.getClass().getSimpleName();
    }

    /** A response read as it comes (the event stream); {@link #close()} ends it from any thread. */
    static final class Stream implements Closeable {
        private final Connection conn;
        private final HttpResponseParser parser;
        private final ByteArrayOutputStream first = new ByteArrayOutputStream();
        private volatile boolean closed;

        /** Sends the request and reads the response's head within {@code timeoutNanos}. */
        Stream(Address address, String target, long timeoutNanos) {
            long deadline = deadlineIn(timeoutNanos);
            try {
                conn = Connection.open(address, deadline, false);
            } catch (IOException e) {
                throw new AgentUnreachableException("GET " + target + " at " + address + ": " + describe(e), e);
            } catch (InterruptedException e) {
                throw new AssertionError("an uninterruptible connection was interrupted", e);
            }
            parser = new HttpResponseParser("GET");
            try {
                conn.writeAll(buildRequest("GET", target, null, "text/event-stream"), deadline);
                ByteBuffer buf = ByteBuffer.allocate(READ_SIZE);
                while (!parser.hasHead()) {
                    buf.clear();
                    int n = conn.read(buf, deadline);
                    first.writeBytes(n < 0 ? parser.feedEof() : parser.feed(buf.array(), 0, n));
                }
            } catch (IOException | ProtocolException e) {
                conn.close();
                throw new AgentUnreachableException("GET " + target + " at " + address + ": " + describe(e), e);
            } catch (InterruptedException | RuntimeException e) {
                conn.close();
                throw new AssertionError("reading the event stream's head", e);
            }
        }

        int status() {
            return parser.status();
        }

        /** The rest of a short answer (an error's body), read within {@code timeoutNanos}. */
        byte[] readAll(long timeoutNanos) {
            long deadline = deadlineIn(timeoutNanos);
            ByteArrayOutputStream out = new ByteArrayOutputStream();
            out.writeBytes(first.toByteArray());
            ByteBuffer buf = ByteBuffer.allocate(READ_SIZE);
            try {
                while (!parser.isDone()) {
                    buf.clear();
                    int n = conn.read(buf, deadline);
                    out.writeBytes(n < 0 ? parser.feedEof() : parser.feed(buf.array(), 0, n));
                }
            } catch (IOException | ProtocolException | InterruptedException e) {
                // what came is what there is
            }
            return out.toByteArray();
        }

        /**
         * Passes the body to {@code sink} as it arrives, until the body or the connection
         * ends (returns) or breaks (throws); returns at once after {@link #close()}.
         */
        void readBody(Consumer<byte[]> sink) throws IOException, ProtocolException, InterruptedException {
            if (first.size() > 0) {
                sink.accept(first.toByteArray());
            }
            ByteBuffer buf = ByteBuffer.allocate(READ_SIZE);
            while (!parser.isDone()) {
                buf.clear();
                int n;
                try {
                    n = conn.read(buf, 0);
                } catch (IOException e) {
                    if (closed) {
                        return;
                    }
                    throw e;
                }
                if (closed) {
                    return;
                }
                byte[] chunk = n < 0 ? parser.feedEof() : parser.feed(buf.array(), 0, n);
                if (chunk.length > 0) {
                    sink.accept(chunk);
                }
            }
        }

        @Override
        public void close() {
            closed = true;
            conn.close();
        }
    }
}
