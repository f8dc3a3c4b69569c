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
import math
import os
import time
import weakref
from types import TracebackType
from typing import Any, Dict, Generator, List, Optional, Tuple, Type

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

    ``held`` reads the clock, so it is right even after the loop was blocked.
    ``await grant.lost()`` waits until it ends (``is_lost`` and ``wait_lost()`` are
    ``palisade.Grant``'s ``lost`` and ``wait_lost()``). As an async context manager it
    releases on exit, also on an exception or cancellation.
    """

    def __init__(self, session: "Session", info: GrantInfo, sent: float) -> None:
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
        # Set by the first release: the agent stops renewing at once, whatever it answers.
        self._let_go = False
        self._deadline = sent + info.valid_for_ms / 1000
        self._deadline_sent = sent
        self._lost_reason: Optional[str] = None
        self._lost_message: Optional[str] = None

    def __repr__(self) -> str:
        return f"<palisade.aio.Grant {self.namespace}/{self.name} token={self.token} {self._state}>"

    @property
    def key(self) -> Tuple[str, str]:
        return (self.namespace, self.name)

    @property
    def is_lost(self) -> bool:
        return self._now() == "lost"

    @property
    def released(self) -> bool:
        return self._now() == "released"

    @property
    def held(self) -> bool:
        return self._now() == "held" and not self._let_go

    @property
    def lost_reason(self) -> Optional[str]:
        self._now()
        return self._lost_reason

    @property
    def lost_message(self) -> Optional[str]:
        self._now()
        return self._lost_message

    async def lost(self) -> Optional[str]:
        """Wait until the grant ends: the reason it was lost, or None if released."""
        await self.wait_lost()
        return self.lost_reason

    async def wait_lost(self, timeout: Optional[float] = None) -> bool:
        """Wait until the grant ends or ``timeout`` seconds pass; True if it was lost,
        False if it is still held (timeout) or was released."""
        until = None if timeout is None else time.monotonic() + timeout
        while self._now() == "held":
            now = time.monotonic()
            if until is not None and now >= until:
                break
            end = self._deadline if until is None else min(self._deadline, until)
            try:
                await asyncio.wait_for(self._ended.wait(), max(0.0, end - now))
            except asyncio.TimeoutError:
                pass
        return self.is_lost

    async def check(self) -> float:
        """Seconds the grant is valid for at most (see ``palisade.Grant.check``);
        raises LeaseLost when it is lost or released."""
        self._raise_if_ended()
        sent = time.monotonic()
        try:
            status, body = await self._session._call(
                _api.GET_GRANT, namespace=self.namespace, name=self.name,
                timeout=max(0.001, self._deadline - sent),
            )
        except AgentUnreachable:
            self._raise_if_ended()
            raise
        if status != 200:
            raise self._session._error(status, body)
        self._update(sent, _api.grant_from_answer(status, body))
        self._raise_if_ended()
        return max(0.0, self._deadline - time.monotonic())

    async def release(self) -> None:
        """Release the Lease; does nothing when it is already lost or released. Not
        held from the call on, even when the answer is an error (see
        ``palisade.Grant.release``)."""
        if self._now() != "held" or self._let_go:
            return
        self._let_go = True
        try:
            status, body = await self._session._call(_api.RELEASE, namespace=self.namespace, name=self.name)
            if status == 409:
                self._end("lost", *await self._why_lost(error_from_response(status, body)))
            elif status == 404:
                self._end("lost", _api.SESSION_ENDED, error_from_response(status, body).message)
            elif status != 200:
                raise error_from_response(status, body)
        finally:
            self._end("released")

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

    def _now(self) -> str:
        """The state on the clock now: held past the local deadline is lost."""
        if self._state == "held" and time.monotonic() >= self._deadline:
            let_go = self._let_go
            if self._end("lost", _api.LOCAL_DEADLINE, _api.LAPSED) and not let_go:
                self._session._release_later(self)
        return self._state

    def _update(self, sent: float, info: GrantInfo) -> None:
        """The answer to a request sent at ``sent`` names this grant: its state, and
        while held a later deadline (never after the last one passed)."""
        self._apply(info)
        if info.state != "held" or info.token != self.token:
            return
        if info.duration_seconds is not None:
            self.duration_seconds = info.duration_seconds
        if self._state == "held" and sent >= self._deadline_sent and time.monotonic() < self._deadline:
            self._deadline = sent + info.valid_for_ms / 1000
            self._deadline_sent = sent

    def _apply(self, info: GrantInfo) -> None:
        verdict = _api.judge(self.token, info)
        if verdict.state is None:
            return
        if self._let_go and info.state == "released":
            self._end("released")
        else:
            self._end("lost", verdict.reason, verdict.message)

    def _end(self, state: str, reason: Optional[str] = None, message: Optional[str] = None) -> bool:
        if self._state != "held":
            return False
        self._state = state
        if state == "lost":
            self._lost_reason = reason or "Lost"
            self._lost_message = message
            log.warning(
                "lease %s/%s (token %d) lost: %s%s",
                self.namespace, self.name, self.token, self._lost_reason,
                f": {message}" if message else "",
            )
        self._session._forget(self)
        self._ended.set()
        return True

    def _raise_if_ended(self) -> None:
        state = self._now()
        if state == "lost":
            raise LeaseLost(self._lost_reason or "Lost", self._lost_message or "")
        if state == "released" or self._let_go:
            raise LeaseLost(_api.RELEASED, "the grant was released")


class Session:
    """One application's session with the agent, on the running event loop: see
    ``palisade.Session``. ``async with aio.Session() as s`` (or ``await
    Session().open()``) opens it; ``await s.close()`` ends it. Its keepalive task
    refreshes the grants' deadlines and ends each at its deadline."""

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
        # Releases of grants lost by their deadline, under way.
        self._releases: Dict[Tuple[str, str], "asyncio.Task[None]"] = {}
        self._stopped = False
        self._wake: Optional[asyncio.Event] = None
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
        self._wake = asyncio.Event()
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
        _sessions.add(self)
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
        # A release of this Lease still under way would end the new grant.
        pending = [t for (ns, n), t in self._releases.items() if n == name and namespace in (None, ns)]
        if pending:
            await asyncio.wait(pending, timeout=SHORT_TIMEOUT)
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
            if info.state == "held":
                # A long poll may be answered long after it was sent: validForMs is
                # counted from the send instant of a GET, which is answered at once.
                sent = time.monotonic()
                status, raw = await self._call(_api.GET_GRANT, namespace=info.namespace, name=info.name)
                if status != 200:
                    raise self._error(status, raw)
                info = _api.grant_from_answer(status, raw)
            if info.state == "held" and info.token is not None:
                return self._register(info, sent)
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

    def _register(self, info: GrantInfo, sent: float) -> Grant:
        grant = Grant(self, info, sent)
        if self._stopped:
            grant._end("lost", self.end_reason or _api.SESSION_ENDED, self.end_message)
            return grant
        self._grants[grant.key] = grant
        report = self._reports.get(grant.key)
        if report is not None:
            grant._apply(report)
        assert self._wake is not None
        self._wake.set()  # its deadline and duration may call for an earlier refresh
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

    def _release_later(self, grant: Grant) -> None:
        """Release a grant lost by its local deadline, in the background: this process
        (its loop) may have been the slow one, and the agent would renew it for nobody."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # read outside the loop: nothing to run it on
        if self._stopped or loop is not self.loop:
            return
        task = loop.create_task(self._release_quietly(grant))
        self._releases[grant.key] = task

        def done(t: "asyncio.Task[None]") -> None:
            if self._releases.get(grant.key) is t:
                del self._releases[grant.key]

        task.add_done_callback(done)

    async def _release_quietly(self, grant: Grant) -> None:
        try:
            await self._call(_api.RELEASE, namespace=grant.namespace, name=grant.name, timeout=SHORT_TIMEOUT)
        except AgentError as e:
            log.info("releasing %s/%s after its deadline: %s", grant.namespace, grant.name, e)

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
        _sessions.discard(self)
        assert self._wake is not None
        self._wake.set()
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
        """GET the session (a keepalive, and new deadlines for the grants) often
        enough, and end each grant at its deadline (see ``palisade.Session``)."""
        assert self._wake is not None
        lifetime = self.keepalive_ms / 1000
        retry_at = 0.0
        while not self._stopped:
            now = time.monotonic()
            for grant in list(self._grants.values()):
                grant._now()  # lost if past its deadline
            if now >= last_ok + lifetime:
                self._end(_api.KEEPALIVE_MISSED, f"no keepalive succeeded for {self.keepalive_ms} ms")
                return
            grants = list(self._grants.values())
            durations = [g.duration_seconds for g in grants if g.duration_seconds]
            interval = _api.refresh_interval(self.keepalive_ms, durations)
            first_deadline = min([g._deadline for g in grants], default=math.inf)
            if first_deadline <= now:
                continue  # one more lapsed since the clock was read
            next_send = max(last_ok + interval, retry_at)
            if now < next_send:
                try:
                    wake = min(next_send, last_ok + lifetime, first_deadline)
                    await asyncio.wait_for(self._wake.wait(), wake - now)
                except asyncio.TimeoutError:
                    pass
                self._wake.clear()
                continue
            # An answer after a deadline would come too late for it.
            timeout = min(interval, last_ok + lifetime - now, first_deadline - now)
            try:
                status, raw = await self._call(_api.GET_SESSION, timeout=timeout)
                if status == 200:
                    self._refresh(now, _api.session_grants(status, raw))
                    last_ok, retry_at = now, 0.0
                    continue
            except AgentError as e:
                status, raw = 0, str(e).encode()
            if status == 404:
                self._end(_api.SESSION_ENDED, error_from_response(status, raw).message)
                return
            if self._stopped:
                return
            log.warning("keepalive of session %s failed: %s", self.id, raw.decode(errors="replace")[:200])
            retry_at = time.monotonic() + interval / 4

    def _refresh(self, sent: float, infos: List[GrantInfo]) -> None:
        for info in infos:
            grant = self._grants.get(info.key)
            if grant is not None:
                grant._update(sent, info)

    def _forked(self) -> None:
        """In a forked child: the session and its grants are the parent's. Its
        connections, and the loop's selector, are shared with the parent: no I/O."""
        sock = self._writer.get_extra_info("socket") if self._writer is not None else None
        if sock is not None and sock.fileno() >= 0:
            # The child's copy of the event stream would keep it open after the parent
            # dies. Closing the transport would unregister it from the shared selector:
            # point the descriptor at /dev/null instead.
            devnull = os.open(os.devnull, os.O_RDWR)
            os.dup2(devnull, sock.fileno())
            os.close(devnull)
        self._writer = None
        self._finish(_api.SESSION_ENDED, "a forked child does not hold its parent's grants", "lost")


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


# Every open session, so that a forked child can disown them.
_sessions: "weakref.WeakSet[Session]" = weakref.WeakSet()


def _after_fork_in_child() -> None:
    global _default, _default_lock
    _default, _default_lock = None, None
    for session in list(_sessions):
        try:
            session._forked()
        except (RuntimeError, OSError) as e:  # e.g. waiters on a closed loop
            log.warning("palisade session %s in a forked child: %s", session.id, e)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
