"""Semaphores through both clients, against the fake agent (no agent needed): the
acquire's ``slot``, checked before any request, and the grant's ``slot`` and
``fence_key`` as the agent gives them (or a lock's, from an agent before semaphores)."""

from __future__ import annotations

import asyncio

import pytest

from palisade import Session, aio

KEEPALIVE_MS = 10_000


def test_a_grant_of_one_slot_names_it_and_its_fence_key(fake_agent):
    fake_agent.duration_seconds = 15
    fake_agent.valid_for_ms = 10_000
    with Session(socket_path=fake_agent.path, keepalive_ms=KEEPALIVE_MS) as session:
        grant = session.acquire("workers", slot=2)
        assert (grant.slot, grant.fence_key) == (2, "ns/workers#2")
        assert "slot=2" in repr(grant)
        lock = session.acquire("billing")
        assert (lock.slot, lock.fence_key) == (0, "ns/billing")
    assert fake_agent.acquires[0]["slot"] == 2
    assert "slot" not in fake_agent.acquires[1], "any slot sends none"


def test_a_bad_slot_is_refused_before_any_request(fake_agent):
    with Session(socket_path=fake_agent.path, keepalive_ms=KEEPALIVE_MS) as session:
        with pytest.raises(ValueError, match="slot must be within 0..63"):
            session.acquire("workers", slot=64)
        with pytest.raises(TypeError, match="slot must be an int"):
            session.acquire("workers", slot="1")
    assert fake_agent.acquires == []


def test_an_agent_before_semaphores_grants_slot_0_with_a_locks_key(fake_agent):
    fake_agent.slots = False
    fake_agent.duration_seconds = 15
    fake_agent.valid_for_ms = 10_000
    with Session(socket_path=fake_agent.path, keepalive_ms=KEEPALIVE_MS) as session:
        grant = session.acquire("old")
        assert (grant.slot, grant.fence_key) == (0, "ns/old")


def test_asyncio_slots(fake_agent):
    fake_agent.duration_seconds = 15
    fake_agent.valid_for_ms = 10_000

    async def main():
        async with aio.Session(socket_path=fake_agent.path, keepalive_ms=KEEPALIVE_MS) as session:
            async with aio.acquire("workers", slot=1, session=session) as grant:
                assert (grant.slot, grant.fence_key) == (1, "ns/workers#1")
            with pytest.raises(ValueError, match="slot must be within 0..63"):
                await session.acquire("workers", slot=-1)

    asyncio.run(asyncio.wait_for(main(), 30))
    assert [a.get("slot") for a in fake_agent.acquires] == [1]
