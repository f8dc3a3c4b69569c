"""The sans-I/O core (palisade._core) driven by hand, and the two shells around it
keeping the same surface (no agent needed)."""

from __future__ import annotations

import inspect
import json
import threading
import time

import pytest

import palisade
from palisade import _api, _core, aio, lease
from palisade._core import Call, Shield, Wait


class Bare(_core.SessionBase):
    """A session without a shell: the test performs its flows' operations."""

    def __init__(self, keepalive_ms: int = 3000) -> None:
        super().__init__(None, "http://127.0.0.1:1", None, None)
        self.id, self.keepalive_ms = "s1", keepalive_ms
        self._wake = threading.Event()
        self.later = []

    def _event(self):
        return threading.Event()

    def _notify(self, event):
        event.set()

    def _release_later(self, grant):
        self.later.append(grant)

    def _close_stream(self):
        pass

    def _drop_stream(self):
        pass


def grant_doc(state="held", token=7, valid_for_ms=600, duration=1):
    return {"name": "a", "namespace": "ns", "state": state, "token": token, "validForMs": valid_for_ms,
            "durationSeconds": duration}


def answer(doc, status=200):
    return status, json.dumps(doc).encode()


def public(cls):
    return {n for n in dir(cls) if not n.startswith("_")}


def test_both_flavours_have_the_same_surface():
    assert public(palisade.Grant) == public(aio.Grant)
    assert public(palisade.Session) == public(aio.Session) - {"open"}, "aio opens with await open()"
    for sync, asynchronous in ((palisade.Grant, aio.Grant), (palisade.Session, aio.Session)):
        for name in public(sync):
            a, b = inspect.getattr_static(sync, name), inspect.getattr_static(asynchronous, name)
            assert type(a) is type(b), f"{name}: {type(a).__name__} in one, {type(b).__name__} in the other"
            if inspect.isfunction(a):
                assert not inspect.iscoroutinefunction(a) and inspect.iscoroutinefunction(b), name
                assert inspect.signature(a) == inspect.signature(b), name
    for name in ("acquire", "default_session", "close_default_session"):
        assert list(inspect.signature(getattr(lease, name)).parameters) == list(
            inspect.signature(getattr(aio, name)).parameters
        ), name


def test_an_interrupted_acquire_leaves_the_queue_without_io():
    session = Bare()
    flow = session._acquire_flow("a", None, None, None, None)
    first = next(flow)
    assert isinstance(first, Call) and first.endpoint == _api.ACQUIRE and first.body["name"] == "a"
    # Interrupted before the answer: the claim may have been made.
    cleanup = flow.throw(KeyboardInterrupt())
    assert isinstance(cleanup, Shield)
    get = next(cleanup.flow)
    assert get.endpoint == _api.GET_SESSION
    release = cleanup.flow.send(answer({"id": "s1", "keepaliveMs": 3000, "grants": [grant_doc("waiting", None)]}))
    assert (release.endpoint, release.target) == (_api.RELEASE, "/v1/sessions/s1/leases/ns/a")
    with pytest.raises(StopIteration):
        cleanup.flow.send(answer(grant_doc("released")))
    with pytest.raises(KeyboardInterrupt):
        flow.send(None)


def test_the_local_deadline_ends_a_grant_for_good():
    session = Bare()
    sent = time.monotonic()
    grant = session._register(_api.parse_grant(grant_doc(valid_for_ms=100)), sent)
    assert grant.held and not grant.is_lost
    # An answer to a request sent earlier than the last says nothing new.
    grant._update(sent - 1, _api.parse_grant(grant_doc(valid_for_ms=60_000)))
    assert grant._deadline == sent + 0.1
    time.sleep(0.12)
    assert not grant.held and grant.is_lost and grant.lost_reason == "LocalDeadline"
    assert session.later == [grant], "released in the background"
    grant._update(time.monotonic(), _api.parse_grant(grant_doc(valid_for_ms=60_000)))
    assert grant.lost and grant.lost_reason == "LocalDeadline" and session.later == [grant]


def test_the_keepalive_refreshes_every_sixth_of_the_shortest_duration():
    session = Bare(keepalive_ms=3000)
    now = time.monotonic()
    grant = session._register(_api.parse_grant(grant_doc(valid_for_ms=600, duration=1)), now)
    flow = session._keepalive_flow(now - 1)  # the last keepalive a second ago: one is due
    get = next(flow)
    assert isinstance(get, Call) and get.endpoint == _api.GET_SESSION
    assert get.timeout == pytest.approx(1 / 6, abs=0.01), "an answer after the interval comes too late"
    sent = time.monotonic()
    wait = flow.send(answer({"id": "s1", "keepaliveMs": 3000, "grants": [grant_doc(valid_for_ms=600)]}))
    assert grant._deadline == pytest.approx(sent + 0.6, abs=0.05), "counted from the GET's send"
    assert isinstance(wait, Wait) and wait.seconds == pytest.approx(1 / 6, abs=0.02)
    flow.close()
