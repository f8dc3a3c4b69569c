"""The Server-Sent Events parser (no agent needed)."""

import pytest

from palisade._sse import Event, SseParser

STREAM = (
    b"event: session\ndata: {\"id\":\"s1\",\"grants\":[]}\n\n"
    b": keepalive\n\n"
    b"event: grant\r\ndata: {\"a\":\r\ndata:  1}\r\n\r\n"
    b"data:no space\rid: 7\r\r"
    b": keepalive\n"
)
EXPECTED = [
    Event("session", '{"id":"s1","grants":[]}'),
    Event("grant", '{"a":\n 1}'),
    Event("message", "no space", "7"),
]


def test_events_comments_and_line_endings():
    p = SseParser()
    assert p.feed(STREAM) == EXPECTED
    assert p.comments == 2
    assert p.last_id == "7"


@pytest.mark.parametrize("size", [1, 2, 3, 4, 5, 8, 13])
def test_any_split_gives_the_same_events(size):
    p = SseParser()
    events = []
    for i in range(0, len(STREAM), size):
        events += p.feed(STREAM[i : i + size])
    assert events == EXPECTED


def test_crlf_split_between_chunks_is_one_line_end():
    p = SseParser()
    assert p.feed(b"data: a\r") == []
    assert p.feed(b"\n\r") == []  # CR LF ends the data line; this CR may be half a CRLF
    assert p.feed(b"\n") == [Event("message", "a")]


def test_event_without_data_is_not_dispatched():
    p = SseParser()
    assert p.feed(b"event: grant\n\n") == []
    # ... and its type does not leak into the next event
    assert p.feed(b"data: x\n\n") == [Event("message", "x")]


def test_incomplete_event_is_not_dispatched():
    p = SseParser()
    assert p.feed(b"event: grant\ndata: {}\n") == []


def test_only_one_leading_space_is_removed_and_bom_is_skipped():
    p = SseParser()
    assert p.feed(b"\xef\xbb\xbfdata:  two spaces\n\n") == [Event("message", " two spaces")]


def test_field_without_colon_and_unknown_fields():
    p = SseParser()
    assert p.feed(b"data\nretry: 10\nfoo: bar\n\n") == [Event("message", "")]


def test_utf8_split_inside_a_character():
    raw = "data: café\n\n".encode()
    cut = raw.index(b"\xa9")  # inside é
    p = SseParser()
    assert p.feed(raw[:cut]) == []
    assert p.feed(raw[cut:]) == [Event("message", "café")]
