"""``lease.acquire``: Leases through the process-wide default session.

    from palisade import lease

    with lease.acquire("billing") as grant:
        write(grant.token)
"""

from __future__ import annotations

import atexit
import os
import threading
from typing import Optional

from .session import Grant, Session

__all__ = ["acquire", "default_session", "close_default_session"]

_lock = threading.Lock()
_default: Optional[Session] = None


def default_session() -> Session:
    """The process's session with the agent, opened on first use (and again after it
    ended, or in a forked child: the parent's is the parent's)."""
    global _default
    with _lock:
        if _default is None or _default.ended:
            _default = Session()
        return _default


def close_default_session() -> None:
    """End the default session (releasing its Leases); also done at exit."""
    global _default
    with _lock:
        session, _default = _default, None
    if session is not None:
        session.close()


def _after_fork_in_child() -> None:
    global _lock, _default
    # Another thread of the parent may have held the lock (opening the session): it
    # would never be released in the child.
    _lock = threading.Lock()
    _default = None


atexit.register(close_default_session)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def acquire(
    name: str,
    *,
    namespace: Optional[str] = None,
    duration_seconds: Optional[int] = None,
    holder_identity: Optional[str] = None,
    timeout: Optional[float] = None,
    session: Optional[Session] = None,
    slot: Optional[int] = None,
) -> Grant:
    """``(session or default_session()).acquire(...)``: see ``Session.acquire``. The
    Grant is a context manager that releases the Lease on exit; ``aio.acquire`` is
    this for asyncio."""
    return (session or default_session()).acquire(
        name,
        namespace=namespace,
        duration_seconds=duration_seconds,
        holder_identity=holder_identity,
        timeout=timeout,
        slot=slot,
    )
