"""palisade: fenced Leases through the pod's ``palisade agent``.

    from palisade import lease

    with lease.acquire("billing") as grant:
        db.execute("SELECT palisade.fence(%s, %s)", (key, grant.token))

``palisade.Session`` / ``palisade.Grant``: the blocking client; ``palisade.aio``: the
same on asyncio; ``palisade.leader``: leader election on a Lease.
"""

from . import aio, leader, lease
from .errors import AgentError, AgentUnreachable, LeaseLost
from .session import Grant, Session

__version__ = "0.1.0"

__all__ = [
    "AgentError",
    "AgentUnreachable",
    "Grant",
    "LeaseLost",
    "Session",
    "aio",
    "leader",
    "lease",
]
