"""``outbox.enqueue``: an intent for an API that cannot check a fencing token (a
payment provider, a mailer), inserted into palisade's fenced outbox in PostgreSQL in
the transaction of the fenced write; ``palisade outbox relay`` delivers it later with
the intent's id as its ``Idempotency-Key``.

    with conn.transaction():
        cur.execute("INSERT INTO charges (order_id, amount) VALUES (%s, %s)", (order, 1250))
        intent = outbox.enqueue(cur, f"{grant.namespace}/billing", grant.token,
                                {"order": order, "amount": 1250})

``palisade.enqueue`` (sql/palisade-outbox.sql) runs ``palisade.fence`` first, so a
stale holder's intent is never inserted: its transaction aborts with SQLSTATE PF001,
raised here as ``StaleTokenError``.

No driver is imported: the cursor is any DB-API cursor of a PostgreSQL driver with the
``format`` parameter style (psycopg 3, psycopg2, pg8000). Autocommit is refused where
the connection says it is on (``connection.autocommit``) and no transaction block is
open (psycopg's ``connection.info.transaction_status``): there the intent would commit
on its own, apart from the write it belongs to. psycopg 3's ``with
conn.transaction():`` on an autocommit connection opens a block, and is admitted.
"""

from __future__ import annotations

import json
import re
from typing import Any, Optional, Union

from .errors import StaleTokenError

__all__ = ["STALE_TOKEN_SQLSTATE", "enqueue"]

#: The SQLSTATE palisade.fence (and so palisade.enqueue) raises for a stale token.
STALE_TOKEN_SQLSTATE = "PF001"

_ENQUEUE = "SELECT palisade.enqueue(%s, %s, %s::jsonb)"
# Tokens are unsigned 64-bit integers stored as PostgreSQL's bigint.
_TOKEN_MAX = 2**63 - 1
# libpq's PQtransactionStatus: inside a block (INTRANS), or in a failed one (INERROR).
_IN_BLOCK = (2, 3)
# palisade.fence's message: "... is lower than the highest admitted token 34".
_HIGHEST = re.compile(r"highest admitted token (\d+)")

Payload = Union[dict, list, str]


def enqueue(cursor: Any, key: str, token: int, payload: Payload) -> str:
    """Insert an intent under ``key`` with ``token`` in the cursor's transaction and
    return its id (a uuid, as text): the ``Idempotency-Key`` the relay sends.

    ``payload`` is what the relay POSTs: a dict or list (serialized as JSON here) or a
    str of JSON text (checked by the database). The intent commits with the
    transaction or not at all.

    Raises ``StaleTokenError`` for a token lower than the key's highest admitted (the
    transaction is aborted: roll it back); ``RuntimeError`` on an autocommit
    connection outside a transaction block, ``TypeError``/``ValueError`` for
    arguments of the wrong type or range, before anything is sent; every other
    error is the driver's own (SQLSTATE 40001 under REPEATABLE READ and
    SERIALIZABLE: retry the whole transaction).
    """
    if not isinstance(key, str):
        raise TypeError(f"outbox.enqueue: the key must be a str, not {type(key).__name__}")
    if isinstance(token, bool) or not isinstance(token, int):
        raise TypeError(f"outbox.enqueue: the token must be an int, not {type(token).__name__}")
    if not 0 <= token <= _TOKEN_MAX:
        raise ValueError(
            f"outbox.enqueue: fencing token {token} is out of range: tokens are 0..{_TOKEN_MAX} "
            "(unsigned, stored as bigint)"
        )
    text = _payload_text(payload)
    _refuse_autocommit(cursor, key)
    try:
        cursor.execute(_ENQUEUE, (key, token, text))
        row = cursor.fetchone()
    except Exception as e:
        if _sqlstate(e) == STALE_TOKEN_SQLSTATE:
            raise StaleTokenError(key, token, _highest(e)) from e
        raise
    return str(row[0])


def _payload_text(payload: Payload) -> str:
    if isinstance(payload, str):
        return payload
    if isinstance(payload, (dict, list)):
        try:
            return json.dumps(payload, allow_nan=False)
        except (TypeError, ValueError) as e:
            raise ValueError(f"outbox.enqueue: the payload is not JSON: {e}") from e
    raise TypeError(
        "outbox.enqueue: the payload must be a dict, a list or a str of JSON text, "
        f"not {type(payload).__name__}"
    )


def _refuse_autocommit(cursor: Any, key: str) -> None:
    connection = getattr(cursor, "connection", None)
    if getattr(connection, "autocommit", False) is not True:
        return
    status = getattr(getattr(connection, "info", None), "transaction_status", None)
    if status is not None and int(status) in _IN_BLOCK:
        return
    raise RuntimeError(
        f"outbox.enqueue of key {json.dumps(key)} on a connection in autocommit mode would "
        "commit the intent on its own, apart from the write it belongs to: turn autocommit "
        "off (or open a transaction block) and enqueue in the transaction of the write"
    )


def _sqlstate(e: BaseException) -> Optional[str]:
    state = getattr(e, "sqlstate", None) or getattr(e, "pgcode", None)  # psycopg 3, psycopg2
    if state is None and e.args and isinstance(e.args[0], dict):  # pg8000: the server's fields
        state = e.args[0].get("C")
    return state if isinstance(state, str) else None


def _highest(e: BaseException) -> Optional[int]:
    # The DETAIL is JSON ({"key", "token", "highest"}); the message says it in words.
    detail = getattr(getattr(e, "diag", None), "message_detail", None)
    if isinstance(detail, str):
        try:
            highest = json.loads(detail).get("highest")
        except (ValueError, AttributeError):
            highest = None
        if isinstance(highest, int) and not isinstance(highest, bool):
            return highest
    m = _HIGHEST.search(str(e))
    return int(m.group(1)) if m else None
