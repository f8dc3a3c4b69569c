"""A forked child (os.fork, multiprocessing's fork) against the fake agent: it does not
deadlock on a lock another thread held at the fork, and it does not believe its
parent's grants, which belong to the parent's session (no agent needed)."""

from __future__ import annotations

import asyncio
import os
import signal
import stat
import sys
import threading
import time
import traceback

import pytest

from palisade import LeaseLost, Session, _api, aio, lease

pytestmark = [
    pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork"),
    # Forking a process with threads is what these tests are about.
    pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning"),
]


def in_child(body, timeout: float = 10.0):
    """Run ``body()`` in a forked child: its exit status (0: it returned), or None when
    it did not finish within ``timeout`` seconds (killed)."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            body()
            code = 0
        except BaseException:
            traceback.print_exc()
            sys.stderr.flush()
        finally:
            os._exit(code)
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.02)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return None


def is_socket(fd: int) -> bool:
    try:
        return stat.S_ISSOCK(os.fstat(fd).st_mode)
    except OSError:
        return False


def test_a_fork_during_default_session_does_not_deadlock_the_child(fake_agent, monkeypatch):
    monkeypatch.setenv(_api.SOCKET_ENV, fake_agent.path)
    fake_agent.create_delay = 1.0  # the default session's lock is held that long
    opener = threading.Thread(target=lease.default_session, daemon=True)
    opener.start()
    time.sleep(0.3)
    try:

        def child():
            session = lease.default_session()
            assert not session.ended
            assert lease.acquire("c").held

        assert in_child(child) == 0, "the child deadlocked (or failed: see its traceback)"
    finally:
        opener.join(5)
        lease.close_default_session()


def test_a_forked_child_does_not_believe_its_parents_grants(fake_agent):
    with Session(socket_path=fake_agent.path, keepalive_ms=10_000) as session:
        grant = session.acquire("a")
        # Another thread holds the session's and the grant's locks at the fork.
        held, done = threading.Event(), threading.Event()

        def hold_locks():
            with session._lock, grant._lock:
                held.set()
                done.wait(5)

        holder = threading.Thread(target=hold_locks, daemon=True)
        holder.start()
        held.wait(5)
        stream = session._stream._sock.fileno()

        def child():
            # Its copy of the event stream would keep the stream open after the parent died.
            assert not is_socket(stream)
            assert not grant.held and grant.lost and grant.lost_reason == "SessionEnded"
            assert grant.wait_lost(0)
            assert session.ended
            with pytest.raises(LeaseLost):
                grant.check()
            grant.release()  # the parent's: nothing to do here
            session.close()
            with pytest.raises(LeaseLost):
                session.acquire("b")

        try:
            assert in_child(child) == 0, "the child believed its parent's grant, or deadlocked"
        finally:
            done.set()
            holder.join(5)
        # The parent's session and grant are untouched: the child sent nothing.
        assert grant.wait_lost(0.5) is False and grant.held and not session.ended
        assert not [r for r in fake_agent.requests if r[1] == "DELETE"]


def test_a_forked_child_does_not_believe_its_parents_grants_asyncio(fake_agent):
    async def main():
        # Sessions that ended before the fork (still referenced) are no matter to it.
        ended = [await aio.Session(socket_path=fake_agent.path).open() for _ in range(3)]
        for other in ended:
            await other.close()
        async with aio.Session(socket_path=fake_agent.path, keepalive_ms=10_000) as session:
            grant = await session.acquire("a")
            stream = session._writer.get_extra_info("socket").fileno()

            def child():
                assert not is_socket(stream)
                assert not grant.held and grant.is_lost and grant.lost_reason == "SessionEnded"
                assert session.ended

            assert in_child(child) == 0, "the child believed its parent's grant"
            await asyncio.sleep(0.5)
            assert grant.held and not session.ended
            mine = f"/v1/sessions/{session.id}"
            assert not [r for r in fake_agent.requests if r[1] == "DELETE" and r[2].startswith(mine)]

    asyncio.run(asyncio.wait_for(main(), 30))
