"""No agent at the address: both clients say so with AgentUnreachable (no agent needed)."""

import asyncio
import socket
import threading

import pytest

from palisade import AgentUnreachable, Session, aio


def test_no_socket(tmp_path):
    with pytest.raises(AgentUnreachable, match="cannot connect to the agent at unix:.*missing.sock"):
        Session(socket_path=str(tmp_path / "missing.sock"))


def test_a_socket_that_closes_without_answering(tmp_path):
    path = str(tmp_path / "mute.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(1)
    try:

        def accept_and_close():
            conn, _ = server.accept()
            conn.recv(65536)
            conn.close()

        threading.Thread(target=accept_and_close, daemon=True).start()
        with pytest.raises(AgentUnreachable, match="before the response head"):
            Session(socket_path=path)
    finally:
        server.close()


def test_no_socket_asyncio(tmp_path):
    async def main():
        with pytest.raises(AgentUnreachable, match="missing.sock"):
            await aio.Session(socket_path=str(tmp_path / "missing.sock")).open()
        # An explicit session is opened by its owner, not by acquire.
        with pytest.raises(RuntimeError, match="not open"):
            await aio.acquire("x", session=aio.Session(socket_path=str(tmp_path / "missing.sock")))

    asyncio.run(main())
