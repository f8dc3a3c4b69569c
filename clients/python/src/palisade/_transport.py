"""Blocking HTTP/1.1 to the agent over a socket: one connection per request."""

from __future__ import annotations

import socket
import time
from typing import Any, Iterator, Optional, Tuple

from ._api import Address, Endpoint
from ._http import ProtocolError, ResponseParser, build_request
from .errors import AgentUnreachable

READ_SIZE = 64 * 1024


def connect(address: Address, timeout: Optional[float]) -> socket.socket:
    try:
        if address.path is not None:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.settimeout(timeout)
                sock.connect(address.path)
            except BaseException:
                sock.close()
                raise
            return sock
        return socket.create_connection((address.host, address.port), timeout=timeout)
    except OSError as e:
        raise AgentUnreachable(f"cannot connect to the agent at {address}: {e}") from e


def request(
    address: Address,
    endpoint: Endpoint,
    target: str,
    body: Optional[Any] = None,
    *,
    timeout: float,
) -> Tuple[int, bytes]:
    """Send one request and read its whole answer within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    sock = connect(address, timeout)
    try:
        sock.sendall(build_request(endpoint.method, target, body))
        parser = ResponseParser(request_method=endpoint.method)
        out = bytearray()
        while not parser.done:
            left = deadline - time.monotonic()
            if left <= 0:
                raise socket.timeout("timed out")
            sock.settimeout(left)
            out += parser.feed(sock.recv(READ_SIZE))
        assert parser.head is not None
        return parser.head.status, bytes(out)
    except (OSError, ProtocolError) as e:
        raise AgentUnreachable(f"{endpoint.method} {target} at {address}: {e or type(e).__name__}") from e
    finally:
        sock.close()


class Stream:
    """A response read as it comes (the event stream): ``open`` sends the request and
    reads the head; ``chunks`` yields the body; ``close`` ends it from any thread."""

    def __init__(self, address: Address, endpoint: Endpoint, target: str, timeout: float) -> None:
        self._sock = connect(address, timeout)
        self._parser = ResponseParser(request_method=endpoint.method)
        self._first = b""
        self._closed = False
        try:
            self._sock.sendall(build_request(endpoint.method, target, accept="text/event-stream"))
            deadline = time.monotonic() + timeout
            while self._parser.head is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise socket.timeout("timed out")
                self._sock.settimeout(left)
                self._first += self._parser.feed(self._sock.recv(READ_SIZE))
            self.status = self._parser.head.status
        except (OSError, ProtocolError) as e:
            self._sock.close()
            raise AgentUnreachable(f"GET {target} at {address}: {e or type(e).__name__}") from e
        except BaseException:
            self._sock.close()
            raise

    def read_all(self, timeout: float) -> bytes:
        """The rest of a short answer (an error's body)."""
        out = bytearray(self._first)
        deadline = time.monotonic() + timeout
        try:
            while not self._parser.done:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._sock.settimeout(left)
                out += self._parser.feed(self._sock.recv(READ_SIZE))
        except (OSError, ProtocolError):
            pass
        return bytes(out)

    def chunks(self) -> Iterator[bytes]:
        """The body as it arrives; ends when the body or the connection does. Raises
        OSError or ProtocolError when the connection breaks."""
        if self._first:
            yield self._first
        self._sock.settimeout(None)
        while not self._parser.done:
            data = self._sock.recv(READ_SIZE)
            if self._closed:
                return
            chunk = self._parser.feed(data)
            if chunk:
                yield chunk

    def abandon(self) -> None:
        """Drop this process's descriptor only (in a forked child): a shutdown would
        end the parent's stream too."""
        self._closed = True
        self._sock.close()

    def close(self) -> None:
        self._closed = True
        try:
            # shutdown wakes a recv blocked in another thread; close alone does not.
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()
