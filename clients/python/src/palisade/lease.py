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
_default_pid = 0


def default_session() -> Session:
    """The process's session with the agent, opened on first use (and again after it
    ended, or in a forked child, whose parent's threads did not come along)."""
    global _default, _default_pid
    with _lock:
        if _default is None or _default.ended or _default_pid != os.getpid():
            _default = Session()
            _default_pid = os.getpid()
        return _default


def close_default_session() -> None:
    """End the default session (releasing its Leases); also done at exit."""
    global _default
    with _lock:
        session, _default = _default, None
    if session is not None and _default_pid == os.getpid():
        session.close()


atexit.register(close_default_session)


def acquire(
    name: str,
    *,
    namespace: Optional[str] = None,
    duration_seconds: Optional[int] = None,
    holder_identity: Optional[str] = None,
    timeout: Optional[float] = None,
) -> Grant:
    """``default_session().acquire(...)``: see ``Session.acquire``. The Grant is a
    context manager that releases the Lease on exit."""
    return default_session().acquire(
        name,
        namespace=namespace,
        duration_seconds=duration_seconds,
        holder_identity=holder_identity,
        timeout=timeout,
    )
