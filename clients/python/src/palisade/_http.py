"""HTTP/1.1 on a byte stream, without I/O: the sync and asyncio transports share it.

The agent speaks plain HTTP/1.1 on a Unix socket, which neither ``urllib`` nor
``asyncio`` can do on their own; one request per connection (``Connection: close``)
keeps this small: no pooling, no pipelining.
"""

from __future__ import annotations

import json
from typing import Dict, List, Optional, Tuple, Union

__all__ = ["ProtocolError", "Head", "ResponseParser", "build_request"]

# A response head larger than this is not the agent talking.
MAX_HEAD = 64 * 1024
USER_AGENT = "palisade-python"


class ProtocolError(Exception):
    """The bytes on the connection are not an HTTP/1.1 response."""


def build_request(
    method: str,
    target: str,
    body: Optional[object] = None,
    *,
    accept: str = "application/json",
) -> bytes:
    """The request's bytes; ``body`` (when not None) is sent as JSON, or as it is
    (``application/octet-stream``) when it is bytes: an object's contents."""
    lines = [
        f"{method} {target} HTTP/1.1",
        "Host: localhost",
        f"User-Agent: {USER_AGENT}",
        f"Accept: {accept}",
        "Connection: close",
    ]
    payload = b""
    if isinstance(body, (bytes, bytearray, memoryview)):
        payload = bytes(body)
        lines.append("Content-Type: application/octet-stream")
    elif body is not None:
        payload = json.dumps(body, separators=(",", ":")).encode()
        lines.append("Content-Type: application/json")
    if body is not None or method in ("POST", "PUT", "PATCH"):
        lines.append(f"Content-Length: {len(payload)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("ascii") + payload


class Head:
    """Status line and headers of a response (header names lower-cased)."""

    __slots__ = ("status", "reason", "headers")

    def __init__(self, status: int, reason: str, headers: Dict[str, str]) -> None:
        self.status = status
        self.reason = reason
        self.headers = headers

    def __repr__(self) -> str:
        return f"Head({self.status}, {self.reason!r})"


# Body framings.
_LENGTH, _CHUNKED, _UNTIL_CLOSE, _NONE = "length", "chunked", "close", "none"
# Chunked decoder states.
_SIZE, _DATA, _DATA_END, _TRAILER = "size", "data", "data-end", "trailer"


class ResponseParser:
    """Feed it the bytes read from the connection; it returns the decoded body.

    ``feed(data)`` returns the body bytes that ``data`` completed (possibly empty);
    ``feed(b"")`` means the peer closed the connection. ``head`` is set once the head
    is complete, ``done`` once the body is. Content-Length, chunked and
    read-until-close bodies are understood; 1xx interim responses are skipped.
    """

    def __init__(self, *, request_method: str = "GET") -> None:
        self._buf = bytearray()
        self._method = request_method
        self.head: Optional[Head] = None
        self.done = False
        self._eof = False
        self._framing = ""
        self._remaining = 0
        self._chunk_state = _SIZE

    def feed(self, data: Union[bytes, bytearray]) -> bytes:
        if self.done:
            return b""
        if not data:
            self._eof = True
        self._buf += data
        out = bytearray()
        if self.head is None and not self._parse_head():
            if self._eof:
                raise ProtocolError("connection closed before the response head was complete")
            return b""
        if self._framing == _NONE:
            self.done = True
        elif self._framing == _LENGTH:
            take = min(self._remaining, len(self._buf))
            out += self._buf[:take]
            del self._buf[:take]
            self._remaining -= take
            if self._remaining == 0:
                self.done = True
            elif self._eof:
                raise ProtocolError(f"connection closed {self._remaining} bytes before the body's end")
        elif self._framing == _UNTIL_CLOSE:
            out += self._buf
            self._buf.clear()
            self.done = self._eof
        else:
            self._decode_chunks(out)
            if not self.done and self._eof:
                raise ProtocolError("connection closed inside a chunked body")
        return bytes(out)

    def _parse_head(self) -> bool:
        while True:
            end = self._buf.find(b"\r\n\r\n")
            if end < 0:
                if len(self._buf) > MAX_HEAD:
                    raise ProtocolError("response head too large")
                return False
            raw = bytes(self._buf[:end]).decode("latin-1")
            del self._buf[: end + 4]
            head = _parse_head_text(raw)
            if 100 <= head.status < 200:
                continue  # interim (100 Continue): the real response follows
            self.head = head
            self._framing, self._remaining = _framing(head, self._method)
            return True

    def _decode_chunks(self, out: bytearray) -> None:
        buf = self._buf
        while buf:
            if self._chunk_state == _SIZE:
                end = buf.find(b"\r\n")
                if end < 0:
                    if len(buf) > 1024:
                        raise ProtocolError("chunk size line too long")
                    return
                size_text = bytes(buf[:end]).split(b";", 1)[0].strip()
                del buf[: end + 2]
                try:
                    size = int(size_text, 16)
                except ValueError:
                    raise ProtocolError(f"bad chunk size {size_text!r}") from None
                if size < 0:
                    raise ProtocolError(f"bad chunk size {size_text!r}")
                if size == 0:
                    self._chunk_state = _TRAILER
                else:
                    self._remaining = size
                    self._chunk_state = _DATA
            elif self._chunk_state == _DATA:
                take = min(self._remaining, len(buf))
                out += buf[:take]
                del buf[:take]
                self._remaining -= take
                if self._remaining == 0:
                    self._chunk_state = _DATA_END
            elif self._chunk_state == _DATA_END:
                if len(buf) < 2:
                    return
                if buf[:2] != b"\r\n":
                    raise ProtocolError("chunk data not followed by CRLF")
                del buf[:2]
                self._chunk_state = _SIZE
            else:  # trailer fields, up to the empty line
                end = buf.find(b"\r\n")
                if end < 0:
                    return
                del buf[: end + 2]
                if end == 0:
                    self.done = True
                    return


def _parse_head_text(raw: str) -> Head:
    lines = raw.split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
        raise ProtocolError(f"bad status line {lines[0]!r}")
    headers: Dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip():
            raise ProtocolError(f"bad header line {line!r}")
        key = name.lower()
        value = value.strip()
        # Repeated fields combine with a comma (RFC 9110, 5.3).
        headers[key] = f"{headers[key]}, {value}" if key in headers else value
    return Head(int(parts[1]), parts[2] if len(parts) > 2 else "", headers)


def _framing(head: Head, method: str) -> Tuple[str, int]:
    if method == "HEAD" or head.status in (204, 304):
        return _NONE, 0
    encoding = head.headers.get("transfer-encoding", "")
    if encoding:
        codings: List[str] = [c.strip().lower() for c in encoding.split(",")]
        if codings[-1] != "chunked":
            raise ProtocolError(f"unsupported transfer-encoding {encoding!r}")
        return _CHUNKED, 0
    length = head.headers.get("content-length")
    if length is not None:
        if not length.isdigit():
            raise ProtocolError(f"bad content-length {length!r}")
        n = int(length)
        return (_LENGTH, n) if n else (_NONE, 0)
    return _UNTIL_CLOSE, 0
