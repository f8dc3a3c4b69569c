"""palisade: fenced Leases through the pod's ``palisade agent``.

    from palisade import lease

    with lease.acquire("billing") as grant:
        db.execute("SELECT palisade.fence(%s, %s)", (key, grant.token))

``palisade.Session`` / ``palisade.Grant``: the blocking client; ``palisade.aio``: the
same on asyncio; ``palisade.leader``: leader election on a Lease; ``palisade.outbox``:
an intent for an API that cannot check a token, inserted with the fenced write.
"""

from . import aio, leader, lease, outbox
from .errors import AgentError, AgentUnreachable, LeaseLost, StaleTokenError
from .session import Grant, Session

__version__ = "0.1.0"

__all__ = [
    "AgentError",
    "AgentUnreachable",
    "Grant",
    "LeaseLost",
    "Session",
    "StaleTokenError",
    "aio",
    "leader",
    "lease",
    "outbox",
]
