"""The exceptions of the palisade client."""

from __future__ import annotations

import json
from typing import Optional

__all__ = ["AgentError", "AgentUnreachable", "LeaseLost", "StaleTokenError", "error_from_response"]


class AgentError(Exception):
    """The agent refused a request, or answered something the client cannot use.

    ``status`` is the HTTP status (None when there was no answer), ``code`` the
    agent's stable error code (``invalid_field``, ``unknown_session``, ...),
    ``field`` the request field at fault when one is, ``message`` the rule in words.
    """

    def __init__(
        self, status: Optional[int], code: str, field: Optional[str], message: str
    ) -> None:
        super().__init__(status, code, field, message)
        self.status = status
        self.code = code
        self.field = field
        self.message = message

    def __str__(self) -> str:
        where = f" ({self.field})" if self.field else ""
        status = f"{self.status} " if self.status is not None else ""
        return f"palisade agent: {status}{self.code}{where}: {self.message}"


class AgentUnreachable(AgentError):
    """No answer from the agent: no socket, connection refused or dropped, timed out."""

    def __init__(self, message: str) -> None:
        super().__init__(None, "agent_unreachable", None, message)
        self.args = (message,)  # what pickle passes back to __init__


class LeaseLost(Exception):
    """The grant is no longer held; ``reason`` says why.

    The agent's reasons: ``Revoked``, ``Expired``, ``Superseded``, ``LeaseDeleted``,
    ``ClaimDeleted``, ``LocalDeadline``, and ``AcquireFailed`` (raised by an acquire
    that failed before a grant, e.g. the API server refused the claim; ``message``
    says why). The client's own: ``SessionEnded`` (the
    session's event stream ended, or the agent no longer knows the session),
    ``KeepaliveMissed`` (no keepalive succeeded for ``keepaliveMs``), ``Released``
    (the grant was released, by this process or when its session was closed).
    """

    def __init__(self, reason: str, message: str = "") -> None:
        super().__init__(reason, message)
        self.reason = reason
        self.message = message

    def __str__(self) -> str:
        return f"lease lost: {self.reason}" + (f": {self.message}" if self.message else "")


class StaleTokenError(Exception):
    """The database refused a stale fencing token (SQLSTATE ``PF001``): a holder with a
    higher token has written under ``key`` since ``token`` was granted. The transaction
    is aborted: roll it back and stop writing; the same token is refused again.

    ``highest`` is the key's highest admitted token as the database reported it (None
    when it did not say); the driver's exception is ``__cause__``.
    """

    def __init__(self, key: str, token: int, highest: Optional[int] = None) -> None:
        super().__init__(key, token, highest)
        self.key = key
        self.token = token
        self.highest = highest

    def __str__(self) -> str:
        highest = f" {self.highest}" if self.highest is not None else ""
        return (
            f"write rejected: stale fencing token {self.token} for key {json.dumps(self.key)} is lower "
            f"than the highest admitted token{highest}; the transaction is aborted: roll it back "
            "and stop writing"
        )


def error_from_response(status: int, body: bytes) -> AgentError:
    """The AgentError for a 4xx/5xx answer: the agent's JSON ``Error``, or its text."""
    try:
        doc = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        doc = None
    if isinstance(doc, dict) and isinstance(doc.get("error"), str):
        field = doc.get("field")
        message = doc.get("message")
        return AgentError(
            status,
            doc["error"],
            field if isinstance(field, str) else None,
            message if isinstance(message, str) else "",
        )
    text = body.decode("utf-8", errors="replace").strip()[:500]
    return AgentError(status, "unexpected_response", None, text or f"HTTP {status} with no error body")
