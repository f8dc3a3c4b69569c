"""The HTTP/1.1 response parser and request builder (no agent needed)."""

import json

import pytest

from palisade._http import ProtocolError, ResponseParser, build_request


def parse(raw: bytes, method: str = "GET", eof: bool = True):
    p = ResponseParser(request_method=method)
    body = p.feed(raw)
    if eof and not p.done:
        body += p.feed(b"")
    return p, body


def parse_in_pieces(raw: bytes, size: int):
    p = ResponseParser()
    body = b""
    for i in range(0, len(raw), size):
        body += p.feed(raw[i : i + size])
    if not p.done:
        body += p.feed(b"")
    return p, body


CHUNKED = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    b"5\r\nhello\r\n"
    b"7;ext=1\r\n, world\r\n"
    b"1A\r\n" + b"x" * 26 + b"\r\n"
    b"0\r\nX-Trailer: yes\r\n\r\n"
)


def test_content_length_body():
    p, body = parse(b"HTTP/1.1 201 Created\r\ncontent-length: 9\r\nContent-Type: application/json\r\n\r\n{\"a\": 1}\n")
    assert p.head.status == 201 and p.head.reason == "Created"
    assert p.head.headers["content-type"] == "application/json"
    assert body == b'{"a": 1}\n' and p.done


def test_content_length_ignores_bytes_after_the_body():
    p, body = parse(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokEXTRA", eof=False)
    assert p.done and body == b"ok"


def test_chunked_body_with_extension_and_trailer():
    p, body = parse(CHUNKED, eof=False)
    assert p.done
    assert body == b"hello, world" + b"x" * 26


@pytest.mark.parametrize("size", [1, 2, 3, 5, 7, 64])
def test_chunked_body_in_any_pieces(size):
    p, body = parse_in_pieces(CHUNKED, size)
    assert p.done and body == b"hello, world" + b"x" * 26


def test_chunked_body_is_returned_as_it_arrives():
    p = ResponseParser()
    assert p.feed(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nab") == b"ab"
    assert p.head is not None and not p.done
    assert p.feed(b"cd\r\n") == b"cd"
    assert p.feed(b"0\r\n\r\n") == b"" and p.done


def test_body_until_close():
    p = ResponseParser()
    assert p.feed(b"HTTP/1.1 200 OK\r\n\r\nsome") == b"some"
    assert not p.done
    assert p.feed(b" more") == b" more"
    assert p.feed(b"") == b"" and p.done


@pytest.mark.parametrize("status", [204, 304])
def test_no_body_statuses(status):
    p, body = parse(f"HTTP/1.1 {status} X\r\n\r\n".encode(), eof=False)
    assert p.done and body == b""


def test_zero_length_body_is_done_at_once():
    p, body = parse(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", eof=False)
    assert p.done and body == b""


def test_interim_response_is_skipped():
    p, body = parse(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nx", eof=False)
    assert p.head.status == 200 and body == b"x"


def test_repeated_headers_combine():
    p, _ = parse(b"HTTP/1.1 200 OK\r\nVary: a\r\nVARY: b\r\nContent-Length: 0\r\n\r\n")
    assert p.head.headers["vary"] == "a, b"


@pytest.mark.parametrize(
    "raw, what",
    [
        (b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nabc", "bytes before the body's end"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nabc", "inside a chunked body"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "bad chunk size"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabXX", "not followed by CRLF"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n", "unsupported transfer-encoding"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n", "bad content-length"),
        (b"SSH-2.0-OpenSSH\r\n\r\n", "bad status line"),
        (b"HTTP/1.1 abc OK\r\n\r\n", "bad status line"),
        (b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n", "bad header line"),
        (b"HTTP/1.1 200 OK\r\nContent-", "before the response head was complete"),
        (b"", "before the response head was complete"),
    ],
)
def test_malformed_responses(raw, what):
    with pytest.raises(ProtocolError, match=what):
        parse(raw)


def test_request_with_json_body():
    raw = build_request("POST", "/v1/sessions/s1/leases", {"name": "billing", "waitMs": 0})
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    assert lines[0] == "POST /v1/sessions/s1/leases HTTP/1.1"
    assert "Content-Type: application/json" in lines
    assert f"Content-Length: {len(body)}" in lines
    assert "Connection: close" in lines
    assert json.loads(body) == {"name": "billing", "waitMs": 0}


def test_post_without_body_says_length_zero_and_get_says_nothing():
    post = build_request("POST", "/v1/sessions/s1/keepalive").decode()
    assert "Content-Length: 0\r\n" in post and "Content-Type" not in post
    get = build_request("GET", "/v1/sessions/s1/events", accept="text/event-stream").decode()
    assert "Content-Length" not in get and "Accept: text/event-stream\r\n" in get
    assert get.endswith("\r\n\r\n")


def test_bytes_are_sent_as_they_are():
    request = build_request("PUT", "/x", b"\x00\xff{")
    head, _, body = request.partition(b"\r\n\r\n")
    assert body == b"\x00\xff{"
    assert b"Content-Type: application/octet-stream" in head and b"Content-Length: 3" in head
