"""Fixtures: the agent's socket for the tests marked ``agent``, unique Lease names, and
a fake agent for the tests of the clients' own logic."""

from __future__ import annotations

import os
import uuid

import pytest

from fake_agent import FakeAgent

SOCKET_ENV = "PALISADE_AGENT_SOCKET"
RUN = uuid.uuid4().hex[:6]


@pytest.fixture(scope="session")
def agent_socket() -> str:
    """The running agent's socket; a test that needs it FAILS (never skips) without it."""
    path = os.environ.get(SOCKET_ENV)
    if not path:
        pytest.fail(
            f"{SOCKET_ENV} is unset: this test needs a running `palisade agent` (see "
            "clients/python/README.md, Tests); run the unit tests alone with -m 'not agent'",
            pytrace=False,
        )
    if not os.path.exists(path):
        pytest.fail(f"{SOCKET_ENV}={path}: no such socket (is the agent running?)", pytrace=False)
    return path


@pytest.fixture
def lease_name() -> str:
    """A Lease name (a DNS label) unique to this test and run."""
    return f"py-{RUN}-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def fake_agent():
    """A FakeAgent (tests/fake_agent.py): 1 s Leases, validForMs 600."""
    agent = FakeAgent()
    yield agent
    agent.close()
