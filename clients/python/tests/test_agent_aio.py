"""The asyncio client against the real agent (PALISADE_AGENT_SOCKET)."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from palisade import AgentError, LeaseLost, _api, aio

pytestmark = [pytest.mark.agent, pytest.mark.usefixtures("agent_socket")]

DURATION = 15
HANDOVER = 5.0


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 60))


async def end_session_out_of_band(session: aio.Session) -> None:
    status, body = await aio._request(
        session.address, _api.END_SESSION, _api.END_SESSION.target(session=session.id), timeout=15
    )
    assert status == 204, body


def test_async_with_acquire_gives_a_token_and_releases(lease_name):
    async def main():
        async with aio.acquire(lease_name, duration_seconds=DURATION, timeout=30) as grant:
            assert grant.token > 0 and grant.held
            assert 0 < await grant.check() <= DURATION * 2 / 3
            first = grant.token
        assert grant.released and not grant.is_lost
        assert await grant.wait_lost() is False and grant.lost_reason is None, "a released grant was not lost"
        with pytest.raises(LeaseLost):
            await grant.check()
        # Released on exit: a new session gets it at once, with a higher token.
        async with aio.Session() as other:
            again = await aio.acquire(lease_name, timeout=HANDOVER, session=other)
            assert again.token > first
        await aio.close_default_session()

    run(main())


def test_no_threads_are_started(lease_name):
    async def main():
        before = threading.active_count()
        async with aio.Session(keepalive_ms=1000) as session:
            grant = await session.acquire(lease_name, duration_seconds=DURATION, timeout=30)
            # A keepalive every third of a second keeps the session; no thread does it.
            await asyncio.sleep(3.5)
            assert grant.held, f"lost: {grant.lost_reason} {grant.lost_message}"
            assert 0 < await grant.check() <= 1.0
            assert threading.active_count() == before

    run(main())


def test_two_sessions_exclude_each_other(lease_name):
    async def main():
        async with aio.Session() as a, aio.Session() as b:
            first = await a.acquire(lease_name, duration_seconds=DURATION, timeout=30)
            with pytest.raises(TimeoutError):
                await b.acquire(lease_name, timeout=1)
            waiting = asyncio.ensure_future(b.acquire(lease_name))
            await asyncio.sleep(2)
            assert not waiting.done(), "b was granted the Lease a holds"
            released_at = time.monotonic()
            await first.release()
            second = await asyncio.wait_for(waiting, HANDOVER + 10)
            assert time.monotonic() - released_at < HANDOVER
            assert second.token > first.token

    run(main())


def test_a_cancelled_acquire_leaves_the_queue(lease_name):
    async def main():
        async with aio.Session() as a, aio.Session() as b, aio.Session() as c:
            held = await a.acquire(lease_name, duration_seconds=DURATION, timeout=30)
            cancelled = asyncio.ensure_future(b.acquire(lease_name))
            await asyncio.sleep(1)
            cancelled.cancel()
            with pytest.raises(asyncio.CancelledError):
                await cancelled
            waiting = asyncio.ensure_future(c.acquire(lease_name))
            await asyncio.sleep(0.5)
            await held.release()
            # Had b stayed in the queue, it would be granted first and hold it up.
            third = await asyncio.wait_for(waiting, HANDOVER + 10)
            assert third.token > held.token

    run(main())


def test_loss_is_reported_when_the_session_ends(lease_name):
    async def main():
        session = await aio.Session().open()
        grant = await session.acquire(lease_name, duration_seconds=DURATION, timeout=30)
        await end_session_out_of_band(session)
        assert await asyncio.wait_for(grant.wait_lost(), 10)
        reason = grant.lost_reason
        assert reason == "SessionEnded" and grant.is_lost
        assert session.ended
        with pytest.raises(LeaseLost):
            await grant.check()
        await session.close()
        async with aio.Session() as other:
            assert (await other.acquire(lease_name, timeout=HANDOVER)).token > grant.token

    run(main())


def test_bad_input_names_the_field():
    async def main():
        async with aio.Session() as session:
            with pytest.raises(AgentError) as bad:
                await session.acquire("Not_A_Lease_Name", timeout=5)
            assert (bad.value.status, bad.value.code, bad.value.field) == (400, "invalid_field", "name")

    run(main())
