"""The client's behaviour, once and without I/O: ``session`` (threads, blocking
sockets) and ``aio`` (asyncio) are shells that do only the I/O and the waiting.

Why: each operation is a generator (a *flow*) that yields what it needs (``Call`` the
agent, ``Wait`` on an event, ``Join`` background releases, ``Shield`` a cleanup from
cancellation) and is sent the result; each shell has one driver that performs these,
blocking or awaiting, as psycopg 3 shares its sync and async code. The state sits
here under a ``threading.Lock``: any thread may read a grant, a fork resets the locks.
Rejected: the sync client as the asyncio one on a private loop in a daemon thread. A
forked child would inherit that loop's epoll set, shared with the parent (cleaning up
there unregisters the parent's sockets), every read would cross threads, and Ctrl-C
in an acquire could not wait for it to leave the queue.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
import weakref
from typing import Any, Dict, Generator, List, NamedTuple, Optional, Tuple, TypeVar

from . import _api
from ._api import Endpoint, GrantInfo
from ._http import ProtocolError
from ._sse import SseParser
from .errors import AgentError, AgentUnreachable, LeaseLost, StaleTokenError, error_from_response

log = logging.getLogger("palisade")
T = TypeVar("T")

# Short requests (create, release, end) get the agent's answer bound.
SHORT_TIMEOUT = _api.ANSWER_MARGIN_S
HELD, LOST, RELEASED = "held", "lost", "released"


class Call(NamedTuple):
    """Send one request; the flow is sent ``(status, body)`` or thrown AgentError."""

    endpoint: Endpoint
    target: str
    body: Optional[Any]
    timeout: float


class Wait(NamedTuple):
    """Wait until ``event`` is set or ``seconds`` pass (a threading or asyncio Event)."""

    event: Any
    seconds: float


class Join(NamedTuple):
    """Wait for background releases (the shell's handles) for ``seconds`` at most."""

    handles: Tuple[Any, ...]
    seconds: float


class Shield(NamedTuple):
    """Run ``flow`` to its end even when the caller is cancelled meanwhile."""

    flow: "Flow[Any]"


Op = Any  # one of Call, Wait, Join, Shield
Flow = Generator[Op, Any, T]


class GrantBase:
    """A Grant's state and operations; the shells add the blocking or awaitable methods."""

    _kind = "palisade"

    def __init__(self, session: "SessionBase", info: GrantInfo, sent: float) -> None:
        assert info.token is not None
        self._session = session
        self.name: str = info.name
        self.namespace: str = info.namespace
        self.token: int = info.token
        # The slot held (0 on a lock) and the key the fences use for it, as the agent
        # says; an agent from before semaphores says neither: slot 0, a lock's key.
        self.slot: int = info.slot or 0
        self.fence_key: str = info.fence_key or f"{info.namespace}/{info.name}"
        self.claim: Optional[str] = info.claim
        self.holder_identity: Optional[str] = info.holder_identity
        self.duration_seconds: Optional[int] = info.duration_seconds
        self._lock = threading.Lock()
        self._ended = session._event()
        self._state = HELD
        # Set by the first release: the agent stops renewing at once, whatever it answers.
        self._let_go = False
        self._deadline = sent + info.valid_for_ms / 1000
        self._deadline_sent = sent
        self._lost_reason: Optional[str] = None
        self._lost_message: Optional[str] = None

    def __repr__(self) -> str:
        slot = f" slot={self.slot}" if self.slot else ""
        return f"<{self._kind}.Grant {self.namespace}/{self.name}{slot} token={self.token} {self._state}>"

    @property
    def key(self) -> Tuple[str, str]:
        return (self.namespace, self.name)

    @property
    def is_lost(self) -> bool:
        """True once the grant was lost (not when released); it never comes back."""
        return self._now() == LOST

    @property
    def lost(self) -> bool:
        """The same as ``is_lost``."""
        return self._now() == LOST

    @property
    def released(self) -> bool:
        """True once released by this process (or with its session's close)."""
        return self._now() == RELEASED

    @property
    def held(self) -> bool:
        """Neither lost nor released, nor past its local deadline, nor being released."""
        return self._now() == HELD and not self._let_go

    @property
    def lost_reason(self) -> Optional[str]:
        self._now()
        return self._lost_reason

    @property
    def lost_message(self) -> Optional[str]:
        self._now()
        return self._lost_message

    # -- flows ----------------------------------------------------------------------

    def _wait_lost_flow(self, timeout: Optional[float]) -> Flow[bool]:
        until = None if timeout is None else time.monotonic() + timeout
        # Reads the deadline itself: no other thread or task needs to be on time.
        while self._now() == HELD:
            now = time.monotonic()
            if until is not None and now >= until:
                break
            end = self._deadline if until is None else min(self._deadline, until)
            yield Wait(self._ended, max(0.0, end - now))
        return self.is_lost

    def _check_flow(self) -> Flow[float]:
        self._raise_if_ended()
        sent = time.monotonic()
        try:
            status, body = yield self._session._call(
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

    def _put_object_flow(self, bucket: str, key: str, body: bytes) -> Flow[_api.ObjectWritten]:
        """The agent writes with the grant's own token: the client never sends one."""
        self._raise_if_ended()
        status, answer = yield self._session._call(
            _api.PUT_OBJECT, bytes(body), namespace=self.namespace, name=self.name, bucket=bucket, key=key
        )
        if status == 200:
            return _api.object_written(status, answer)
        err = self._session._error(status, answer)
        if isinstance(err, AgentError) and err.code == "stale_token":
            doc = _api.parse_json(status, answer)
            highest = doc.get("highest") if isinstance(doc, dict) else None
            stale = StaleTokenError(key, self.token, highest if isinstance(highest, int) else None)
            raise stale from err
        raise err

    def _release_flow(self) -> Flow[None]:
        if self._now() != HELD:
            return
        with self._lock:
            if self._state != HELD or self._let_go:
                return
            self._let_go = True
        try:
            status, body = yield self._session._call(_api.RELEASE, namespace=self.namespace, name=self.name)
            if status == 409:
                # grant_lost: it was lost first; its state says why.
                why = yield from self._why_lost_flow(error_from_response(status, body))
                self._end(LOST, *why)
            elif status == 404:
                # The session or the grant is gone: nothing is held.
                self._end(LOST, _api.SESSION_ENDED, error_from_response(status, body).message)
            elif status != 200:
                raise error_from_response(status, body)
        finally:
            self._end(RELEASED)

    def _why_lost_flow(self, err: AgentError) -> Flow[Tuple[str, str]]:
        try:
            status, body = yield self._session._call(_api.GET_GRANT, namespace=self.namespace, name=self.name)
            info = _api.grant_from_answer(status, body) if status == 200 else None
        except AgentError:
            info = None
        if info is not None and info.state == LOST and info.lost_reason:
            return info.lost_reason, info.lost_message or err.message
        return "Lost", err.message

    def _exit_flow(self, exc: Optional[BaseException]) -> Flow[None]:
        """Leaving a ``with`` block: release; an error of that is raised unless the
        block raised one of its own."""
        try:
            yield from self._release_flow()
        except AgentError:
            if exc is None:
                raise
            log.warning("releasing %s/%s after an error", self.namespace, self.name, exc_info=True)

    # -- state ------------------------------------------------------------------------

    def _now(self) -> str:
        """The state on the clock now: held past the local deadline is lost, and then
        released in the background (unless a release is under way)."""
        if self._state == HELD and time.monotonic() >= self._deadline:
            with self._lock:
                due = self._state == HELD and time.monotonic() >= self._deadline
                let_go = self._let_go
            if due and self._end(LOST, _api.LOCAL_DEADLINE, _api.LAPSED) and not let_go:
                self._session._release_later(self)
        return self._state

    def _update(self, sent: float, info: GrantInfo) -> None:
        """The answer to a request sent at ``sent`` names this grant: its state, and
        while held a later deadline (never after the last one passed)."""
        self._apply(info)
        if info.state != HELD or info.token != self.token:
            return
        if info.duration_seconds is not None:
            self.duration_seconds = info.duration_seconds
        with self._lock:
            if self._state == HELD and sent >= self._deadline_sent and time.monotonic() < self._deadline:
                self._deadline = sent + info.valid_for_ms / 1000
                self._deadline_sent = sent

    def _apply(self, info: GrantInfo) -> None:
        verdict = _api.judge(self.token, info)
        if verdict.state is None:
            return
        with self._lock:
            let_go = self._let_go
        if let_go and info.state == RELEASED:
            self._end(RELEASED)
        else:
            self._end(LOST, verdict.reason, verdict.message)

    def _end(self, state: str, reason: Optional[str] = None, message: Optional[str] = None) -> bool:
        with self._lock:
            if self._state != HELD:
                return False
            self._state = state
            if state == LOST:
                self._lost_reason = reason or "Lost"
                self._lost_message = message
        if state == LOST:
            log.warning(
                "lease %s/%s (token %d) lost: %s%s",
                self.namespace, self.name, self.token, self._lost_reason,
                f": {message}" if message else "",
            )
        self._session._forget(self)
        self._session._notify(self._ended)
        return True

    def _raise_if_ended(self) -> None:
        state = self._now()
        if state == LOST:
            raise LeaseLost(self._lost_reason or "Lost", self._lost_message or "")
        if state == RELEASED or self._let_go:
            raise LeaseLost(_api.RELEASED, "the grant was released")

    def _forked(self) -> None:
        # The parent's threads did not come along, and may have held these.
        self._lock = threading.Lock()
        self._ended = self._session._event()


class SessionBase:
    """A session's state and operations; the shells open it, read its event stream,
    drive its flows and run its keepalive and background releases."""

    _kind = "palisade"
    _Grant: Any = GrantBase  # the shell's Grant

    def __init__(
        self,
        socket_path: Optional[str],
        url: Optional[str],
        keepalive_ms: Optional[int],
        name: Optional[str],
    ) -> None:
        self.address = _api.resolve_address(socket_path, url)
        self._body = _api.session_body(keepalive_ms, name)
        self.id = ""
        self.keepalive_ms = 0
        self.end_reason: Optional[str] = None
        self.end_message: Optional[str] = None
        self._lock = threading.Lock()
        self._stopped = False
        # Set to wake the keepalive (a new grant, the end); made by the shell's open.
        self._wake: Any = None
        self._grants: Dict[Tuple[str, str], Any] = {}
        # The latest state the event stream reported for each Lease, for a grant
        # whose acquire answer comes after its events.
        self._reports: Dict[Tuple[str, str], GrantInfo] = {}
        # Releases of grants lost by their deadline, under way (the shell's handles).
        self._releases: Dict[Tuple[str, str], Any] = {}

    def __repr__(self) -> str:
        state = "new" if not self.id else f"ended ({self.end_reason})" if self._stopped else "open"
        return f"<{self._kind}.Session {self.id or '-'} at {self.address} {state}>"

    @property
    def ended(self) -> bool:
        return self._stopped

    # -- what the shells provide --------------------------------------------------

    def _event(self) -> Any:
        raise NotImplementedError

    def _notify(self, event: Any) -> None:
        """Set ``event`` (from any thread)."""
        raise NotImplementedError

    def _release_later(self, grant: GrantBase) -> None:
        """Run ``_lapsed_release_flow(grant)`` in the background, tracked by ``_track``."""
        raise NotImplementedError

    def _close_stream(self) -> None:
        raise NotImplementedError

    def _drop_stream(self) -> None:
        """In a forked child: let go of this process's copy of the event stream only."""
        raise NotImplementedError

    # -- flows ----------------------------------------------------------------------

    def _call(
        self,
        endpoint: Endpoint,
        body: Optional[Any] = None,
        *,
        query: Optional[Dict[str, Any]] = None,
        wait_ms: int = 0,
        timeout: Optional[float] = None,
        **params: str,
    ) -> Call:
        target = endpoint.target(query, session=self.id, **params)
        if timeout is None:
            timeout = wait_ms / 1000 + _api.ANSWER_MARGIN_S
        return Call(endpoint, target, body, timeout)

    def _create_flow(self) -> Flow[float]:
        """Create the session; returns when its request was sent (the first keepalive)."""
        sent = time.monotonic()
        status, raw = yield Call(
            _api.CREATE_SESSION, _api.CREATE_SESSION.target(), self._body, SHORT_TIMEOUT
        )
        if status != 201:
            raise error_from_response(status, raw)
        self.id, self.keepalive_ms = _api.session_from_answer(status, raw)
        return sent

    def _delete_flow(self) -> Flow[None]:
        try:
            yield self._call(_api.END_SESSION, timeout=SHORT_TIMEOUT)
        except AgentError as e:
            log.warning("ending session %s: %s", self.id, e)

    def _close_flow(self) -> Flow[bool]:
        """End the session, releasing every grant; False if it had ended already."""
        if not self.id or not self._finish(None, None, RELEASED):
            return False
        yield from self._delete_flow()
        return True

    def _acquire_flow(
        self,
        name: str,
        namespace: Optional[str],
        duration_seconds: Optional[int],
        holder_identity: Optional[str],
        timeout: Optional[float],
        slot: Optional[int] = None,
    ) -> Flow[Any]:
        timeout = _api.check_timeout(timeout)
        deadline = None if timeout is None else time.monotonic() + timeout
        body = _api.acquire_body(
            name, namespace, duration_seconds, holder_identity, _api.wait_ms_for(timeout), slot
        )
        self._raise_if_ended()
        # A release of this Lease still under way would end the new grant.
        with self._lock:
            pending = tuple(h for (ns, n), h in self._releases.items() if n == name and namespace in (None, ns))
        if pending:
            yield Join(pending, SHORT_TIMEOUT)
        answered = False
        info: Optional[GrantInfo] = None
        try:
            status, raw = yield self._call(_api.ACQUIRE, body, wait_ms=body["waitMs"])
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
                status, raw = yield self._call(
                    _api.GET_GRANT, query={"waitMs": wait_ms}, wait_ms=wait_ms,
                    namespace=info.namespace, name=info.name,
                )
                if status != 200:
                    raise self._error(status, raw)
                info = _api.grant_from_answer(status, raw)
            if info.state == HELD:
                # A long poll may be answered long after it was sent: validForMs is
                # counted from the send instant of a GET, which is answered at once.
                sent = time.monotonic()
                status, raw = yield self._call(_api.GET_GRANT, namespace=info.namespace, name=info.name)
                if status != 200:
                    raise self._error(status, raw)
                info = _api.grant_from_answer(status, raw)
            if info.state == HELD and info.token is not None:
                return self._register(info, sent)
        except GeneratorExit:
            raise
        except BaseException:
            # Leave the queue (timeout, Ctrl-C, cancellation, an error): a waiting claim
            # would be granted to nobody and hold the Lease up.
            if info is not None or not answered:
                yield Shield(self._abandon_flow(name, namespace, info))
            raise
        if info.state == LOST:
            raise LeaseLost(info.lost_reason or "Lost", info.lost_message or "")
        raise AgentError(status, "unexpected_response", None, f"acquire answered state {info.state!r}")

    def _abandon_flow(self, name: str, namespace: Optional[str], info: Optional[GrantInfo]) -> Flow[None]:
        """Release the claim an unfinished acquire made; without its answer, whichever
        claims of that name the session has that no Grant holds."""
        if self._stopped:
            return
        try:
            if info is not None:
                keys = [info.key]
            else:
                status, raw = yield self._call(_api.GET_SESSION)
                if status != 200:
                    raise self._error(status, raw)
                with self._lock:
                    known = list(self._grants)
                keys = _api.unanswered_claims(status, raw, name, namespace, known)
            for ns, n in keys:
                yield self._call(_api.RELEASE, namespace=ns, name=n)
        except (AgentError, LeaseLost) as e:
            log.warning("leaving the queue of %s: %s", name, e)

    def _lapsed_release_flow(self, grant: GrantBase) -> Flow[None]:
        """Release a grant lost by its local deadline: this process (or its loop) may
        have been the slow one, and the agent would renew it for nobody."""
        try:
            yield self._call(_api.RELEASE, namespace=grant.namespace, name=grant.name, timeout=SHORT_TIMEOUT)
        except AgentError as e:
            log.info("releasing %s/%s after its deadline: %s", grant.namespace, grant.name, e)

    def _keepalive_flow(self, last_ok: float) -> Flow[None]:
        """GET the session (a keepalive, and new deadlines for the grants) every
        min(keepalive/3, shortest duration/6), and end each grant at its deadline, on
        time; ``last_ok`` is when the last successful one was sent."""
        lifetime = self.keepalive_ms / 1000
        retry_at = 0.0
        while not self._stopped:
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
                yield Wait(self._wake, min(next_send, last_ok + lifetime, first_deadline) - now)
                self._wake.clear()
                continue
            # An answer after a deadline would come too late for it.
            timeout = min(interval, last_ok + lifetime - now, first_deadline - now)
            try:
                status, raw = yield self._call(_api.GET_SESSION, timeout=timeout)
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
            # Retry sooner than the interval: the deadlines do not move.
            retry_at = time.monotonic() + interval / 4

    # -- the event stream ---------------------------------------------------------

    def _feed_events(self, sse: SseParser, chunk: bytes) -> None:
        for event in sse.feed(chunk):
            for info in _api.grants_of_event(event.event, event.data):
                self._report(info)

    def _events_ended(self, error: Optional[BaseException]) -> None:
        """The event stream ended (``error``: why, if it broke): so has the session."""
        if error is None:
            why = "the agent closed the event stream"
        elif isinstance(error, (OSError, ProtocolError)):
            why = f"the event stream broke: {error}"
        elif isinstance(error, ValueError):
            why = f"the event stream sent an event this client cannot read: {error}"
        else:
            why = "the event stream's task was cancelled"
        self._end(_api.SESSION_ENDED, why)

    # -- state ------------------------------------------------------------------------

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

    def _register(self, info: GrantInfo, sent: float) -> Any:
        grant = self._Grant(self, info, sent)
        with self._lock:
            ended = self._stopped
            if not ended:
                self._grants[grant.key] = grant
            report = self._reports.get(grant.key)
        if ended:
            grant._end(LOST, self.end_reason or _api.SESSION_ENDED, self.end_message)
            return grant
        if report is not None:
            grant._apply(report)
        self._notify(self._wake)  # its deadline and duration may call for an earlier refresh
        return grant

    def _forget(self, grant: GrantBase) -> None:
        with self._lock:
            if self._grants.get(grant.key) is grant:
                del self._grants[grant.key]

    def _held(self) -> List[Any]:
        with self._lock:
            return list(self._grants.values())

    def _track(self, key: Tuple[str, str], handle: Any) -> None:
        with self._lock:
            self._releases[key] = handle

    def _untrack(self, key: Tuple[str, str], handle: Any) -> None:
        with self._lock:
            if self._releases.get(key) is handle:
                del self._releases[key]

    def _report(self, info: GrantInfo) -> None:
        with self._lock:
            self._reports[info.key] = info
            grant = self._grants.get(info.key)
        if grant is not None:
            grant._apply(info)

    def _refresh(self, sent: float, infos: List[GrantInfo]) -> None:
        with self._lock:
            grants = dict(self._grants)
        for info in infos:
            grant = grants.get(info.key)
            if grant is not None:
                grant._update(sent, info)

    def _end(self, reason: str, message: Optional[str]) -> None:
        """The session ended without close(): every grant is lost. Closing the stream
        makes the agent end it too, if it has not."""
        if self._finish(reason, message, LOST):
            self._close_stream()

    def _finish(self, reason: Optional[str], message: Optional[str], state: str) -> bool:
        with self._lock:
            if self._stopped:
                return False
            self._stopped = True
            self.end_reason, self.end_message = reason, message
            grants = list(self._grants.values())
        _sessions.discard(self)
        if self._wake is not None:
            self._notify(self._wake)
        if reason:
            log.warning("palisade session %s ended: %s%s", self.id, reason, f": {message}" if message else "")
        for grant in grants:
            grant._end(state, reason, message)
        return True

    def _opened(self) -> None:
        _sessions.add(self)

    def _forked(self) -> None:
        """In a forked child: the session and its grants are the parent's. The
        parent's threads did not come along, and may have held these locks."""
        self._lock = threading.Lock()
        self._wake = self._event()
        self._releases = {}
        for grant in self._grants.values():
            grant._forked()
        self._drop_stream()
        self._finish(_api.SESSION_ENDED, "a forked child does not hold its parent's grants", LOST)


# Every open session of either shell, so that a forked child can disown them.
_sessions: "weakref.WeakSet[SessionBase]" = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for session in list(_sessions):
        try:
            session._forked()
        except (RuntimeError, OSError) as e:  # e.g. waiters on a closed loop
            log.warning("palisade session %s in a forked child: %s", session.id, e)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
