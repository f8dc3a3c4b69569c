package dev.palisade;

import java.io.ByteArrayOutputStream;
import java.nio.charset.StandardCharsets;
import java.util.LinkedHashMap;
import java.util.Locale;
import java.util.Map;

/**
 * An HTTP/1.1 response decoded from the bytes of its connection, without I/O. Feed it
 * what is read; it returns the body bytes each piece completes. Content-Length, chunked
 * and read-until-close bodies are understood; 1xx interim responses are skipped. The
 * client sends one request per connection ({@code Connection: close}): no pooling.
 */
final class HttpResponseParser {
    /** A response head larger than this is not the agent talking. */
    static final int MAX_HEAD = 64 * 1024;

    private enum Framing { LENGTH, CHUNKED, UNTIL_CLOSE, NONE }

    private enum Chunk { SIZE, DATA, DATA_END, TRAILER }

    private final String method;
    private byte[] buf = new byte[0];
    private int len;
    private boolean eof;
    private int status = -1;
    private String reason = "";
    private final Map<String, String> headers = new LinkedHashMap<>();
    private Framing framing;
    private long remaining;
    private Chunk chunk = Chunk.SIZE;
    private boolean done;

    HttpResponseParser(String requestMethod) {
        this.method = requestMethod;
    }

    /** Whether the head is complete. */
    boolean hasHead() {
        return status >= 0;
    }

    /** The status (once the head is complete). */
    int status() {
        return status;
    }

    /** The reason phrase. */
    String reason() {
        return reason;
    }

    /** A header's value (name in any case), or null; repeated fields are joined with ", ". */
    String header(String name) {
        return headers.get(name.toLowerCase(Locale.ROOT));
    }

    /** Whether the whole body was read. */
    boolean isDone() {
        return done;
    }

    /** Feeds {@code n} bytes of {@code data}; returns the body bytes they complete (possibly none). */
    byte[] feed(byte[] data, int off, int n) throws ProtocolException {
        if (done) {
            return new byte[0];
        }
        append(data, off, n);
        return step();
    }

    /** Feeds all of {@code data}. */
    byte[] feed(byte[] data) throws ProtocolException {
        return feed(data, 0, data.length);
    }

    /** The peer closed the connection; returns the body bytes that completes. */
    byte[] feedEof() throws ProtocolException {
        if (done) {
            return new byte[0];
        }
        eof = true;
        return step();
    }

    private byte[] step() throws ProtocolException {
        if (!hasHead() && !parseHead()) {
            if (eof) {
                throw new ProtocolException("connection closed before the response head was complete");
            }
            return new byte[0];
        }
        ByteArrayOutputStream out = new ByteArrayOutputStream();
        switch (framing) {
            case NONE -> done = true;
            case LENGTH -> {
                int take = (int) Math.min(remaining, len);
                out.write(buf, 0, take);
                consume(take);
                remaining -= take;
                if (remaining == 0) {
                    done = true;
                } else if (eof) {
                    throw new ProtocolException("connection closed " + remaining + " bytes before the body's end");
                }
            }
            case UNTIL_CLOSE -> {
                out.write(buf, 0, len);
                consume(len);
                done = eof;
            }
            case CHUNKED -> {
                decodeChunks(out);
                if (!done && eof) {
                    throw new ProtocolException("connection closed inside a chunked body");
                }
            }
        }
        return out.toByteArray();
    }

    private boolean parseHead() throws ProtocolException {
        while (true) {
            int end = indexOf(CRLFCRLF, 0);
            if (end < 0) {
                if (len > MAX_HEAD) {
                    throw new ProtocolException("response head too large");
                }
                return false;
            }
            String raw = new String(buf, 0, end, StandardCharsets.ISO_8859_1);
            consume(end + 4);
            headers.clear();
            int code = parseHeadText(raw);
            if (code >= 100 && code < 200) {
                continue; // interim (100 Continue): the real response follows
            }
            status = code;
            setFraming();
            return true;
        }
    }

    private int parseHeadText(String raw) throws ProtocolException {
        String[] lines = raw.split("\r\n", -1);
        String[] parts = lines[0].split(" ", 3);
        if (parts.length < 2 || !parts[0].startsWith("HTTP/1.") || !isDigits(parts[1]) || parts[1].length() != 3) {
            throw new ProtocolException("bad status line '" + lines[0] + "'");
        }
        reason = parts.length > 2 ? parts[2] : "";
        for (int i = 1; i < lines.length; i++) {
            String line = lines[i];
            int colon = line.indexOf(':');
            if (colon <= 0 || !line.substring(0, colon).strip().equals(line.substring(0, colon))) {
                throw new ProtocolException("bad header line '" + line + "'");
            }
            String key = line.substring(0, colon).toLowerCase(Locale.ROOT);
            String value = line.substring(colon + 1).strip();
            // Repeated fields combine with a comma (RFC 9110, 5.3).
            headers.merge(key, value, (a, b) -> a + ", " + b);
        }
        return Integer.parseInt(parts[1]);
    }

    private void setFraming() throws ProtocolException {
        if (method.equals("HEAD") || status == 204 || status == 304) {
            framing = Framing.NONE;
            return;
        }
        String encoding = headers.get("transfer-encoding");
        if (encoding != null && !encoding.isEmpty()) {
            String[] codings = encoding.split(",");
            if (!codings[codings.length - 1].strip().equalsIgnoreCase("chunked")) {
                throw new ProtocolException("unsupported transfer-encoding '" + encoding + "'");
            }
            framing = Framing.CHUNKED;
            return;
        }
        String length = headers.get("content-length");
        if (length != null) {
            if (!isDigits(length) || length.length() > 18) {
                throw new ProtocolException("bad content-length '" + length + "'");
            }
            remaining = Long.parseLong(length);
            framing = remaining == 0 ? Framing.NONE : Framing.LENGTH;
            return;
        }
        framing = Framing.UNTIL_CLOSE;
    }

    private void decodeChunks(ByteArrayOutputStream out) throws ProtocolException {
        while (len > 0) {
            switch (chunk) {
                case SIZE -> {
                    int end = indexOf(CRLF, 0);
                    if (end < 0) {
                        if (len > 1024) {
                            throw new ProtocolException("chunk size line too long");
                        }
                        return;
                    }
                    String line = new String(buf, 0, end, StandardCharsets.ISO_8859_1);
                    consume(end + 2);
                    int semi = line.indexOf(';');
                    String sizeText = (semi >= 0 ? line.substring(0, semi) : line).strip();
                    long size;
                    try {
                        if (sizeText.isEmpty() || sizeText.length() > 15 || sizeText.startsWith("-") || sizeText.startsWith("+")) {
                            throw new NumberFormatException();
                        }
                        size = Long.parseLong(sizeText, 16);
                    } catch (NumberFormatException e) {
                        throw new ProtocolException("bad chunk size '" + sizeText + "'");
                    }
                    if (size == 0) {
                        chunk = Chunk.TRAILER;
                    } else {
                        remaining = size;
                        chunk = Chunk.DATA;
                    }
                }
                case DATA -> {
                    int take = (int) Math.min(remaining, len);
                    out.write(buf, 0, take);
                    consume(take);
                    remaining -= take;
                    if (remaining == 0) {
                        chunk = Chunk.DATA_END;
                    }
                }
                case DATA_END -> {
                    if (len < 2) {
                        return;
                    }
                    if (buf[0] != '\r' || buf[1] != '\n') {
                        throw new ProtocolException("chunk data not followed by CRLF");
                    }
                    consume(2);
                    chunk = Chunk.SIZE;
                }
                case TRAILER -> { // trailer fields, up to the empty line
                    int end = indexOf(CRLF, 0);
                    if (end < 0) {
                        return;
                    }
                    consume(end + 2);
                    if (end == 0) {
                        done = true;
                        return;
                    }
                }
            }
        }
    }

    private static final byte[] CRLF = {'\r', '\n'};
    private static final byte[] CRLFCRLF = {'\r', '\n', '\r', '\n'};

    private int indexOf(byte[] needle, int from) {
        outer:
        for (int i = from; i + needle.length <= len; i++) {
            for (int j = 0; j < needle.length; j++) {
                if (buf[i + j] != needle[j]) {
                    continue outer;
                }
            }
            return i;
        }
        return -1;
    }

    private void append(byte[] data, int off, int n) {
        if (len + n > buf.length) {
            byte[] bigger = new byte[Math.max(len + n, buf.length * 2)];
            System.arraycopy(buf, 0, bigger, 0, len);
            buf = bigger;
        }
        System.arraycopy(data, off, buf, len, n);
        len += n;
    }

    private void consume(int n) {
        System.arraycopy(buf, n, buf, 0, len - n);
        len -= n;
    }

    private static boolean isDigits(String s) {
        if (s.isEmpty()) {
            return false;
        }
        for (int i = 0; i < s.length(); i++) {
            if (s.charAt(i) < '0' || s.charAt(i) > '9') {
                return false;
            }
        }
        return true;
    }
}
