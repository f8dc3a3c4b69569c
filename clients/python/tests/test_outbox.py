"""``outbox.enqueue`` against a real PostgreSQL (PALISADE_TEST_POSTGRES, psycopg 3).

The module creates a database of its own, ``palisade_py_outbox_<random>``, installs the
repository's sql/palisade-fence.sql and sql/palisade-outbox.sql in it, and drops it at
the end. Without the URL every test FAILS (never skips).
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import threading
import uuid
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest

from palisade import StaleTokenError, outbox

pytestmark = pytest.mark.postgres

URL_ENV = "PALISADE_TEST_POSTGRES"
SQL_DIR = pathlib.Path(__file__).resolve().parents[3] / "sql"
UUID_TEXT = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


@pytest.fixture(scope="module")
def dsn() -> str:
    """The URL of the module's own database, the fence and the outbox installed."""
    server = os.environ.get(URL_ENV)
    if not server:
        pytest.fail(
            f"{URL_ENV} is unset: these tests need a real PostgreSQL (e.g. "
            "postgres://postgres@127.0.0.1:15432/postgres; `make databases` starts one)",
            pytrace=False,
        )
    parts = urlsplit(server)
    name = f"palisade_py_outbox_{uuid.uuid4().hex[:12]}"
    url = urlunsplit(parts._replace(path="/" + name))
    with psycopg.connect(server, autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {name}")
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            for file in ("palisade-fence.sql", "palisade-outbox.sql"):
                conn.execute((SQL_DIR / file).read_text())
            conn.execute(
                "CREATE TABLE ledger (id bigserial PRIMARY KEY, key text NOT NULL, token bigint NOT NULL)"
            )
        yield url
    finally:
        with psycopg.connect(server, autocommit=True) as admin:
            admin.execute(f"DROP DATABASE {name} WITH (FORCE)")


@pytest.fixture
def conn(dsn):
    with psycopg.connect(dsn) as c:  # autocommit off: psycopg's default
        yield c


@pytest.fixture
def key() -> str:
    return f"py-outbox/{uuid.uuid4().hex[:12]}"


def count(dsn: str, query: str, *args) -> int:
    with psycopg.connect(dsn, autocommit=True) as c:
        return c.execute(query, args).fetchone()[0]


def test_the_intent_commits_with_the_fenced_write(conn, dsn, key):
    cur = conn.cursor()
    cur.execute("INSERT INTO ledger (key, token) VALUES (%s, %s)", (key, 7))
    payload = {"charge": {"amount": 1250, "currency": "EUR"}, "note": "Grüße"}
    intent = outbox.enqueue(cur, key, 7, payload)
    assert isinstance(intent, str) and UUID_TEXT.match(intent), intent
    conn.commit()
    with psycopg.connect(dsn, autocommit=True) as c:
        row = c.execute(
            "SELECT key, token, state, payload FROM palisade.outbox WHERE id = %s", (intent,)
        ).fetchone()
    assert row == (key, 7, "pending", payload)

    # JSON text as a str; the same token again, then a higher one.
    second = outbox.enqueue(cur, key, 7, '{"raw": true}')
    third = outbox.enqueue(cur, key, 8, [1, 2])
    conn.commit()
    assert len({intent, second, third}) == 3
    assert count(dsn, "SELECT count(*) FROM palisade.outbox WHERE key = %s", key) == 3


def test_a_stale_token_inserts_nothing_and_aborts_the_write(conn, dsn, key):
    cur = conn.cursor()
    outbox.enqueue(cur, key, 34, {"n": 34})
    conn.commit()

    cur.execute("INSERT INTO ledger (key, token) VALUES (%s, %s)", (key, 33))
    with pytest.raises(StaleTokenError) as refused:
        outbox.enqueue(cur, key, 33, {"n": 33})
    stale = refused.value
    assert (stale.key, stale.token, stale.highest) == (key, 33, 34)
    assert isinstance(stale.__cause__, psycopg.Error) and stale.__cause__.sqlstate == "PF001"
    assert f"stale fencing token 33 for key {json.dumps(key)}" in str(stale)
    assert "highest admitted token 34" in str(stale)
    # A program that ignores the refusal and commits anyway writes nothing.
    conn.commit()
    assert count(dsn, "SELECT count(*) FROM palisade.outbox WHERE key = %s AND token = 33", key) == 0
    assert count(dsn, "SELECT count(*) FROM ledger WHERE key = %s", key) == 0
    assert count(dsn, "SELECT count(*) FROM palisade.outbox WHERE key = %s AND token = 34", key) == 1


def test_the_intent_is_rolled_back_with_its_transaction(conn, dsn, key):
    outbox.enqueue(conn.cursor(), key, 5, {})
    conn.rollback()
    assert count(dsn, "SELECT count(*) FROM palisade.outbox WHERE key = %s", key) == 0


def test_autocommit_is_refused_before_anything_is_sent(dsn, key):
    with psycopg.connect(dsn, autocommit=True) as c:
        with pytest.raises(RuntimeError, match="autocommit") as refused:
            outbox.enqueue(c.cursor(), key, 1, {})
        assert json.dumps(key) in str(refused.value)
        assert count(dsn, "SELECT count(*) FROM palisade.marks WHERE key = %s", key) == 0
        # A transaction block on the autocommit connection is a transaction: admitted.
        with c.transaction():
            intent = outbox.enqueue(c.cursor(), key, 1, {})
    assert count(dsn, "SELECT count(*) FROM palisade.outbox WHERE id = %s", intent) == 1


@pytest.mark.parametrize(
    "token, payload, error",
    [
        (2**63, {}, ValueError),  # beyond bigint
        (-1, {}, ValueError),
        (True, {}, TypeError),
        ("1", {}, TypeError),
        (1, b"{}", TypeError),
        (1, None, TypeError),
        (1, {"x": float("nan")}, ValueError),  # not JSON
    ],
)
def test_bad_arguments_are_refused_before_anything_is_sent(conn, dsn, key, token, payload, error):
    with pytest.raises(error, match="outbox.enqueue"):
        outbox.enqueue(conn.cursor(), key, token, payload)
    conn.commit()  # the transaction is intact: nothing was sent
    assert count(dsn, "SELECT count(*) FROM palisade.marks WHERE key = %s", key) == 0


def test_the_databases_checks_keep_their_errors(conn):
    with pytest.raises(psycopg.Error) as not_json:
        outbox.enqueue(conn.cursor(), "py-outbox/bad", 1, '{"unterminated": ')
    assert not_json.value.sqlstate == "22P02"
    conn.rollback()
    with pytest.raises(psycopg.Error) as empty_key:
        outbox.enqueue(conn.cursor(), "", 1, {})
    assert empty_key.value.sqlstate == "22023"
    conn.rollback()


def test_racing_holders_enqueue_in_token_order(dsn, key):
    """The lower token enqueues until the higher one's first commit, then is refused;
    no intent of the lower token commits after one of the higher (the intents' commit
    order: a counter row updated after enqueue, in the same transaction)."""
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("CREATE TABLE IF NOT EXISTS commit_seq (key text PRIMARY KEY, n bigint NOT NULL)")
        c.execute("CREATE TABLE IF NOT EXISTS intent_seq (id uuid PRIMARY KEY, token bigint, seq bigint)")
        c.execute("INSERT INTO commit_seq VALUES (%s, 0)", (key,))
    low, high, high_writes = 100, 200, 20
    low_has_written, high_is_done = threading.Event(), threading.Event()
    outcome: dict = {}

    def numbered(c, token):
        with c.transaction():
            cur = c.cursor()
            intent = outbox.enqueue(cur, key, token, {"holder": token})
            cur.execute("UPDATE commit_seq SET n = n + 1 WHERE key = %s RETURNING n", (key,))
            cur.execute("INSERT INTO intent_seq VALUES (%s, %s, %s)", (intent, token, cur.fetchone()[0]))

    def lower():
        with psycopg.connect(dsn, autocommit=True) as c:
            after = 0  # transactions once the higher token is done: the fence refuses the first
            for i in range(10000):
                if i == 5:
                    low_has_written.set()
                if high_is_done.is_set():
                    after += 1
                    if after > 3:
                        return
                try:
                    numbered(c, low)
                except StaleTokenError as e:
                    outcome["refused"] = e
                    return

    def higher():
        try:
            if not low_has_written.wait(30):
                raise TimeoutError("the lower token's first writes")
            with psycopg.connect(dsn, autocommit=True) as c:
                for _ in range(high_writes):
                    numbered(c, high)
        except Exception as e:
            outcome["higher"] = e
        finally:
            high_is_done.set()

    threads = [threading.Thread(target=lower), threading.Thread(target=higher)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert "higher" not in outcome, outcome.get("higher")
    refused = outcome.get("refused")
    assert refused is not None, "the lower token was never refused"
    assert (refused.token, refused.highest) == (low, high)
    with psycopg.connect(dsn, autocommit=True) as c:
        last_low, first_high, n_high = c.execute(
            "SELECT max(s.seq) FILTER (WHERE s.token = %s), min(s.seq) FILTER (WHERE s.token = %s), "
            "count(*) FILTER (WHERE s.token = %s) FROM intent_seq s JOIN palisade.outbox o USING (id) "
            "WHERE o.key = %s",
            (low, high, high, key),
        ).fetchone()
    assert n_high == high_writes
    assert last_low < first_high, f"an intent of the lower token committed after the higher's: {last_low} >= {first_high}"
