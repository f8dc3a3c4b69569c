"""The blocking client: a Session with the agent, and the Grants it acquires."""

from __future__ import annotations

import logging
import threading
import time
from types import TracebackType
from typing import Any, Dict, Optional, Tuple, Type

from . import _api, _transport
from ._api import GrantInfo
from ._http import ProtocolError
from ._sse import SseParser
from .errors import AgentError, AgentUnreachable, LeaseLost, error_from_response

__all__ = ["Session", "Grant"]

log = logging.getLogger("palisade")

# Short requests (create, keepalive, release, end) get the agent's answer bound.
SHORT_TIMEOUT = _api.ANSWER_MARGIN_S


class Grant:
    """A Lease this process holds, with its fencing token.

    Send ``token`` with every write the Lease protects. ``lost`` turns True when the
    grant ends without this process releasing it (``lost_reason`` says why); from
    then on the protected resource refuses the token once a newer holder has used
    its own. As a context manager it releases on exit, also on an exception.
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
        self._lock = threading.Lock()
        self._ended = threading.Event()
        self._state = "held"
        self._releasing = False
        self.lost_reason: Optional[str] = None
        self.lost_message: Optional[str] = None

    def __repr__(self) -> str:
        return f"<palisade.Grant {self.namespace}/{self.name} token={self.token} {self._state}>"

    @property
    def key(self) -> Tuple[str, str]:
        return (self.namespace, self.name)

    @property
    def lost(self) -> bool:
        """True once the grant was lost (not when released)."""
        return self._state == "lost"

    @property
    def released(self) -> bool:
        return self._state == "released"

    @property
    def held(self) -> bool:
        """Neither lost nor released, as far as this process knows."""
        return self._state == "held"

    def wait_lost(self, timeout: Optional[float] = None) -> bool:
        """Block until the grant ends or ``timeout`` seconds pass; True if it was lost,
        False if it is still held (timeout) or was released."""
        self._ended.wait(timeout)
        return self.lost

    def check(self) -> float:
        """Seconds the grant is valid for at most, from the agent's memory and clock
        (no API server call; counted from when this request was sent). Raises
        LeaseLost when the grant is lost or released."""
        self._raise_if_ended()
        sent = time.monotonic()
        status, body = self._session._call(
            _api.GET_GRANT, namespace=self.namespace, name=self.name
        )
        if status != 200:
            raise self._session._error(status, body)
        info = _api.grant_from_answer(status, body)
        self._apply(info)
        self._raise_if_ended()
        return max(0.0, sent + info.valid_for_ms / 1000 - time.monotonic())

    def release(self) -> None:
        """Release the Lease: the next waiter gets it at once. Does nothing when the
        grant is already lost or released."""
        with self._lock:
            if self._state != "held" or self._releasing:
                return
            self._releasing = True
        try:
            status, body = self._session._call(
                _api.RELEASE, namespace=self.namespace, name=self.name
            )
            if status == 200:
                self._end("released")
            elif status == 409:
                # grant_lost: it was lost first; its state says why.
                self._end("lost", *self._why_lost(error_from_response(status, body)))
            elif status == 404:
                # The session or the grant is gone: nothing is held.
                self._end("lost", _api.SESSION_ENDED, error_from_response(status, body).message)
            else:
                raise error_from_response(status, body)
        finally:
            with self._lock:
                self._releasing = False

    def _why_lost(self, err: AgentError) -> Tuple[str, str]:
        try:
            status, body = self._session._call(_api.GET_GRANT, namespace=self.namespace, name=self.name)
            info = _api.grant_from_answer(status, body) if status == 200 else None
        except AgentError:
            info = None
        if info is not None and info.state == "lost" and info.lost_reason:
            return info.lost_reason, info.lost_message or err.message
        return "Lost", err.message

    def __enter__(self) -> "Grant":
        return self

    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        try:
            self.release()
        except AgentError:
            if exc is None:
                raise
            log.warning("releasing %s/%s after an error", self.namespace, self.name, exc_info=True)

    # -- called by the session ------------------------------------------------------

    def _apply(self, info: GrantInfo) -> None:
        verdict = _api.judge(self.token, info)
        if verdict.state is None:
            return
        with self._lock:
            releasing = self._releasing
        if releasing and info.state == "released":
            self._end("released")
        else:
            self._end("lost", verdict.reason, verdict.message)

    def _end(self, state: str, reason: Optional[str] = None, message: Optional[str] = None) -> None:
        with self._lock:
            if self._state != "held":
                return
            self._state = state
            if state == "lost":
                self.lost_reason = reason or "Lost"
                self.lost_message = message
        if state == "lost":
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
    """One application process's session with the agent.

    Opening it creates the session and its event stream; a background thread sends
    a keepalive every ``keepalive_ms / 3``. When none succeeds within
    ``keepalive_ms`` of the last that did, or the event stream ends, the session has
    ended and every grant of it is lost. ``close()`` (or leaving a ``with`` block)
    ends it, releasing every Lease it holds.

    The agent is at ``socket_path`` or ``url``, by default $PALISADE_AGENT_SOCKET,
    else $PALISADE_AGENT_URL (``http://127.0.0.1:PORT``), else /run/palisade/agent.sock.
    """

    def __init__(
        self,
        *,
        socket_path: Optional[str] = None,
        url: Optional[str] = None,
        keepalive_ms: Optional[int] = None,
        name: Optional[str] = None,
    ) -> None:
        self.address = _api.resolve_address(socket_path, url)
        body = _api.session_body(keepalive_ms, name)
        self._lock = threading.Lock()
        self._grants: Dict[Tuple[str, str], Grant] = {}
        # The latest state the event stream reported for each Lease, for a grant
        # whose acquire answer comes after its events.
        self._reports: Dict[Tuple[str, str], GrantInfo] = {}
        self._stop = threading.Event()
        self.end_reason: Optional[str] = None
        self.end_message: Optional[str] = None
        sent = time.monotonic()
        status, raw = _transport.request(
            self.address, _api.CREATE_SESSION, _api.CREATE_SESSION.target(), body,
            timeout=SHORT_TIMEOUT,
        )
        if status != 201:
            raise error_from_response(status, raw)
        self.id, self.keepalive_ms = _api.session_from_answer(status, raw)
        try:
            self._stream = self._open_stream()
        except BaseException:
            self._delete_session()
            raise
        self._events = threading.Thread(
            target=self._read_events, name=f"palisade-events-{self.id}", daemon=True
        )
        self._keepalive = threading.Thread(
            target=self._keep_alive, args=(sent,), name=f"palisade-keepalive-{self.id}", daemon=True
        )
        self._events.start()
        self._keepalive.start()

    def __repr__(self) -> str:
        state = "open" if not self._stop.is_set() else f"ended ({self.end_reason})"
        return f"<palisade.Session {self.id} at {self.address} {state}>"

    @property
    def ended(self) -> bool:
        return self._stop.is_set()

    def acquire(
        self,
        name: str,
        *,
        namespace: Optional[str] = None,
        duration_seconds: Optional[int] = None,
        holder_identity: Optional[str] = None,
        timeout: Optional[float] = None,
    ) -> Grant:
        """Acquire the Lease ``name`` (in ``namespace``, default the agent's pod's) and
        return its Grant once held. Waits as long as it takes, or ``timeout`` seconds,
        then raises TimeoutError (and leaves the queue). ``duration_seconds`` is the
        Lease's duration if the agent creates it. Raises AgentError when the agent
        refuses (e.g. a bad name: ``field == "name"``), LeaseLost when the session
        ends while waiting."""
        timeout = _api.check_timeout(timeout)
        deadline = None if timeout is None else time.monotonic() + timeout
        body = _api.acquire_body(
            name, namespace, duration_seconds, holder_identity, _api.wait_ms_for(timeout)
        )
        self._raise_if_ended()
        answered = False
        info: Optional[GrantInfo] = None
        try:
            status, raw = self._call(_api.ACQUIRE, body, wait_ms=body["waitMs"])
            answered = True
            if status not in (200, 202):
                raise self._error(status, raw)  # refused: no claim was made
            info = _api.grant_from_answer(status, raw)
            while info.state == "waiting":
                self._raise_if_ended()
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise TimeoutError(
                        f"lease {info.namespace}/{info.name} not granted within {timeout:g} s"
                    )
                wait_ms = _api.wait_ms_for(remaining)
                status, raw = self._call(
                    _api.GET_GRANT, query={"waitMs": wait_ms}, wait_ms=wait_ms,
                    namespace=info.namespace, name=info.name,
                )
                if status != 200:
                    raise self._error(status, raw)
                info = _api.grant_from_answer(status, raw)
            if info.state == "held" and info.token is not None:
                return self._register(info)
        except BaseException:
            # Leave the queue (timeout, Ctrl-C, an error): a waiting claim would be
            # granted to nobody and hold the Lease up.
            if info is not None or not answered:
                self._abandon(name, namespace, info)
            raise
        if info.state == "lost":
            raise LeaseLost(info.lost_reason or "Lost", info.lost_message or "")
        raise AgentError(status, "unexpected_response", None, f"acquire answered state {info.state!r}")

    def close(self) -> None:
        """End the session: the agent releases every Lease it holds or waits for."""
        if self._stop.is_set():
            return
        self._finish(None, None, "released")
        self._delete_session()
        self._stream.close()

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- internals ------------------------------------------------------------------

    def _call(
        self,
        endpoint: _api.Endpoint,
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
        return _transport.request(self.address, endpoint, target, body, timeout=timeout)

    def _error(self, status: int, raw: bytes) -> Exception:
        err = error_from_response(status, raw)
        if err.code == "unknown_session":
            self._end(_api.SESSION_ENDED, err.message)
            return LeaseLost(_api.SESSION_ENDED, err.message)
        return err

    def _raise_if_ended(self) -> None:
        if self._stop.is_set():
            raise LeaseLost(self.end_reason or _api.SESSION_ENDED, self.end_message or "the session was closed")

    def _register(self, info: GrantInfo) -> Grant:
        grant = Grant(self, info)
        with self._lock:
            ended = self._stop.is_set()
            if not ended:
                self._grants[grant.key] = grant
            report = self._reports.get(grant.key)
        if ended:
            grant._end("lost", self.end_reason or _api.SESSION_ENDED, self.end_message)
        elif report is not None:
            grant._apply(report)
        return grant

    def _forget(self, grant: Grant) -> None:
        with self._lock:
            if self._grants.get(grant.key) is grant:
                del self._grants[grant.key]

    def _abandon(self, name: str, namespace: Optional[str], info: Optional[GrantInfo]) -> None:
        """Release the claim an unfinished acquire made; without its answer, whichever
        claims of that name the session has that no Grant holds."""
        if self._stop.is_set():
            return
        try:
            if info is not None:
                keys = [info.key]
            else:
                status, raw = self._call(_api.GET_SESSION)
                if status != 200:
                    raise self._error(status, raw)
                with self._lock:
                    known = list(self._grants)
                keys = _api.unanswered_claims(status, raw, name, namespace, known)
            for ns, n in keys:
                self._call(_api.RELEASE, namespace=ns, name=n)
        except (AgentError, LeaseLost) as e:
            log.warning("leaving the queue of %s: %s", name, e)

    def _report(self, info: GrantInfo) -> None:
        with self._lock:
            self._reports[info.key] = info
            grant = self._grants.get(info.key)
        if grant is not None:
            grant._apply(info)

    def _end(self, reason: str, message: Optional[str]) -> None:
        """The session ended without close(): every grant is lost. Closing the stream
        makes the agent end it too, if it has not."""
        if self._finish(reason, message, "lost"):
            self._stream.close()

    def _finish(self, reason: Optional[str], message: Optional[str], state: str) -> bool:
        with self._lock:
            if self._stop.is_set():
                return False
            self.end_reason, self.end_message = reason, message
            self._stop.set()
            grants = list(self._grants.values())
        if reason:
            log.warning("palisade session %s ended: %s%s", self.id, reason, f": {message}" if message else "")
        for grant in grants:
            grant._end(state, reason, message)
        return True

    def _delete_session(self) -> None:
        try:
            self._call(_api.END_SESSION, timeout=SHORT_TIMEOUT)
        except AgentError as e:
            log.warning("ending session %s: %s", self.id, e)

    def _open_stream(self) -> _transport.Stream:
        target = _api.EVENTS.target(session=self.id)
        stream = _transport.Stream(self.address, _api.EVENTS, target, SHORT_TIMEOUT)
        if stream.status != 200:
            raw = stream.read_all(SHORT_TIMEOUT)
            stream.close()
            raise error_from_response(stream.status, raw)
        return stream

    def _read_events(self) -> None:
        parser = SseParser()
        why = "the agent closed the event stream"
        try:
            for chunk in self._stream.chunks():
                for event in parser.feed(chunk):
                    for info in _api.grants_of_event(event.event, event.data):
                        self._report(info)
        except (OSError, ProtocolError) as e:
            why = f"the event stream broke: {e}"
        except ValueError as e:
            why = f"the event stream sent an event this client cannot read: {e}"
        self._end(_api.SESSION_ENDED, why)

    def _keep_alive(self, last_ok: float) -> None:
        period = self.keepalive_ms / 3000
        lifetime = self.keepalive_ms / 1000
        next_send = last_ok + period
        while True:
            deadline = last_ok + lifetime
            if self._stop.wait(max(0.0, min(next_send, deadline) - time.monotonic())):
                return
            sent = time.monotonic()
            if sent >= deadline:
                self._end(_api.KEEPALIVE_MISSED, f"no keepalive succeeded for {self.keepalive_ms} ms")
                return
            try:
                status, raw = self._call(_api.KEEPALIVE, timeout=deadline - sent)
            except AgentUnreachable as e:
                status, raw = 0, str(e).encode()
            if status == 204:
                last_ok = sent
                next_send = sent + period
                continue
            if status == 404:
                self._end(_api.SESSION_ENDED, error_from_response(status, raw).message)
                return
            if self._stop.is_set():
                return
            log.warning("keepalive of session %s failed: %s", self.id, raw.decode(errors="replace")[:200])
            # Retry sooner than the period: the deadline does not move.
            next_send = time.monotonic() + period / 4
