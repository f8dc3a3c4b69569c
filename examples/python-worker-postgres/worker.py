"""A worker that writes to PostgreSQL only while it holds a palisade Lease.

Each batch is one transaction that first calls ``palisade.fence(key, token)`` with the
grant's fencing token: once a newer holder has written, PostgreSQL refuses this
holder's token (SQLSTATE PF001) and the whole transaction with it, however late a
paused or partitioned worker wakes up.

Environment: DATABASE_URL (libpq URL), LEASE (default python-worker), BATCH_ROWS (3),
WRITE_INTERVAL seconds between batches (0.2), PALISADE_AGENT_SOCKET (the agent's
socket, default /run/palisade/agent.sock), POD_NAME (recorded with every row).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import time
import uuid

import psycopg

from palisade import AgentError, LeaseLost, lease

log = logging.getLogger("worker")

LEASE = os.environ.get("LEASE", "python-worker")
DATABASE_URL = os.environ["DATABASE_URL"]
BATCH_ROWS = int(os.environ.get("BATCH_ROWS", "3"))
WRITE_INTERVAL = float(os.environ.get("WRITE_INTERVAL", "0.2"))
WRITER = os.environ.get("POD_NAME") or f"pid-{os.getpid()}"
STALE_TOKEN = "PF001"  # palisade.fence: a newer holder has written


def write_batch(conn: psycopg.Connection, key: str, token: int, batch: int) -> None:
    """One fenced transaction: the fence call, then the rows it protects."""
    txn = uuid.uuid4()
    with conn.transaction():
        conn.execute("SELECT palisade.fence(%s, %s)", (key, token))
        for seq in range(BATCH_ROWS):
            conn.execute(
                "INSERT INTO worker_rows (txn, seq, token, writer, batch) VALUES (%s, %s, %s, %s, %s)",
                (txn, seq, token, WRITER, batch),
            )


def hold_and_write(conn: psycopg.Connection) -> None:
    with lease.acquire(LEASE) as grant:
        key = f"{grant.namespace}/{grant.name}"  # the convention of palisade fence
        log.info("granted %s, token %d", key, grant.token)
        batch = 0
        while not grant.lost:
            try:
                write_batch(conn, key, grant.token, batch)
            except psycopg.Error as e:
                if e.sqlstate == STALE_TOKEN:
                    log.warning("write refused, token %d is stale: %s", grant.token, e.diag.message_primary)
                    return  # the Lease moved on; wait for it again
                raise
            batch += 1
            grant.wait_lost(WRITE_INTERVAL)
        log.warning("lost %s (token %d): %s", key, grant.token, grant.lost_reason)


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # Pod deletion: leave the with block (releasing the Lease at once) and exit.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    # autocommit: conn.transaction() is then a real BEGIN/COMMIT, never a savepoint
    # (a refused fence inside a savepoint would leave the transaction going).
    with psycopg.connect(DATABASE_URL, autocommit=True) as conn:
        while True:
            try:
                hold_and_write(conn)
            except (LeaseLost, AgentError) as e:
                # The agent is not up yet, restarted, or ended the session: start over.
                log.warning("%s; retrying in 1 s", e)
                time.sleep(1)


if __name__ == "__main__":
    sys.exit(main())
