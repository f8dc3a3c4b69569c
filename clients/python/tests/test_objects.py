"""Objects written through the object-store fence by the real agent, with the grant's
own token (``Grant.put_object``). tests/clients.rs gives its agent S3 credentials,
makes a bucket (PALISADE_TEST_S3_BUCKET) and writes one object in it
(PALISADE_TEST_S3_STALE_KEY) with a token no grant reaches, as a newer holder would."""

from __future__ import annotations

import asyncio
import os

import pytest

from palisade import LeaseLost, Session, StaleTokenError, aio

pytestmark = [pytest.mark.agent, pytest.mark.usefixtures("agent_socket")]


@pytest.fixture(scope="module")
def object_store():
    bucket = os.environ.get("PALISADE_TEST_S3_BUCKET")
    stale_key = os.environ.get("PALISADE_TEST_S3_STALE_KEY")
    if not bucket or not stale_key:
        pytest.fail(
            "PALISADE_TEST_S3_BUCKET and PALISADE_TEST_S3_STALE_KEY are unset: tests/clients.rs "
            "sets them for its agent, whose S3 server (PALISADE_TEST_S3) holds them",
            pytrace=False,
        )
    return bucket, stale_key


def test_a_holder_writes_with_its_token_and_a_newer_holders_object_refuses_it(lease_name, object_store):
    bucket, stale_key = object_store
    key = f"py/{lease_name}/report.csv"
    with Session(name="pytest") as session:
        grant = session.acquire(lease_name, duration_seconds=15, timeout=30)
        written = grant.put_object(bucket, key, b"a,b\n1,2\n")
        assert (written.bucket, written.key, written.token) == (bucket, key, grant.token)
        assert written.previous_token is None and written.etag
        again = grant.put_object(bucket, key, bytearray(b"again"))
        assert again.previous_token == grant.token

        with pytest.raises(StaleTokenError) as stale:
            grant.put_object(bucket, stale_key, b"late")
        assert stale.value.key == stale_key and stale.value.token == grant.token
        assert stale.value.highest is not None and stale.value.highest > grant.token

        grant.release()
        with pytest.raises(LeaseLost):
            grant.put_object(bucket, key, b"released")


def test_the_asyncio_client_writes_too(lease_name, object_store):
    bucket, _ = object_store

    async def run() -> None:
        async with aio.Session(name="pytest-aio") as session:
            grant = await session.acquire(lease_name, duration_seconds=15, timeout=30)
            written = await grant.put_object(bucket, f"py/{lease_name}/aio", b"x")
            assert written.token == grant.token
            await grant.release()

    asyncio.run(run())

