"""The asyncio client: the same Session and Grant as ``palisade``, on asyncio streams.

    from palisade import aio

    async with aio.acquire("billing") as grant:
        await write(grant.token)

The behaviour is ``palisade._core``'s; this shell does its I/O on asyncio streams
and its background work (keepalive, event stream, releases of lapsed grants) as
tasks on the running loop; no threads. What reads state is a property, as in
``palisade``; what waits or asks the agent is awaited.
"""

from __future__ import annotations

import asyncio
import os
from types import TracebackType
from typing import Any, Dict, Generator, Optional, Tuple, Type

from . import _api, _core
from ._api import Address, Endpoint
from ._core import SHORT_TIMEOUT, Call, Flow, Join, Shield, T, Wait
from ._http import ProtocolError, ResponseParser, build_request
from ._sse import SseParser
from .errors import AgentUnreachable, error_from_response

__all__ = ["Session", "Grant", "acquire", "default_session", "close_default_session"]

READ_SIZE = 64 * 1024


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


class Grant(_core.GrantBase):
    """A Lease this process holds, with its fencing token: see ``palisade.Grant``.

    The same properties (``held``, ``is_lost``/``lost``, ``released``,
    ``lost_reason``, ...: they read the clock, so they are right even after the loop
    was blocked); the methods that wait or ask the agent are awaitables:
    ``await grant.wait_lost(timeout)``, ``await grant.check()``, ``await
    grant.release()``. As an async context manager it releases on exit, also on an
    exception or cancellation.
    """

    _kind = "palisade.aio"
    _session: "Session"

    async def wait_lost(self, timeout: Optional[float] = None) -> bool:
        """Wait until the grant ends or ``timeout`` seconds pass; True if it was lost,
        False if it is still held (timeout) or was released."""
        return await self._session._run(self._wait_lost_flow(timeout))

    async def check(self) -> float:
        """Seconds the grant is valid for at most (see ``palisade.Grant.check``);
        raises LeaseLost when it is lost or released."""
        return await self._session._run(self._check_flow())

    async def put_object(self, bucket: str, key: str, body: bytes) -> _api.ObjectWritten:
        """Write ``body`` at ``key`` in an S3 bucket through the object-store fence, by the
        agent, with this grant's own token: the client never handles the token, so it
        cannot send the wrong one. Raises StaleTokenError when a newer holder of the
        Lease wrote the object (nothing written: stop writing), LeaseLost when the
        grant has ended, AgentError otherwise (``grant_lost``, ``grant_not_held``,
        ``no_such_bucket``, ``object_store_error``, ``object_store_not_configured``:
        the agent needs AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY)."""
        return await self._session._run(self._put_object_flow(bucket, key, body))

    async def release(self) -> None:
        """Release the Lease; does nothing when it is already lost or released. Not
        held from the call on, even when the answer is an error (see
        ``palisade.Grant.release``)."""
        await self._session._run(self._release_flow())

    async def __aenter__(self) -> "Grant":
        return self

    async def __aexit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        await self._session._run(self._exit_flow(exc))


class Session(_core.SessionBase):
    """One application's session with the agent, on the running event loop: see
    ``palisade.Session``. ``async with aio.Session() as s`` (or ``await
    Session().open()``) opens it; ``await s.close()`` ends it. Its keepalive task
    refreshes the grants' deadlines and ends each at its deadline."""

    _kind = "palisade.aio"
    _Grant = Grant

    def __init__(
        self,
        *,
        socket_path: Optional[str] = None,
        url: Optional[str] = None,
        keepalive_ms: Optional[int] = None,
        name: Optional[str] = None,
    ) -> None:
        super().__init__(socket_path, url, keepalive_ms, name)
        self._writer: Optional[asyncio.StreamWriter] = None
        self._tasks: Tuple["asyncio.Task[None]", ...] = ()
        self.loop: Optional[asyncio.AbstractEventLoop] = None

    async def open(self) -> "Session":
        if self.id:
            raise RuntimeError("the session is open already")
        self.loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        sent = await self._run(self._create_flow())
        try:
            reader, parser, first = await asyncio.wait_for(self._open_stream(), SHORT_TIMEOUT)
        except asyncio.TimeoutError:
            await self._run(self._delete_flow())
            raise AgentUnreachable(f"the event stream at {self.address} did not answer") from None
        except BaseException:
            await self._run(self._delete_flow())
            raise
        self._tasks = (
            asyncio.ensure_future(self._read_events(reader, parser, first)),
            asyncio.ensure_future(self._run(self._keepalive_flow(sent))),
        )
        self._opened()
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
        slot: Optional[int] = None,
    ) -> Grant:
        """See ``palisade.Session.acquire``; cancelling it leaves the queue."""
        return await self._run(
            self._acquire_flow(name, namespace, duration_seconds, holder_identity, timeout, slot)
        )

    async def close(self) -> None:
        """End the session: the agent releases every Lease it holds or waits for."""
        if await self._run(self._close_flow()):
            await self._stop_background()

    # -- the shell: I/O and waiting ------------------------------------------------

    async def _run(self, flow: Flow[T]) -> T:
        """Drive ``flow`` to its end: perform each operation it yields, awaiting, and
        send it the result (or throw it the exception, a cancellation too)."""
        result: Any = None
        error: Optional[BaseException] = None
        try:
            while True:
                try:
                    op = flow.send(result) if error is None else flow.throw(error)
                except StopIteration as done:
                    return done.value  # type: ignore[no-any-return]
                result, error = None, None
                try:
                    result = await self._perform(op)
                except BaseException as e:
                    error = e
        finally:
            flow.close()

    async def _perform(self, op: Any) -> Any:
        if isinstance(op, Call):
            return await _request(self.address, op.endpoint, op.target, op.body, timeout=op.timeout)
        if isinstance(op, Wait):
            try:
                return await asyncio.wait_for(op.event.wait(), op.seconds)
            except asyncio.TimeoutError:
                return False
        if isinstance(op, Join):
            await asyncio.wait(op.handles, timeout=op.seconds)
            return None
        if isinstance(op, Shield):
            # Its own task: a second cancellation of the caller does not reach it.
            return await asyncio.shield(self._run(op.flow))
        raise TypeError(f"not an operation: {op!r}")

    def _event(self) -> asyncio.Event:
        return asyncio.Event()

    def _on_loop(self) -> bool:
        try:
            return asyncio.get_running_loop() is self.loop
        except RuntimeError:
            return False

    def _notify(self, event: asyncio.Event) -> None:
        loop = self.loop
        # asyncio.Event is not thread-safe: a property read in another thread may end
        # a grant.
        if loop is None or self._on_loop() or loop.is_closed():
            event.set()
        else:
            loop.call_soon_threadsafe(event.set)

    def _release_later(self, grant: _core.GrantBase) -> None:
        loop = self.loop
        if self._stopped or loop is None or loop.is_closed():
            return  # ending the session released it; or no loop to run it on
        if not self._on_loop():
            loop.call_soon_threadsafe(self._release_later, grant)
            return
        task = loop.create_task(self._run(self._lapsed_release_flow(grant)))
        self._track(grant.key, task)
        task.add_done_callback(lambda t: self._untrack(grant.key, t))

    def _close_stream(self) -> None:
        if self._writer is not None:
            self._writer.close()

    def _forked(self) -> None:
        self.loop = None  # the parent's: nothing is scheduled on it from the child
        super()._forked()

    def _drop_stream(self) -> None:
        # Its connections, and the loop's selector, are shared with the parent: no
        # I/O. The child's copy of the event stream would keep it open after the
        # parent dies; closing the transport would unregister it from the shared
        # selector: point the descriptor at /dev/null instead.
        sock = self._writer.get_extra_info("socket") if self._writer is not None else None
        if sock is not None and sock.fileno() >= 0:
            devnull = os.open(os.devnull, os.O_RDWR)
            os.dup2(devnull, sock.fileno())
            os.close(devnull)
        self._writer = None

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
        chunk = first
        try:
            while True:
                self._feed_events(sse, chunk)
                if parser.done or self._stopped:
                    break
                chunk = parser.feed(await reader.read(READ_SIZE))
        except (OSError, ProtocolError, ValueError) as e:
            self._events_ended(e)
            return
        except asyncio.CancelledError as e:
            self._events_ended(e)
            raise
        self._events_ended(None)


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
    slot: Optional[int] = None,
) -> _Acquiring:
    """Acquire ``name`` through ``session`` (default: the loop's default session):
    ``grant = await aio.acquire(...)`` or ``async with aio.acquire(...) as grant``."""
    options = dict(
        namespace=namespace, duration_seconds=duration_seconds, holder_identity=holder_identity, timeout=timeout,
        slot=slot,
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


def _after_fork_in_child() -> None:
    global _default, _default_lock
    _default, _default_lock = None, None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
