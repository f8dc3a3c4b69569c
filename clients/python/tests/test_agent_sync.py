"""The blocking client against the real agent (PALISADE_AGENT_SOCKET)."""

from __future__ import annotations

import signal
import threading
import time

import pytest

from palisade import AgentError, LeaseLost, Session, _api, _transport, lease

pytestmark = [pytest.mark.agent, pytest.mark.usefixtures("agent_socket")]

# A Lease of 15 s hands on by expiry only after 15 s: a handover faster than this
# was a release.
DURATION = 15
HANDOVER = 5.0


def end_session_out_of_band(session: Session) -> None:
    """What the agent does when it ends a session on its own: the session is gone."""
    status, body = _transport.request(
        session.address, _api.END_SESSION, _api.END_SESSION.target(session=session.id), timeout=15
    )
    assert status == 204, body


def acquire_in_thread(session: Session, name: str):
    result = {}

    def run():
        try:
            result["grant"] = session.acquire(name, duration_seconds=DURATION)
        except BaseException as e:  # reported by the test
            result["error"] = e
        result["at"] = time.monotonic()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, result


def test_acquire_gives_a_token_and_check_counts_down(lease_name):
    with Session(name="pytest") as session:
        grant = session.acquire(lease_name, duration_seconds=DURATION, timeout=30)
        assert isinstance(grant.token, int) and grant.token > 0
        assert grant.name == lease_name and grant.namespace
        assert grant.held and not grant.lost and grant.lost_reason is None
        assert grant.duration_seconds == DURATION
        valid = grant.check()
        # At most two thirds of the duration (the local deadline) and the keepalive.
        assert 0 < valid <= DURATION * 2 / 3
        assert grant.wait_lost(0.2) is False, "a held grant is not lost"
        grant.release()
        assert grant.released and not grant.lost
        with pytest.raises(LeaseLost) as lost:
            grant.check()
        assert lost.value.reason == "Released"
        grant.release()  # again: nothing to do


def test_keepalives_keep_a_short_session_alive(lease_name):
    # keepaliveMs 1000: without the background keepalive the agent would end the
    # session (and the grant) after a second.
    with Session(keepalive_ms=1000) as session:
        grant = session.acquire(lease_name, duration_seconds=DURATION, timeout=30)
        assert grant.wait_lost(3.5) is False, f"lost: {grant.lost_reason} {grant.lost_message}"
        assert 0 < grant.check() <= 1.0, "validForMs is bounded by the session's keepalive"
        assert not session.ended


def test_default_session_and_context_manager(lease_name):
    with lease.acquire(lease_name, duration_seconds=DURATION, timeout=30) as grant:
        assert grant.token > 0
        assert grant.check() > 0
        first = grant.token
    assert grant.released
    # Released on exit: another session gets it at once, with a higher token.
    with Session() as other:
        started = time.monotonic()
        again = other.acquire(lease_name, timeout=HANDOVER)
        assert again.token > first
        assert time.monotonic() - started < HANDOVER


def test_released_on_an_exception_too(lease_name):
    with pytest.raises(RuntimeError, match="boom"):
        with lease.acquire(lease_name, duration_seconds=DURATION, timeout=30) as grant:
            raise RuntimeError("boom")
    assert grant.released


def test_two_sessions_exclude_each_other_and_tokens_increase(lease_name):
    with Session() as a, Session() as b:
        first = a.acquire(lease_name, duration_seconds=DURATION, timeout=30)
        with pytest.raises(TimeoutError):
            b.acquire(lease_name, timeout=1)
        thread, result = acquire_in_thread(b, lease_name)
        thread.join(2)
        assert thread.is_alive(), f"b was granted the Lease a holds: {result}"
        assert first.check() > 0, "a still holds it"
        released_at = time.monotonic()
        first.release()
        thread.join(HANDOVER + 10)
        assert "grant" in result, f"b not granted after a released: {result.get('error')}"
        second = result["grant"]
        assert second.token > first.token
        assert result["at"] - released_at < HANDOVER, "the release handed the Lease over at once"
        assert second.check() > 0
        # ... and back: a third grant, higher again.
        second.release()
        third = a.acquire(lease_name, timeout=HANDOVER)
        assert third.token > second.token


def test_a_timed_out_acquire_leaves_the_queue(lease_name):
    with Session() as a, Session() as b, Session() as c:
        held = a.acquire(lease_name, duration_seconds=DURATION, timeout=30)
        with pytest.raises(TimeoutError):
            b.acquire(lease_name, timeout=0.5)
        thread, result = acquire_in_thread(c, lease_name)
        time.sleep(0.5)
        held.release()
        # Had b stayed in the queue, it would be granted first and hold it up.
        thread.join(HANDOVER + 10)
        assert "grant" in result, f"c not granted: {result.get('error')}"
        assert result["grant"].token > held.token


def test_loss_is_reported_when_the_session_ends(lease_name):
    session = Session()
    grant = session.acquire(lease_name, duration_seconds=DURATION, timeout=30)
    end_session_out_of_band(session)
    assert grant.wait_lost(10), "no loss reported within 10 s of the session's end"
    assert grant.lost and grant.lost_reason == "SessionEnded"
    assert session.ended and session.end_reason == "SessionEnded"
    with pytest.raises(LeaseLost) as lost:
        grant.check()
    assert lost.value.reason == "SessionEnded"
    with pytest.raises(LeaseLost):
        session.acquire(lease_name)
    grant.release()  # nothing held: does nothing
    session.close()
    # The agent released the Lease with the session.
    with Session() as other:
        assert other.acquire(lease_name, timeout=HANDOVER).token > grant.token


def test_closing_the_session_releases_its_grants(lease_name):
    session = Session()
    grant = session.acquire(lease_name, duration_seconds=DURATION, timeout=30)
    session.close()
    assert grant.released and not grant.lost
    assert grant.wait_lost(0) is False
    with Session() as other:
        assert other.acquire(lease_name, timeout=HANDOVER).token > grant.token


def test_bad_input_names_the_field(lease_name):
    with Session() as session:
        with pytest.raises(AgentError) as bad:
            session.acquire("Not_A_Lease_Name", timeout=5)
        assert (bad.value.status, bad.value.code, bad.value.field) == (400, "invalid_field", "name")
        assert bad.value.message
        with pytest.raises(AgentError) as bad:
            session.acquire(lease_name, namespace="no_such_namespace!", timeout=5)
        assert bad.value.field == "namespace"
        # A name the client sends as the agent got it (no client-side rules to drift).
        with pytest.raises(AgentError) as bad:
            session.acquire("x" * 300, timeout=5)
        assert bad.value.field == "name"
        assert not session.ended, "a refused request does not end the session"


def test_a_second_acquire_of_a_held_lease_is_refused(lease_name):
    with Session() as session:
        session.acquire(lease_name, duration_seconds=DURATION, timeout=30)
        with pytest.raises(AgentError) as twice:
            session.acquire(lease_name, timeout=5)
        assert (twice.value.status, twice.value.code) == (409, "already_acquired")


def test_bad_session_options_are_the_agents_or_the_clients(agent_socket):
    with pytest.raises(ValueError, match="keepalive_ms"):
        Session(keepalive_ms=10)


class Interrupted(Exception):
    pass


def test_an_interrupted_acquire_leaves_the_queue(lease_name):
    # Like Ctrl-C while the first request waits for the grant: the claim it made
    # before any answer must not stay in the queue.
    def interrupt(signum, frame):
        raise Interrupted()

    with Session() as a, Session() as b, Session() as c:
        held = a.acquire(lease_name, duration_seconds=DURATION, timeout=30)
        previous = signal.signal(signal.SIGALRM, interrupt)
        try:
            signal.setitimer(signal.ITIMER_REAL, 1.0)
            with pytest.raises(Interrupted):
                b.acquire(lease_name)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
        thread, result = acquire_in_thread(c, lease_name)
        time.sleep(0.5)
        held.release()
        thread.join(HANDOVER + 10)
        assert "grant" in result, f"c not granted: {result.get('error')}"
        assert result["grant"].token > held.token
