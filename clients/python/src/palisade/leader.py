"""Leader election in the style of client-go's ``leaderelection.RunOrDie``.

    def lead(token, stop):
        while not stop.is_set():
            reconcile(token)          # every write carries the token
            stop.wait(1)

    reason = leader.run("my-controller", on_started_leading=lead,
                        on_stopped_leading=lambda: print("not leading"))

``run`` waits for the Lease, calls ``on_started_leading(token, stop)`` while it is
held, and sets ``stop`` the moment the grant is lost. Leadership ends when the
callback returns (then the Lease is released for the next candidate) or when the
grant is lost; then ``on_stopped_leading()`` is called and ``run`` returns the loss
reason (None after a release). Like RunOrDie, it leads once: to stand again, call
it again (or let the process exit and be restarted).

Python cannot stop a thread from outside: the callback must return soon after
``stop`` is set, and until then its writes are refused by the fence, which is
what the token is for.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
from typing import Any, Awaitable, Callable, Optional

from . import aio
from .lease import default_session
from .session import Session

__all__ = ["run", "run_async"]


def run(
    lease: str,
    on_started_leading: Callable[[int, threading.Event], Any],
    on_stopped_leading: Optional[Callable[[], Any]] = None,
    *,
    namespace: Optional[str] = None,
    duration_seconds: Optional[int] = None,
    session: Optional[Session] = None,
) -> Optional[str]:
    """Lead while holding ``lease`` (blocking); see the module's doc."""
    grant = (session or default_session()).acquire(
        lease, namespace=namespace, duration_seconds=duration_seconds
    )
    stop = threading.Event()

    def watch() -> None:
        grant.wait_lost()  # returns on release too
        stop.set()

    threading.Thread(target=watch, name=f"palisade-leader-{lease}", daemon=True).start()
    try:
        on_started_leading(grant.token, stop)
    finally:
        stop.set()
        try:
            grant.release()
        finally:
            if on_stopped_leading is not None:
                on_stopped_leading()
    return grant.lost_reason


async def run_async(
    lease: str,
    on_started_leading: Callable[[int, asyncio.Event], Awaitable[Any]],
    on_stopped_leading: Optional[Callable[[], Any]] = None,
    *,
    namespace: Optional[str] = None,
    duration_seconds: Optional[int] = None,
    session: Optional[aio.Session] = None,
) -> Optional[str]:
    """``run`` for asyncio: ``on_started_leading`` is a coroutine function, cancelled
    (after ``stop`` is set) when the grant is lost; ``on_stopped_leading`` may be a
    plain or a coroutine function."""
    grant = await aio.acquire(
        lease, namespace=namespace, duration_seconds=duration_seconds, session=session
    )
    stop = asyncio.Event()
    leading = asyncio.ensure_future(on_started_leading(grant.token, stop))
    lost = asyncio.ensure_future(grant.wait_lost())
    try:
        await asyncio.wait({leading, lost}, return_when=asyncio.FIRST_COMPLETED)
        if leading.done():
            leading.result()  # its exception, if it raised
    finally:
        stop.set()
        for task in (leading, lost):
            task.cancel()
        await asyncio.gather(leading, lost, return_exceptions=True)
        try:
            await grant.release()
        finally:
            if on_stopped_leading is not None:
                result = on_stopped_leading()
                if inspect.isawaitable(result):
                    await result
    return grant.lost_reason
