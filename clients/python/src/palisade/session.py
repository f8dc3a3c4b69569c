"""The blocking client: a Session with the agent, and the Grants it acquires.

The behaviour is ``palisade._core``'s; this shell does its I/O on blocking sockets
and its background work (the keepalive, the event stream, releases of lapsed
grants) on daemon threads.
"""

from __future__ import annotations

import threading
from types import TracebackType
from typing import Any, Optional, Type

from . import _api, _core, _transport
from ._core import Call, Flow, Join, Shield, T, Wait
from ._http import ProtocolError
from ._sse import SseParser
from .errors import error_from_response

__all__ = ["Session", "Grant"]


class Grant(_core.GrantBase):
    """A Lease this process holds, with its fencing token.

    Send ``token`` with every write the Lease protects. ``held`` reads the clock: each
    answer of the agent naming the grant says how long it is valid at most
    (``validForMs``), counted here from when that request was sent, and the session
    asks again well before that runs out. ``is_lost`` (also ``lost``) turns True when
    the grant ends without this process releasing it (``lost_reason`` says why,
    ``LocalDeadline`` when no answer came in time); from then on the protected
    resource refuses the token once a newer holder has used its own. A lost grant
    never comes back. As a context manager it releases on exit, also on an exception.
    Its properties may be read from any thread.
    """

    _session: "Session"

    def wait_lost(self, timeout: Optional[float] = None) -> bool:
        """Block until the grant ends or ``timeout`` seconds pass; True if it was lost,
        False if it is still held (timeout) or was released."""
        return self._session._run(self._wait_lost_flow(timeout))

    def check(self) -> float:
        """Seconds the grant is valid for at most, from the agent's memory and clock
        (no API server call; counted from when this request was sent). Raises
        LeaseLost when the grant is lost or released, also when its local deadline
        passes before the agent answers."""
        return self._session._run(self._check_flow())

    def put_object(self, bucket: str, key: str, body: bytes) -> _api.ObjectWritten:
        """Write ``body`` at ``key`` in an S3 bucket through the object-store fence, by the
        agent, with this grant's own token: the client never handles the token, so it
        cannot send the wrong one. Raises StaleTokenError when a newer holder of the
        Lease wrote the object (nothing written: stop writing), LeaseLost when the
        grant has ended, AgentError otherwise (``grant_lost``, ``grant_not_held``,
        ``no_such_bucket``, ``object_store_error``, ``object_store_not_configured``:
        the agent needs AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY)."""
        return self._session._run(self._put_object_flow(bucket, key, body))

    def release(self) -> None:
        """Release the Lease: the next waiter gets it at once. Does nothing when the
        grant is already lost or released. The grant is not held from the call on,
        even when the agent's answer is an error (raised here): the agent stops
        renewing it anyway, and it ends at its deadline at the latest."""
        self._session._run(self._release_flow())

    def __enter__(self) -> "Grant":
        return self

    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        self._session._run(self._exit_flow(exc))


class Session(_core.SessionBase):
    """One application process's session with the agent.

    Opening it creates the session and its event stream; a background thread GETs
    the session every third of ``keepalive_ms`` and every sixth of the shortest Lease
    duration held: a keepalive, and new deadlines for its grants. When none succeeds
    within ``keepalive_ms`` of the last that did, or the event stream ends, the session
    has ended and every grant of it is lost. ``close()`` (or leaving a ``with`` block)
    ends it, releasing every Lease it holds. In a forked child it has ended: its
    grants are the parent's.

    The agent is at ``socket_path`` or ``url``, by default $PALISADE_AGENT_SOCKET,
    else $PALISADE_AGENT_URL (``http://127.0.0.1:PORT``), else /run/palisade/agent.sock.
    """

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
        self._wake = threading.Event()
        sent = self._run(self._create_flow())
        try:
            self._stream = self._open_stream()
        except BaseException:
            self._run(self._delete_flow())
            raise
        self._events = threading.Thread(
            target=self._read_events, name=f"palisade-events-{self.id}", daemon=True
        )
        self._keepalive = threading.Thread(
            target=self._run, args=(self._keepalive_flow(sent),),
            name=f"palisade-keepalive-{self.id}", daemon=True,
        )
        self._events.start()
        self._keepalive.start()
        self._opened()

    def acquire(
        self,
        name: str,
        *,
        namespace: Optional[str] = None,
        duration_seconds: Optional[int] = None,
        holder_identity: Optional[str] = None,
        timeout: Optional[float] = None,
        slot: Optional[int] = None,
    ) -> Grant:
        """Acquire the Lease ``name`` (in ``namespace``, default the agent's pod's) and
        return its Grant once held. Waits as long as it takes, or ``timeout`` seconds,
        then raises TimeoutError (and leaves the queue, as on Ctrl-C). ``duration_seconds``
        is the Lease's duration if the agent creates it. ``slot`` (0..63) asks for only
        that slot of a semaphore; None takes any, the lowest free one (the grant's
        ``slot`` and ``fence_key`` say which). Raises AgentError when the agent refuses
        (e.g. a bad name: ``field == "name"``), LeaseLost when the session ends while
        waiting, ValueError or TypeError for a bad argument, before any request."""
        return self._run(
            self._acquire_flow(name, namespace, duration_seconds, holder_identity, timeout, slot)
        )

    def close(self) -> None:
        """End the session: the agent releases every Lease it holds or waits for."""
        if self._run(self._close_flow()):
            self._stream.close()

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- the shell: I/O and waiting ------------------------------------------------

    def _run(self, flow: Flow[T]) -> T:
        """Drive ``flow`` to its end: perform each operation it yields, blocking, and
        send it the result (or throw it the exception, a KeyboardInterrupt too)."""
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
                    result = self._perform(op)
                except BaseException as e:
                    error = e
        finally:
            flow.close()

    def _perform(self, op: Any) -> Any:
        if isinstance(op, Call):
            return _transport.request(self.address, op.endpoint, op.target, op.body, timeout=op.timeout)
        if isinstance(op, Wait):
            return op.event.wait(op.seconds)
        if isinstance(op, Join):
            for done in op.handles:
                done.wait(op.seconds)
            return None
        if isinstance(op, Shield):
            return self._run(op.flow)
        raise TypeError(f"not an operation: {op!r}")

    def _event(self) -> threading.Event:
        return threading.Event()

    def _notify(self, event: threading.Event) -> None:
        event.set()

    def _release_later(self, grant: _core.GrantBase) -> None:
        if self._stopped:
            return  # ending the session released it
        done = threading.Event()
        self._track(grant.key, done)

        def release() -> None:
            try:
                self._run(self._lapsed_release_flow(grant))
            finally:
                self._untrack(grant.key, done)
                done.set()

        threading.Thread(target=release, name=f"palisade-release-{grant.name}", daemon=True).start()

    def _close_stream(self) -> None:
        self._stream.close()

    def _drop_stream(self) -> None:
        self._stream.abandon()

    def _open_stream(self) -> _transport.Stream:
        target = _api.EVENTS.target(session=self.id)
        stream = _transport.Stream(self.address, _api.EVENTS, target, _core.SHORT_TIMEOUT)
        if stream.status != 200:
            raw = stream.read_all(_core.SHORT_TIMEOUT)
            stream.close()
            raise error_from_response(stream.status, raw)
        return stream

    def _read_events(self) -> None:
        sse = SseParser()
        error: Optional[BaseException] = None
        try:
            for chunk in self._stream.chunks():
                self._feed_events(sse, chunk)
        except (OSError, ProtocolError, ValueError) as e:
            error = e
        self._events_ended(error)
