package dev.palisade;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.ByteArrayOutputStream;
import java.nio.charset.StandardCharsets;
import org.junit.jupiter.api.Test;

class HttpResponseParserTest {
    private static byte[] b(String s) {
        return s.getBytes(StandardCharsets.ISO_8859_1);
    }

    /** Feeds {@code raw} one byte at a time, then the end of the stream: the body. */
    private static String byteByByte(HttpResponseParser p, String raw) throws ProtocolException {
        ByteArrayOutputStream out = new ByteArrayOutputStream();
        for (byte x : b(raw)) {
            out.writeBytes(p.feed(new byte[] {x}));
        }
        if (!p.isDone()) {
            out.writeBytes(p.feedEof());
        }
        return out.toString(StandardCharsets.UTF_8);
    }

    @Test
    void contentLength() throws Exception {
        HttpResponseParser p = new HttpResponseParser("GET");
        byte[] body = p.feed(b("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 7\r\n\r\n{\"a\":1}extra"));
        assertEquals(200, p.status());
        assertEquals("OK", p.reason());
        assertEquals("application/json", p.header("content-type"));
        assertArrayEquals(b("{\"a\":1}"), body);
        assertTrue(p.isDone());
    }

    @Test
    void contentLengthInPieces() throws Exception {
        HttpResponseParser p = new HttpResponseParser("GET");
        assertEquals("hello", byteByByte(p, "HTTP/1.1 201 Created\r\nContent-Length: 5\r\n\r\nhello"));
        assertEquals(201, p.status());
    }

    @Test
    void chunkedWithExtensionsAndTrailers() throws Exception {
        String raw = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                + "4;ext=1\r\nWiki\r\n5\r\npedia\r\nE\r\n in\r\n\r\nchunks.\r\n0\r\nX-Trailer: 1\r\n\r\n";
        HttpResponseParser whole = new HttpResponseParser("GET");
        assertEquals("Wikipedia in\r\n\r\nchunks.", new String(whole.feed(b(raw)), StandardCharsets.ISO_8859_1));
        assertTrue(whole.isDone());
        assertEquals("Wikipedia in\r\n\r\nchunks.", byteByByte(new HttpResponseParser("GET"), raw));
    }

    @Test
    void untilCloseAndNoBody() throws Exception {
        HttpResponseParser p = new HttpResponseParser("GET");
        assertEquals("all of it", byteByByte(p, "HTTP/1.1 200 OK\r\n\r\nall of it"));
        HttpResponseParser none = new HttpResponseParser("DELETE");
        assertEquals(0, none.feed(b("HTTP/1.1 204 No Content\r\n\r\n")).length);
        assertTrue(none.isDone());
        HttpResponseParser zero = new HttpResponseParser("GET");
        zero.feed(b("HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"));
        assertTrue(zero.isDone());
    }

    @Test
    void interimResponsesAreSkipped() throws Exception {
        HttpResponseParser p = new HttpResponseParser("POST");
        byte[] body = p.feed(b("HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 202 Accepted\r\nContent-Length: 2\r\n\r\n{}"));
        assertEquals(202, p.status());
        assertArrayEquals(b("{}"), body);
    }

    @Test
    void repeatedHeadersCombine() throws Exception {
        HttpResponseParser p = new HttpResponseParser("GET");
        p.feed(b("HTTP/1.1 200 OK\r\nVary: a\r\nVARY: b\r\nContent-Length: 0\r\n\r\n"));
        assertEquals("a, b", p.header("Vary"));
    }

    @Test
    void anIncompleteHeadWaits() throws Exception {
        HttpResponseParser p = new HttpResponseParser("GET");
        assertEquals(0, p.feed(b("HTTP/1.1 200 OK\r\nContent-Le")).length);
        assertFalse(p.hasHead());
    }

    @Test
    void malformedResponsesAreProtocolErrors() {
        String[] bad = {
            "HTTP/2 200 OK\r\n\r\n",
            "HTTP/1.1 abc OK\r\n\r\n",
            "garbage\r\n\r\n",
            "HTTP/1.1 200 OK\r\nno colon\r\n\r\n",
            "HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n",
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n",
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabXY",
        };
        for (String raw : bad) {
            assertThrows(ProtocolException.class, () -> new HttpResponseParser("GET").feed(b(raw)), raw);
        }
    }

    @Test
    void aConnectionClosedEarlyIsAProtocolError() throws Exception {
        HttpResponseParser head = new HttpResponseParser("GET");
        head.feed(b("HTTP/1.1 200 O"));
        assertThrows(ProtocolException.class, head::feedEof);
        HttpResponseParser body = new HttpResponseParser("GET");
        body.feed(b("HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc"));
        assertThrows(ProtocolException.class, body::feedEof);
        HttpResponseParser chunked = new HttpResponseParser("GET");
        chunked.feed(b("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab"));
        assertThrows(ProtocolException.class, chunked::feedEof);
    }

    @Test
    void anEndlessHeadIsRefused() {
        HttpResponseParser p = new HttpResponseParser("GET");
        assertThrows(ProtocolException.class,
                () -> p.feed(b("HTTP/1.1 200 OK\r\nX: " + "a".repeat(HttpResponseParser.MAX_HEAD + 10))));
    }

    @Test
    void requestsAreBuiltAsTheAgentExpects() {
        String post = new String(Transport.buildRequest("POST", "/v1/sessions", "{}", "application/json"),
                StandardCharsets.UTF_8);
        assertEquals("POST /v1/sessions HTTP/1.1\r\nHost: localhost\r\nUser-Agent: palisade-java\r\n"
                + "Accept: application/json\r\nConnection: close\r\nContent-Type: application/json\r\n"
                + "Content-Length: 2\r\n\r\n{}", post);
        String get = new String(Transport.buildRequest("GET", "/x", null, "text/event-stream"), StandardCharsets.UTF_8);
        assertFalse(get.contains("Content-Length"));
        assertTrue(get.endsWith("Accept: text/event-stream\r\nConnection: close\r\n\r\n"));
    }

    @Test
    void targetsArePercentEncoded() {
        assertEquals("/v1/sessions/s%201/leases/n%2Fs/a%C3%A9",
                Endpoint.GET_GRANT.target("s 1", "n/s", "a\u00e9"));
        assertThrows(IllegalArgumentException.class, () -> Endpoint.GET_GRANT.target("s"));
    }
}
