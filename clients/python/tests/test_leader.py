"""Leader election on a Lease, against the real agent (PALISADE_AGENT_SOCKET)."""

from __future__ import annotations

import asyncio
import threading

import pytest

from palisade import Session, _api, _transport, aio, leader

pytestmark = [pytest.mark.agent, pytest.mark.usefixtures("agent_socket")]


def test_one_leader_at_a_time_and_the_next_leads_with_a_higher_token(lease_name):
    events = []
    lock = threading.Lock()
    leading = threading.Semaphore(0)

    def candidate(tag: str, session: Session):
        def lead(token, stop):
            with lock:
                events.append(("start", tag, token))
            leading.release()
            stop.wait(1.0)  # lead for a second, then step down
            with lock:
                events.append(("end", tag, token))

        def stopped():
            with lock:
                events.append(("stopped", tag, None))

        return leader.run(lease_name, lead, stopped, duration_seconds=15, session=session)

    with Session() as a, Session() as b:
        results = {}
        threads = [
            threading.Thread(target=lambda t=t, s=s: results.__setitem__(t, candidate(t, s)), daemon=True)
            for t, s in (("a", a), ("b", b))
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert not any(t.is_alive() for t in threads), f"a candidate never returned: {events}"
    assert results == {"a": None, "b": None}, "both stepped down; neither lost"
    # Strictly one after the other: start, end, stopped, then the other's start.
    kinds = [e[0] for e in events]
    assert kinds == ["start", "end", "stopped", "start", "end", "stopped"], events
    assert events[0][1] != events[3][1]
    assert events[3][2] > events[0][2], "the second leader's token is higher"


def test_losing_the_lease_stops_the_leader(lease_name):
    session = Session()
    seen = {}

    def lead(token, stop):
        seen["token"] = token
        # The session ends under the leader, as when the agent drops it.
        status, _ = _transport.request(
            session.address, _api.END_SESSION, _api.END_SESSION.target(session=session.id), timeout=15
        )
        assert status == 204
        seen["stopped"] = stop.wait(10)

    stopped = threading.Event()
    reason = leader.run(lease_name, lead, stopped.set, duration_seconds=15, session=session)
    assert seen["stopped"], "stop was not set when the grant was lost"
    assert reason == "SessionEnded"
    assert stopped.is_set()
    session.close()


def test_an_exception_in_the_leader_releases_and_propagates(lease_name):
    with Session() as session:
        def lead(token, stop):
            raise RuntimeError("reconcile failed")

        with pytest.raises(RuntimeError, match="reconcile failed"):
            leader.run(lease_name, lead, duration_seconds=15, session=session)
        # Released: acquirable again at once by the same session.
        assert session.acquire(lease_name, timeout=5).token > 0


def test_async_leader_is_cancelled_on_loss(lease_name):
    async def main():
        session = await aio.Session().open()
        seen = {}

        async def lead(token, stop):
            seen["token"] = token
            try:
                # The loss may be seen before the DELETE's answer comes back.
                await aio._request(
                    session.address, _api.END_SESSION, _api.END_SESSION.target(session=session.id), timeout=15
                )
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                seen["cancelled"] = stop.is_set()
                raise

        async def stopped():
            seen["stopped"] = True

        reason = await leader.run_async(lease_name, lead, stopped, duration_seconds=15, session=session)
        assert reason == "SessionEnded"
        assert seen == {"token": seen["token"], "cancelled": True, "stopped": True}
        await session.close()

    asyncio.run(asyncio.wait_for(main(), 60))


def test_async_leader_that_returns_releases(lease_name):
    async def main():
        async with aio.Session() as session:
            async def lead(token, stop):
                return None

            assert await leader.run_async(lease_name, lead, duration_seconds=15, session=session) is None
            assert (await session.acquire(lease_name, timeout=5)).token > 0

    asyncio.run(asyncio.wait_for(main(), 60))
