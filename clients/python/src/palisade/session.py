"""The blocking client: a Session with the agent, and the Grants it acquires."""

from __future__ import annotations

import logging
import math
import os
import threading
import time
import weakref
from types import TracebackType
from typing import Any, Dict, List, Optional, Tuple, Type

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

    Send ``token`` with every write the Lease protects. ``held`` reads the clock: each
    answer of the agent naming the grant says how long it is valid at most
    (``validForMs``), counted here from when that request was sent, and the session
    asks again well before that runs out. ``lost`` turns True when the grant ends
    without this process releasing it (``lost_reason`` says why, ``LocalDeadline``
    when no answer came in time); from then on the protected resource refuses the
    token once a newer holder has used its own. A lost grant never comes back. As a
    context manager it releases on exit, also on an exception.
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
        self._lock = threading.Lock()
        self._ended = threading.Event()
        self._state = "held"
        # Set by the first release: the agent stops renewing at once, whatever it answers.
        self._let_go = False
        self._deadline = sent + info.valid_for_ms / 1000
        self._deadline_sent = sent
        self._lost_reason: Optional[str] = None
        self._lost_message: Optional[str] = None

    def __repr__(self) -> str:
        return f"<palisade.Grant {self.namespace}/{self.name} token={self.token} {self._state}>"

    @property
    def key(self) -> Tuple[str, str]:
        return (self.namespace, self.name)

    @property
    def lost(self) -> bool:
        """True once the grant was lost (not when released)."""
        return self._now() == "lost"

    # The name palisade.aio uses (there ``lost()`` waits for the loss).
    is_lost = lost

    @property
    def released(self) -> bool:
        return self._now() == "released"

    @property
    def held(self) -> bool:
        """Neither lost nor released, nor past its local deadline, nor being released."""
        return self._now() == "held" and not self._let_go

    @property
    def lost_reason(self) -> Optional[str]:
        self._now()
        return self._lost_reason

    @property
    def lost_message(self) -> Optional[str]:
        self._now()
        return self._lost_message

    def wait_lost(self, timeout: Optional[float] = None) -> bool:
        """Block until the grant ends or ``timeout`` seconds pass; True if it was lost,
        False if it is still held (timeout) or was released."""
        until = None if timeout is None else time.monotonic() + timeout
        # Reads the deadline itself: no other thread needs to be on time.
        while self._now() == "held":
            now = time.monotonic()
            if until is not None and now >= until:
                break
            end = self._deadline if until is None else min(self._deadline, until)
            self._ended.wait(max(0.0, end - now))
        return self.lost

    def check(self) -> float:
        """Seconds the grant is valid for at most, from the agent's memory and clock
        (no API server call; counted from when this request was sent). Raises
        LeaseLost when the grant is lost or released, also when its local deadline
        passes before the agent answers."""
        self._raise_if_ended()
        sent = time.monotonic()
        try:
            status, body = self._session._call(
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

    def release(self) -> None:
        """Release the Lease: the next waiter gets it at once. Does nothing when the
        grant is already lost or released. The grant is not held from the call on,
        even when the agent's answer is an error (raised here): the agent stops
        renewing it anyway, and it ends at its deadline at the latest."""
        if self._now() != "held":
            return
        with self._lock:
            if self._state != "held" or self._let_go:
                return
            self._let_go = True
        try:
            status, body = self._session._call(
                _api.RELEASE, namespace=self.namespace, name=self.name
            )
            if status == 409:
                # grant_lost: it was lost first; its state says why.
                self._end("lost", *self._why_lost(error_from_response(status, body)))
            elif status == 404:
                # The session or the grant is gone: nothing is held.
                self._end("lost", _api.SESSION_ENDED, error_from_response(status, body).message)
            elif status != 200:
                raise error_from_response(status, body)
        finally:
            self._end("released")

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

    def _now(self) -> str:
        """The state on the clock now: held past the local deadline is lost."""
        if self._state == "held" and time.monotonic() >= self._deadline:
            self._expire()
        return self._state

    def _expire(self) -> None:
        with self._lock:
            due = self._state == "held" and time.monotonic() >= self._deadline
            let_go = self._let_go
        if due and self._end("lost", _api.LOCAL_DEADLINE, _api.LAPSED) and not let_go:
            self._session._release_later(self)

    def _update(self, sent: float, info: GrantInfo) -> None:
        """The answer to a request sent at ``sent`` names this grant: its state, and
        while held a later deadline (never after the last one passed)."""
        self._apply(info)
        if info.state != "held" or info.token != self.token:
            return
        if info.duration_seconds is not None:
            self.duration_seconds = info.duration_seconds
        with self._lock:
            if self._state == "held" and sent >= self._deadline_sent and time.monotonic() < self._deadline:
                self._deadline = sent + info.valid_for_ms / 1000
                self._deadline_sent = sent

    def _apply(self, info: GrantInfo) -> None:
        verdict = _api.judge(self.token, info)
        if verdict.state is None:
            return
        with self._lock:
            let_go = self._let_go
        if let_go and info.state == "released":
            self._end("released")
        else:
            self._end("lost", verdict.reason, verdict.message)

    def _end(self, state: str, reason: Optional[str] = None, message: Optional[str] = None) -> bool:
        with self._lock:
            if self._state != "held":
                return False
            self._state = state
            if state == "lost":
                self._lost_reason = reason or "Lost"
                self._lost_message = message
        if state == "lost":
            log.warning(
                "lease %s/%s (token %d) lost: %s%s",
                self.namespace, self.name, self.token, self._lost_reason,
                f": {message}" if message else "",
            )
        self._session._forget(self)
        self._ended.set()
        return True

    def _forked(self) -> None:
        # The parent's threads did not come along, and may have held these.
        self._lock = threading.Lock()
        self._ended = threading.Event()

    def _raise_if_ended(self) -> None:
        state = self._now()
        if state == "lost":
            raise LeaseLost(self._lost_reason or "Lost", self._lost_message or "")
        if state == "released" or self._let_go:
            raise LeaseLost(_api.RELEASED, "the grant was released")


class Session:
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
        # Releases of grants lost by their deadline, under way (set when done).
        self._releases: Dict[Tuple[str, str], threading.Event] = {}
        self._stop = threading.Event()
        self._wake = threading.Event()
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
        _sessions.add(self)

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
        # A release of this Lease still under way would end the new grant.
        with self._lock:
            pending = [e for (ns, n), e in self._releases.items() if n == name and namespace in (None, ns)]
        for done in pending:
            done.wait(SHORT_TIMEOUT)
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
            if info.state == "held":
                # A long poll may be answered long after it was sent: validForMs is
                # counted from the send instant of a GET, which is answered at once.
                sent = time.monotonic()
                status, raw = self._call(_api.GET_GRANT, namespace=info.namespace, name=info.name)
                if status != 200:
                    raise self._error(status, raw)
                info = _api.grant_from_answer(status, raw)
            if info.state == "held" and info.token is not None:
                return self._register(info, sent)
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

    def _register(self, info: GrantInfo, sent: float) -> Grant:
        grant = Grant(self, info, sent)
        with self._lock:
            ended = self._stop.is_set()
            if not ended:
                self._grants[grant.key] = grant
            report = self._reports.get(grant.key)
        if ended:
            grant._end("lost", self.end_reason or _api.SESSION_ENDED, self.end_message)
        elif report is not None:
            grant._apply(report)
        self._wake.set()  # its deadline and duration may call for an earlier refresh
        return grant

    def _forget(self, grant: Grant) -> None:
        with self._lock:
            if self._grants.get(grant.key) is grant:
                del self._grants[grant.key]

    def _held(self) -> List[Grant]:
        with self._lock:
            return list(self._grants.values())

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

    def _release_later(self, grant: Grant) -> None:
        """Release a grant lost by its local deadline, in the background: this process
        may have been the slow one, and the agent would renew it for nobody."""
        if self._stop.is_set():
            return  # ending the session released it
        done = threading.Event()
        with self._lock:
            self._releases[grant.key] = done

        def release() -> None:
            try:
                self._call(_api.RELEASE, namespace=grant.namespace, name=grant.name, timeout=SHORT_TIMEOUT)
            except AgentError as e:
                log.info("releasing %s/%s after its deadline: %s", grant.namespace, grant.name, e)
            finally:
                with self._lock:
                    if self._releases.get(grant.key) is done:
                        del self._releases[grant.key]
                done.set()

        threading.Thread(target=release, name=f"palisade-release-{grant.name}", daemon=True).start()

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
        _sessions.discard(self)
        self._wake.set()
        if reason:
            log.warning("palisade session %s ended: %s%s", self.id, reason, f": {message}" if message else "")
        for grant in grants:
            grant._end(state, reason, message)
        return True

    def _forked(self) -> None:
        """In a forked child: the session and its grants are the parent's. The
        parent's threads did not come along, and may have held these locks."""
        ended = self._stop.is_set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._releases = {}
        for grant in self._grants.values():
            grant._forked()
        self._stream.abandon()
        if ended:
            self._stop.set()
        else:
            self._finish(_api.SESSION_ENDED, "a forked child does not hold its parent's grants", "lost")

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
        """GET the session (a keepalive, and new deadlines for the grants) often
        enough, and end each grant at its deadline, on time."""
        lifetime = self.keepalive_ms / 1000
        retry_at = 0.0
        while not self._stop.is_set():
            now = time.monotonic()
            for grant in self._held():
                grant._now()  # lost if past its deadline
            if now >= last_ok + lifetime:
                self._end(_api.KEEPALIVE_MISSED, f"no keepalive succeeded for {self.keepalive_ms} ms")
                return
            grants = self._held()
            durations = [g.duration_seconds for g in grants if g.duration_seconds]
            interval = _api.refresh_interval(self.keepalive_ms, durations)
            first_deadline = min([g._deadline for g in grants], default=math.inf)
            if first_deadline <= now:
                continue  # one more lapsed since the clock was read
            next_send = max(last_ok + interval, retry_at)
            if now < next_send:
                self._wake.wait(min(next_send, last_ok + lifetime, first_deadline) - now)
                self._wake.clear()
                continue
            # An answer after a deadline would come too late for it.
            timeout = min(interval, last_ok + lifetime - now, first_deadline - now)
            try:
                status, raw = self._call(_api.GET_SESSION, timeout=timeout)
                if status == 200:
                    self._refresh(now, _api.session_grants(status, raw))
                    last_ok, retry_at = now, 0.0
                    continue
            except AgentError as e:
                status, raw = 0, str(e).encode()
            if status == 404:
                self._end(_api.SESSION_ENDED, error_from_response(status, raw).message)
                return
            if self._stop.is_set():
                return
            log.warning("keepalive of session %s failed: %s", self.id, raw.decode(errors="replace")[:200])
            # Retry sooner than the interval: the deadlines do not move.
            retry_at = time.monotonic() + interval / 4

    def _refresh(self, sent: float, infos: List[GrantInfo]) -> None:
        with self._lock:
            grants = dict(self._grants)
        for info in infos:
            grant = grants.get(info.key)
            if grant is not None:
                grant._update(sent, info)


# Every open session, so that a forked child can disown them.
_sessions: "weakref.WeakSet[Session]" = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for session in list(_sessions):
        session._forked()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
