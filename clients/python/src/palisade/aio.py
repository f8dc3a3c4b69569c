"""The asyncio client: the same Session and Grant as ``palisade``, on asyncio streams.

    from palisade import aio

    async with aio.acquire("billing") as grant:
        await write(grant.token)

Background work (keepalive, event stream) runs as tasks on the running loop; no
threads.
"""

from __future__ import annotations

import asyncio
import logging
import time
from types import TracebackType
from typing import Any, Dict, Generator, Optional, Tuple, Type

from . import _api
from ._api import Address, Endpoint, GrantInfo
from ._http import ProtocolError, ResponseParser, build_request
from ._sse import SseParser
from .errors import AgentError, AgentUnreachable, LeaseLost, error_from_response

__all__ = ["Session", "Grant", "acquire", "default_session", "close_default_session"]

log = logging.getLogger("palisade")
READ_SIZE = 64 * 1024
SHORT_TIMEOUT = _api.ANSWER_MARGIN_S


async def _connect(address: Address) -> Tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    if address.path is not None:
        return await asyncio.open_unix_connection(address.path)
    return await asyncio.open_connection(address.host, address.port)


async def _close(writer: asyncio.StreamWriter) -> None:
    writer.close()
    try:
        await writer.wait_closed()
    except (OSError, asyncio.CancelledError):
        pass


async def _request(
    address: Address, endpoint: Endpoint, target: str, body: Optional[Any] = None, *, timeout: float
) -> Tuple[int, bytes]:
    async def exchange() -> Tuple[int, bytes]:
        reader, writer = await _connect(address)
        try:
            writer.write(build_request(endpoint.method, target, body))
            await writer.drain()
            parser = ResponseParser(request_method=endpoint.method)
            out = bytearray()
            while not parser.done:
                out += parser.feed(await reader.read(READ_SIZE))
            assert parser.head is not None
            return parser.head.status, bytes(out)
        finally:
            await _close(writer)

    try:
        return await asyncio.wait_for(exchange(), timeout)
    except asyncio.TimeoutError:
        raise AgentUnreachable(f"{endpoint.method} {target} at {address}: no answer in {timeout:g} s") from None
    except (OSError, ProtocolError) as e:
        raise AgentUnreachable(f"{endpoint.method} {target} at {address}: {e or type(e).__name__}") from e


class Grant:
    """A Lease this process holds, with its fencing token: see ``palisade.Grant``.

    ``await grant.lost()`` waits until it ends. As an async context manager it
    releases on exit, also on an exception or cancellation.
    """

    def __init__(self, session: "Session", info: GrantInfo) -> None:
        assert info.token is not None
        self._session = session
        self.name: str = info.name
        self.namespace: str = info.namespace
        self.token: int = info.token
        self.claim: Optional[str] = info.claim
        self.holder_identity: Optional[str] = info.holder_identity
        self.duration_seconds: Optional[int] = info.duration_seconds
        self._ended = asyncio.Event()
        self._state = "held"
        self._releasing = False
        self.lost_reason: Optional[str] = None
        self.lost_message: Optional[str] = None

    def __repr__(self) -> str:
        return f"<palisade.aio.Grant {self.namespace}/{self.name} token={self.token} {self._state}>"

    @property
    def key(self) -> Tuple[str, str]:
        return (self.namespace, self.name)

    @property
    def is_lost(self) -> bool:
        return self._state == "lost"

    @property
    def released(self) -> bool:
        return self._state == "released"

    @property
    def held(self) -> bool:
        return self._state == "held"

    async def lost(self) -> Optional[str]:
        """Wait until the grant ends: the reason it was lost, or None if released."""
        await self._ended.wait()
        return self.lost_reason

    async def check(self) -> float:
        """Seconds the grant is valid for at most (see ``palisade.Grant.check``);
        raises LeaseLost when it is lost or released."""
        self._raise_if_ended()
        sent = time.monotonic()
        status, body = await self._session._call(_api.GET_GRANT, namespace=self.namespace, name=self.name)
        if status != 200:
            raise self._session._error(status, body)
        info = _api.grant_from_answer(status, body)
        self._apply(info)
        self._raise_if_ended()
        return max(0.0, sent + info.valid_for_ms / 1000 - time.monotonic())

    async def release(self) -> None:
        """Release the Lease; does nothing when it is already lost or released."""
        if self._state != "held" or self._releasing:
            return
        self._releasing = True
        try:
            status, body = await self._session._call(_api.RELEASE, namespace=self.namespace, name=self.name)
            if status == 200:
                self._end("released")
            elif status == 409:
                self._end("lost", *await self._why_lost(error_from_response(status, body)))
            elif status == 404:
                self._end("lost", _api.SESSION_ENDED, error_from_response(status, body).message)
            else:
                raise error_from_response(status, body)
        finally:
            self._releasing = False

    async def _why_lost(self, err: AgentError) -> Tuple[str, str]:
        try:
            status, body = await self._session._call(_api.GET_GRANT, namespace=self.namespace, name=self.name)
            info = _api.grant_from_answer(status, body) if status == 200 else None
        except AgentError:
            info = None
        if info is not None and info.state == "lost" and info.lost_reason:
            return info.lost_reason, info.lost_message or err.message
        return "Lost", err.message

    async def __aenter__(self) -> "Grant":
        return self

    async def __aexit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        try:
            await self.release()
        except AgentError:
            if exc is None:
                raise
            log.warning("releasing %s/%s after an error", self.namespace, self.name, exc_info=True)

    def _apply(self, info: GrantInfo) -> None:
        verdict = _api.judge(self.token, info)
        if verdict.state is None:
            return
        if self._releasing and info.state == "released":
            self._end("released")
        else:
            self._end("lost", verdict.reason, verdict.message)

    def _end(self, state: str, reason: Optional[str] = None, message: Optional[str] = None) -> None:
        if self._state != "held":
            return
        self._state = state
        if state == "lost":
            self.lost_reason = reason or "Lost"
            self.lost_message = message
            log.warning(
                "lease %s/%s (token %d) lost: %s%s",
                self.namespace, self.name, self.token, self.lost_reason,
                f": {message}" if message else "",
            )
        self._session._forget(self)
        self._ended.set()

    def _raise_if_ended(self) -> None:
        if self._state == "lost":
            raise LeaseLost(self.lost_reason or "Lost", self.lost_message or "")
        if self._state == "released":
            raise LeaseLost(_api.RELEASED, "the grant was released")


class Session:
    """One application's session with the agent, on the running event loop: see
    ``palisade.Session``. ``async with aio.Session() as s`` (or ``await
    Session().open()``) opens it; ``await s.close()`` ends it."""

    def __init__(
        self,
        *,
        socket_path: Optional[str] = None,
        url: Optional[str] = None,
        keepalive_ms: Optional[int] = None,
        name: Optional[str] = None,
    ) -> None:
        self.address = _api.resolve_address(socket_path, url)
        self._body = _api.session_body(keepalive_ms, name)
        self.id = ""
        self.keepalive_ms = 0
        self._grants: Dict[Tuple[str, str], Grant] = {}
        self._reports: Dict[Tuple[str, str], GrantInfo] = {}
        self._stopped = False
        self._stop: Optional[asyncio.Event] = None
        self._writer: Optional[asyncio.StreamWriter] = None
        self._tasks: Tuple["asyncio.Task[None]", ...] = ()
        self.loop: Optional[asyncio.AbstractEventLoop] = None
        self.end_reason: Optional[str] = None
        self.end_message: Optional[str] = None

    def __repr__(self) -> str:
        state = "open" if self.id and not self._stopped else f"ended ({self.end_reason})" if self.id else "new"
        return f"<palisade.aio.Session {self.id or '-'} at {self.address} {state}>"

    @property
    def ended(self) -> bool:
        return self._stopped

    async def open(self) -> "Session":
        if self.id:
            raise RuntimeError("the session is open already")
        self.loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        sent = time.monotonic()
        status, raw = await _request(
            self.address, _api.CREATE_SESSION, _api.CREATE_SESSION.target(), self._body, timeout=SHORT_TIMEOUT
        )
        if status != 201:
            raise error_from_response(status, raw)
        self.id, self.keepalive_ms = _api.session_from_answer(status, raw)
        try:
            reader, parser, first = await asyncio.wait_for(self._open_stream(), SHORT_TIMEOUT)
        except asyncio.TimeoutError:
            await self._delete_session()
            raise AgentUnreachable(f"the event stream at {self.address} did not answer") from None
        except BaseException:
            await self._delete_session()
            raise
        self._tasks = (
            asyncio.ensure_future(self._read_events(reader, parser, first)),
            asyncio.ensure_future(self._keep_alive(sent)),
        )
        return self

    async def __aenter__(self) -> "Session":
        return await self.open()

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    async def acquire(
        self,
        name: str,
        *,
        namespace: Optional[str] = None,
        duration_seconds: Optional[int] = None,
        holder_identity: Optional[str] = None,
        timeout: Optional[float] = None,
    ) -> Grant:
        """See ``palisade.Session.acquire``; cancelling it leaves the queue."""
        timeout = _api.check_timeout(timeout)
        deadline = None if timeout is None else time.monotonic() + timeout
        body = _api.acquire_body(name, namespace, duration_seconds, holder_identity, _api.wait_ms_for(timeout))
        self._raise_if_ended()
        answered = False
        info: Optional[GrantInfo] = None
        try:
            status, raw = await self._call(_api.ACQUIRE, body, wait_ms=body["waitMs"])
            answered = True
            if status not in (200, 202):
                raise self._error(status, raw)  # refused: no claim was made
            info = _api.grant_from_answer(status, raw)
            while info.state == "waiting":
                self._raise_if_ended()
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise TimeoutError(f"lease {info.namespace}/{info.name} not granted within {timeout:g} s")
                wait_ms = _api.wait_ms_for(remaining)
                status, raw = await self._call(
                    _api.GET_GRANT, query={"waitMs": wait_ms}, wait_ms=wait_ms,
                    namespace=info.namespace, name=info.name,
                )
                if status != 200:
                    raise self._error(status, raw)
                info = _api.grant_from_answer(status, raw)
            if info.state == "held" and info.token is not None:
                return self._register(info)
        except BaseException:
            # Leave the queue (timeout, cancellation, an error), even when cancelled again.
            if info is not None or not answered:
                await asyncio.shield(self._abandon(name, namespace, info))
            raise
        if info.state == "lost":
            raise LeaseLost(info.lost_reason or "Lost", info.lost_message or "")
        raise AgentError(status, "unexpected_response", None, f"acquire answered state {info.state!r}")

    async def close(self) -> None:
        """End the session: the agent releases every Lease it holds or waits for."""
        if not self.id or self._stopped:
            return
        self._finish(None, None, "released")
        await self._delete_session()
        await self._stop_background()

    # -- internals ------------------------------------------------------------------

    async def _call(
        self,
        endpoint: Endpoint,
        body: Optional[Any] = None,
        *,
        query: Optional[Dict[str, Any]] = None,
        wait_ms: int = 0,
        timeout: Optional[float] = None,
        **params: str,
    ) -> Tuple[int, bytes]:
        target = endpoint.target(query, session=self.id, **params)
        if timeout is None:
            timeout = wait_ms / 1000 + _api.ANSWER_MARGIN_S
        return await _request(self.address, endpoint, target, body, timeout=timeout)

    def _error(self, status: int, raw: bytes) -> Exception:
        err = error_from_response(status, raw)
        if err.code == "unknown_session":
            self._end(_api.SESSION_ENDED, err.message)
            return LeaseLost(_api.SESSION_ENDED, err.message)
        return err

    def _raise_if_ended(self) -> None:
        if not self.id:
            raise RuntimeError("the session is not open: use `async with aio.Session()` or `await session.open()`")
        if self._stopped:
            raise LeaseLost(self.end_reason or _api.SESSION_ENDED, self.end_message or "the session was closed")

    def _register(self, info: GrantInfo) -> Grant:
        grant = Grant(self, info)
        if self._stopped:
            grant._end("lost", self.end_reason or _api.SESSION_ENDED, self.end_message)
            return grant
        self._grants[grant.key] = grant
        report = self._reports.get(grant.key)
        if report is not None:
            grant._apply(report)
        return grant

    def _forget(self, grant: Grant) -> None:
        if self._grants.get(grant.key) is grant:
            del self._grants[grant.key]

    async def _abandon(self, name: str, namespace: Optional[str], info: Optional[GrantInfo]) -> None:
        """Release the claim an unfinished acquire made; without its answer, whichever
        claims of that name the session has that no Grant holds."""
        if self._stopped:
            return
        try:
            if info is not None:
                keys = [info.key]
            else:
                status, raw = await self._call(_api.GET_SESSION)
                if status != 200:
                    raise self._error(status, raw)
                keys = _api.unanswered_claims(status, raw, name, namespace, list(self._grants))
            for ns, n in keys:
                await self._call(_api.RELEASE, namespace=ns, name=n)
        except (AgentError, LeaseLost) as e:
            log.warning("leaving the queue of %s: %s", name, e)

    def _report(self, info: GrantInfo) -> None:
        self._reports[info.key] = info
        grant = self._grants.get(info.key)
        if grant is not None:
            grant._apply(info)

    def _end(self, reason: str, message: Optional[str]) -> None:
        if self._finish(reason, message, "lost"):
            # Closing the stream makes the agent end the session too, if it has not.
            self._close_stream()

    def _finish(self, reason: Optional[str], message: Optional[str], state: str) -> bool:
        if self._stopped:
            return False
        self._stopped = True
        self.end_reason, self.end_message = reason, message
        assert self._stop is not None
        self._stop.set()
        if reason:
            log.warning("palisade session %s ended: %s%s", self.id, reason, f": {message}" if message else "")
        for grant in list(self._grants.values()):
            grant._end(state, reason, message)
        return True

    def _close_stream(self) -> None:
        if self._writer is not None:
            self._writer.close()

    async def _stop_background(self) -> None:
        self._close_stream()
        current = asyncio.current_task()
        for task in self._tasks:
            if task is not current:
                task.cancel()
        for task in self._tasks:
            if task is not current:
                try:
                    await task
                except asyncio.CancelledError:
                    pass

    async def _delete_session(self) -> None:
        try:
            await self._call(_api.END_SESSION, timeout=SHORT_TIMEOUT)
        except AgentError as e:
            log.warning("ending session %s: %s", self.id, e)

    async def _open_stream(self) -> Tuple[asyncio.StreamReader, ResponseParser, bytes]:
        target = _api.EVENTS.target(session=self.id)
        try:
            reader, writer = await _connect(self.address)
        except OSError as e:
            raise AgentUnreachable(f"cannot connect to the agent at {self.address}: {e}") from e
        try:
            writer.write(build_request("GET", target, accept="text/event-stream"))
            await writer.drain()
            parser = ResponseParser()
            first = bytearray()
            while parser.head is None:
                first += parser.feed(await reader.read(READ_SIZE))
            if parser.head.status != 200:
                while not parser.done:
                    first += parser.feed(await reader.read(READ_SIZE))
                raise error_from_response(parser.head.status, bytes(first))
        except (OSError, ProtocolError) as e:
            await _close(writer)
            raise AgentUnreachable(f"GET {target} at {self.address}: {e or type(e).__name__}") from e
        except BaseException:
            await _close(writer)
            raise
        self._writer = writer
        return reader, parser, bytes(first)

    async def _read_events(self, reader: asyncio.StreamReader, parser: ResponseParser, first: bytes) -> None:
        sse = SseParser()
        why = "the agent closed the event stream"
        chunk = first
        try:
            while True:
                for event in sse.feed(chunk):
                    for info in _api.grants_of_event(event.event, event.data):
                        self._report(info)
                if parser.done or self._stopped:
                    break
                chunk = parser.feed(await reader.read(READ_SIZE))
        except (OSError, ProtocolError) as e:
            why = f"the event stream broke: {e}"
        except ValueError as e:
            why = f"the event stream sent an event this client cannot read: {e}"
        except asyncio.CancelledError:
            why = "the event stream's task was cancelled"
            self._end(_api.SESSION_ENDED, why)
            raise
        self._end(_api.SESSION_ENDED, why)

    async def _keep_alive(self, last_ok: float) -> None:
        assert self._stop is not None
        period = self.keepalive_ms / 3000
        lifetime = self.keepalive_ms / 1000
        next_send = last_ok + period
        while True:
            deadline = last_ok + lifetime
            try:
                await asyncio.wait_for(self._stop.wait(), max(0.0, min(next_send, deadline) - time.monotonic()))
                return
            except asyncio.TimeoutError:
                pass
            sent = time.monotonic()
            if sent >= deadline:
                self._end(_api.KEEPALIVE_MISSED, f"no keepalive succeeded for {self.keepalive_ms} ms")
                return
            try:
                status, raw = await self._call(_api.KEEPALIVE, timeout=deadline - sent)
            except AgentUnreachable as e:
                status, raw = 0, str(e).encode()
            if status == 204:
                last_ok = sent
                next_send = sent + period
                continue
            if status == 404:
                self._end(_api.SESSION_ENDED, error_from_response(status, raw).message)
                return
            if self._stopped:
                return
            log.warning("keepalive of session %s failed: %s", self.id, raw.decode(errors="replace")[:200])
            next_send = time.monotonic() + period / 4


class _Acquiring:
    """What ``aio.acquire`` returns: ``await`` it for the Grant, or ``async with`` it
    to release the Lease on exit."""

    def __init__(self, session: Optional[Session], name: str, options: Dict[str, Any]) -> None:
        self._session = session
        self._name = name
        self._options = options
        self._grant: Optional[Grant] = None

    async def _acquire(self) -> Grant:
        session = self._session or await default_session()
        return await session.acquire(self._name, **self._options)

    def __await__(self) -> Generator[Any, None, Grant]:
        return self._acquire().__await__()

    async def __aenter__(self) -> Grant:
        self._grant = await self._acquire()
        return self._grant

    async def __aexit__(self, *exc: Any) -> None:
        if self._grant is not None:
            await self._grant.__aexit__(*exc)


def acquire(
    name: str,
    *,
    namespace: Optional[str] = None,
    duration_seconds: Optional[int] = None,
    holder_identity: Optional[str] = None,
    timeout: Optional[float] = None,
    session: Optional[Session] = None,
) -> _Acquiring:
    """Acquire ``name`` through ``session`` (default: the loop's default session):
    ``grant = await aio.acquire(...)`` or ``async with aio.acquire(...) as grant``."""
    options = dict(
        namespace=namespace, duration_seconds=duration_seconds, holder_identity=holder_identity, timeout=timeout
    )
    return _Acquiring(session, name, options)


_default: Optional[Session] = None
_default_lock: Optional[Tuple[asyncio.AbstractEventLoop, asyncio.Lock]] = None


async def default_session() -> Session:
    """The default session of the running loop, opened on first use (and again after
    it ended). Each loop gets its own: a session's tasks belong to one loop."""
    global _default, _default_lock
    loop = asyncio.get_running_loop()
    if _default_lock is None or _default_lock[0] is not loop:
        _default_lock = (loop, asyncio.Lock())
    async with _default_lock[1]:
        if _default is None or _default.ended or _default.loop is not loop:
            _default = await Session().open()
        return _default


async def close_default_session() -> None:
    """End the running loop's default session, releasing its Leases."""
    global _default
    session, _default = _default, None
    if session is not None and session.loop is asyncio.get_running_loop():
        await session.close()
