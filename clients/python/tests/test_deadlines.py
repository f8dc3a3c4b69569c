"""Local deadlines and releases of both clients, against the fake agent (no agent
needed): a grant is held only until the time its last answer said, counted from when
that request was sent, whatever the agent, the keepalive or the event loop do."""

from __future__ import annotations

import asyncio
import time

import pytest

from palisade import AgentError, LeaseLost, Session, aio

# The fake's Leases: 1 s, validForMs 600 in every answer; the session's keepalive is
# far longer, so only the grant's deadline can end it in time.
KEEPALIVE_MS = 10_000
LEASE_PATH = "/v1/sessions/s1/leases/ns/a"


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 30))


def test_a_frozen_agent_loses_the_grant_at_its_local_deadline(fake_agent):
    with Session(socket_path=fake_agent.path, keepalive_ms=KEEPALIVE_MS) as session:
        grant = session.acquire("a")
        assert grant.held
        frozen = time.monotonic()
        fake_agent.freeze()
        assert grant.wait_lost(3), "still held 3 s after the agent froze (validForMs was 600)"
        assert time.monotonic() - frozen < 1.5
        assert not grant.held and grant.lost and grant.lost_reason == "LocalDeadline"
        with pytest.raises(LeaseLost) as lost:
            grant.check()
        assert lost.value.reason == "LocalDeadline"
        # The agent wakes and answers "held" again: a lost grant never comes back, and
        # it is released so that the agent stops renewing it.
        fake_agent.thaw()
        assert fake_agent.wait_for("DELETE", LEASE_PATH, 5), "the lapsed grant was not released"
        time.sleep(0.5)
        assert not grant.held and grant.lost_reason == "LocalDeadline"


def test_a_healthy_agent_refreshes_the_deadline_in_time(fake_agent):
    # validForMs just above a third of the duration: the least a renewing agent answers.
    fake_agent.valid_for_ms = 350
    with Session(socket_path=fake_agent.path, keepalive_ms=KEEPALIVE_MS) as session:
        grant = session.acquire("a")
        start = time.monotonic()
        assert grant.wait_lost(2) is False, f"lost: {grant.lost_reason}"
        assert grant.held
        # A refresh (GET of the session, a keepalive too) every sixth of the duration.
        assert fake_agent.seen("GET", "/v1/sessions/s1", start) >= 8
        assert fake_agent.seen("POST", "/v1/sessions/s1/keepalive") == 0
        assert 0 < grant.check() <= 0.35


def test_a_grant_that_was_long_in_coming_is_held(fake_agent):
    # The acquire is answered long after it was sent (a long poll): counting its
    # validForMs from then would find the grant lost at once.
    fake_agent.acquire_delay = 0.8
    with Session(socket_path=fake_agent.path, keepalive_ms=KEEPALIVE_MS) as session:
        grant = session.acquire("a")
        assert grant.held and grant.wait_lost(0.5) is False

    async def main():
        async with aio.Session(socket_path=fake_agent.path, keepalive_ms=KEEPALIVE_MS) as session:
            grant = await session.acquire("b")
            assert grant.held and await grant.wait_lost(0.5) is False

    run(main())


@pytest.mark.parametrize("answer", [503, None], ids=["503", "dropped"])
def test_a_failed_release_never_reports_held_again(fake_agent, answer):
    fake_agent.release_answer = answer
    with Session(socket_path=fake_agent.path, keepalive_ms=KEEPALIVE_MS) as session:
        grant = session.acquire("a")
        with pytest.raises(AgentError):
            grant.release()
        assert not grant.held and grant.released and not grant.lost
        time.sleep(0.5)  # refreshes answer "held" all along
        assert not grant.held
        assert grant.wait_lost(0) is False
        grant.release()  # nothing to do
        assert fake_agent.seen("DELETE", LEASE_PATH) == 1


def test_asyncio_frozen_agent_loses_the_grant_at_its_local_deadline(fake_agent):
    async def main():
        async with aio.Session(socket_path=fake_agent.path, keepalive_ms=KEEPALIVE_MS) as session:
            grant = await session.acquire("a")
            assert grant.held
            frozen = time.monotonic()
            fake_agent.freeze()
            assert await asyncio.wait_for(grant.wait_lost(), 3) and grant.lost_reason == "LocalDeadline"
            assert time.monotonic() - frozen < 1.5
            assert not grant.held and grant.is_lost
            fake_agent.thaw()
            await asyncio.sleep(0.5)
            assert not grant.held

    run(main())
    assert fake_agent.wait_for("DELETE", LEASE_PATH, 5), "the lapsed grant was not released"


def test_asyncio_held_reads_the_clock_when_the_loop_is_blocked(fake_agent):
    async def main():
        async with aio.Session(socket_path=fake_agent.path, keepalive_ms=KEEPALIVE_MS) as session:
            grant = await session.acquire("a")
            await asyncio.sleep(0.3)
            assert grant.held
            time.sleep(0.8)  # the application blocks the loop past validForMs
            assert not grant.held, "held after its deadline, because the loop was blocked"
            assert grant.is_lost and grant.lost_reason == "LocalDeadline"
            await asyncio.sleep(0.5)  # the answers that waited come in: still lost
            assert not grant.held and await grant.wait_lost() and grant.lost_reason == "LocalDeadline"
            assert fake_agent.seen("DELETE", LEASE_PATH) == 1, "the lapsed grant was not released"

    run(main())


@pytest.mark.parametrize("answer", [503, None], ids=["503", "dropped"])
def test_asyncio_failed_release_never_reports_held_again(fake_agent, answer):
    fake_agent.release_answer = answer

    async def main():
        async with aio.Session(socket_path=fake_agent.path, keepalive_ms=KEEPALIVE_MS) as session:
            grant = await session.acquire("a")
            with pytest.raises(AgentError):
                await grant.release()
            assert not grant.held and grant.released and not grant.is_lost
            await asyncio.sleep(0.5)
            assert not grant.held
            await grant.release()
            assert fake_agent.seen("DELETE", LEASE_PATH) == 1

    run(main())


def test_both_clients_have_is_lost_and_wait_lost(fake_agent):
    with Session(socket_path=fake_agent.path, keepalive_ms=KEEPALIVE_MS) as session:
        grant = session.acquire("a")
        assert grant.is_lost is False and grant.wait_lost(0.1) is False
        fake_agent.freeze()
        assert grant.wait_lost(3) and grant.is_lost
        fake_agent.thaw()

    async def main():
        async with aio.Session(socket_path=fake_agent.path, keepalive_ms=KEEPALIVE_MS) as session:
            grant = await session.acquire("b")
            assert grant.is_lost is False and await grant.wait_lost(0.1) is False
            fake_agent.freeze()
            assert await grant.wait_lost(3) and grant.is_lost
            fake_agent.thaw()

    run(main())
