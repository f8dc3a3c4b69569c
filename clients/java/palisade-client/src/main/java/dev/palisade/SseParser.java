package dev.palisade;

import java.io.ByteArrayOutputStream;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;

/**
 * Server-Sent Events (the WHATWG event-stream format), without I/O: feed it body bytes
 * in any pieces, it returns the events they complete. Lines end with CRLF, LF or CR;
 * {@code data} lines join with LF; a line starting with ':' is a comment (the agent's
 * {@code : keepalive}); an event is dispatched at an empty line, only if it has data.
 */
final class SseParser {
    /** One dispatched event: its type ({@code message} unless named), data and id (or null). */
    record Event(String event, String data, String id) {}

    private byte[] pending = new byte[0];
    private boolean first = true;
    private String event = "";
    private final List<String> data = new ArrayList<>();
    private String id;
    private int comments;

    /** The comment lines seen so far. */
    int comments() {
        return comments;
    }

    /** Feeds {@code n} bytes of {@code chunk}; returns the events they complete. */
    List<Event> feed(byte[] chunk, int off, int n) {
        byte[] buf = new byte[pending.length + n];
        System.arraycopy(pending, 0, buf, 0, pending.length);
        System.arraycopy(chunk, off, buf, pending.length, n);
        List<Event> events = new ArrayList<>();
        int start = 0;
        int i = 0;
        while (i < buf.length) {
            byte b = buf[i];
            if (b == '\n') {
                line(buf, start, i, events);
                start = i + 1;
            } else if (b == '\r') {
                if (i + 1 == buf.length) {
                    break; // a CR at the end: the LF of a CRLF may be in the next chunk
                }
                line(buf, start, i, events);
                start = buf[i + 1] == '\n' ? i + 2 : i + 1;
                i = start - 1;
            }
            i++;
        }
        pending = java.util.Arrays.copyOfRange(buf, start, buf.length);
        return events;
    }

    /** Feeds all of {@code chunk}. */
    List<Event> feed(byte[] chunk) {
        return feed(chunk, 0, chunk.length);
    }

    private void line(byte[] buf, int from, int to, List<Event> events) {
        ByteArrayOutputStream raw = new ByteArrayOutputStream();
        raw.write(buf, from, to - from);
        String line = raw.toString(StandardCharsets.UTF_8);
        if (first) {
            first = false;
            if (line.startsWith("\uFEFF")) {
                line = line.substring(1);
            }
        }
        if (line.isEmpty()) {
            if (!data.isEmpty()) {
                events.add(new Event(event.isEmpty() ? "message" : event, String.join("\n", data), id));
            }
            event = "";
            data.clear();
            return;
        }
        if (line.startsWith(":")) {
            comments++;
            return;
        }
        int colon = line.indexOf(':');
        String field = colon >= 0 ? line.substring(0, colon) : line;
        String value = colon >= 0 ? line.substring(colon + 1) : "";
        if (value.startsWith(" ")) {
            value = value.substring(1);
        }
        switch (field) {
            case "event" -> event = value;
            case "data" -> data.add(value);
            case "id" -> {
                if (value.indexOf('\0') < 0) {
                    id = value;
                }
            }
            default -> { } // "retry" and unknown fields: the client never reconnects a stream
        }
    }
}
