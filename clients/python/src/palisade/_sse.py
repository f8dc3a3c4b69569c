"""Server-Sent Events (the WHATWG event-stream format), without I/O."""

from __future__ import annotations

from typing import List, Optional

__all__ = ["Event", "SseParser"]


class Event:
    """One dispatched event: its type (``message`` unless named) and data."""

    __slots__ = ("event", "data", "id")

    def __init__(self, event: str, data: str, id: Optional[str] = None) -> None:
        self.event = event
        self.data = data
        self.id = id

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Event) and (self.event, self.data, self.id) == (
            other.event,
            other.data,
            other.id,
        )

    def __repr__(self) -> str:
        return f"Event({self.event!r}, {self.data!r}, id={self.id!r})"


class SseParser:
    """Feed it body bytes in any pieces; it returns the events they complete.

    Lines end with CRLF, LF or CR; ``data`` lines join with LF; a line starting with
    ``:`` is a comment (counted in ``comments``, the agent's ``: keepalive``); an event
    is dispatched at an empty line, and only if it has data (as browsers do). An
    event left incomplete when the stream ends is dropped.
    """

    def __init__(self) -> None:
        self._pending = b""
        self._first = True
        self._event = ""
        self._data: List[str] = []
        self._id: Optional[str] = None
        self.last_id: Optional[str] = None
        self.comments = 0

    def feed(self, chunk: bytes) -> List[Event]:
        buf = self._pending + chunk
        events: List[Event] = []
        start = 0
        n = len(buf)
        while True:
            cr = buf.find(b"\r", start)
            lf = buf.find(b"\n", start)
            if cr < 0 and lf < 0:
                break
            if cr >= 0 and (lf < 0 or cr < lf):
                if cr + 1 == n:
                    break  # a CR at the end: the LF of a CRLF may be in the next chunk
                end, nxt = cr, cr + 2 if buf[cr + 1 : cr + 2] == b"\n" else cr + 1
            else:
                end, nxt = lf, lf + 1
            self._line(buf[start:end], events)
            start = nxt
        self._pending = buf[start:]
        return events

    def _line(self, raw: bytes, events: List[Event]) -> None:
        line = raw.decode("utf-8", errors="replace")
        if self._first:
            self._first = False
            if line.startswith("\ufeff"):
                line = line[1:]
        if not line:
            if self._data:
                events.append(Event(self._event or "message", "\n".join(self._data), self._id))
            self._event, self._data = "", []
            return
        if line.startswith(":"):
            self.comments += 1
            return
        field, sep, value = line.partition(":")
        if sep and value.startswith(" "):
            value = value[1:]
        if field == "event":
            self._event = value
        elif field == "data":
            self._data.append(value)
        elif field == "id" and "\0" not in value:
            self._id = self.last_id = value
        # "retry" and unknown fields: ignored (the client never reconnects a stream).
