package dev.palisade;

import static org.junit.jupiter.api.Assertions.assertEquals;

import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import org.junit.jupiter.api.Test;

class SseParserTest {
    private static List<SseParser.Event> inPieces(String stream, int size) {
        byte[] all = stream.getBytes(StandardCharsets.UTF_8);
        SseParser p = new SseParser();
        List<SseParser.Event> out = new ArrayList<>();
        for (int i = 0; i < all.length; i += size) {
            out.addAll(p.feed(all, i, Math.min(size, all.length - i)));
        }
        return out;
    }

    @Test
    void theAgentsEvents() {
        String stream = ": keepalive\n\nevent: session\ndata: {\"grants\":[]}\n\n: keepalive\n\n"
                + "event: grant\ndata: {\"name\":\"a\"}\nid: 7\n\n";
        List<SseParser.Event> expected = List.of(
                new SseParser.Event("session", "{\"grants\":[]}", null),
                new SseParser.Event("grant", "{\"name\":\"a\"}", "7"));
        for (int size = 1; size <= stream.length(); size++) {
            assertEquals(expected, inPieces(stream, size), "in pieces of " + size);
        }
    }

    @Test
    void lineEndingsAndMultilineData() {
        String stream = "data: one\r\ndata:two\rdata\r\n\r\nevent: x\ndata: é ü\n\n";
        List<SseParser.Event> expected = List.of(
                new SseParser.Event("message", "one\ntwo\n", null),
                new SseParser.Event("x", "é ü", null));
        for (int size = 1; size <= 8; size++) {
            assertEquals(expected, inPieces(stream, size), "in pieces of " + size);
        }
    }

    @Test
    void commentsAreCountedAndEventsWithoutDataDropped() {
        SseParser p = new SseParser();
        List<SseParser.Event> events = p.feed("\uFEFF: hello\nevent: empty\n\nretry: 5\nunknown: x\n: keepalive\n\n"
                .getBytes(StandardCharsets.UTF_8));
        assertEquals(List.of(), events);
        assertEquals(2, p.comments());
    }

    @Test
    void anUnfinishedEventIsNotDispatched() {
        SseParser p = new SseParser();
        assertEquals(List.of(), p.feed("event: grant\ndata: {}\n".getBytes(StandardCharsets.UTF_8)));
        assertEquals(List.of(new SseParser.Event("grant", "{}", null)), p.feed("\n".getBytes(StandardCharsets.UTF_8)));
    }

    @Test
    void sessionAndGrantEventsReportGrants() {
        List<Api.GrantInfo> all = Api.grantsOfEvent("session",
                "{\"id\":\"s\",\"grants\":[{\"name\":\"a\",\"namespace\":\"n\",\"state\":\"held\",\"token\":3,\"validForMs\":10}]}");
        assertEquals(1, all.size());
        assertEquals(3L, all.get(0).token());
        assertEquals("n/a", all.get(0).key());
        assertEquals("lost", Api.grantsOfEvent("grant",
                "{\"name\":\"a\",\"namespace\":\"n\",\"state\":\"lost\",\"lostReason\":\"Expired\"}").get(0).state());
        assertEquals(List.of(), Api.grantsOfEvent("other", "not json"));
    }
}
