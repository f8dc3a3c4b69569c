"""A stand-in for `palisade agent` on a Unix socket, for tests of the clients' own
logic (local deadlines, releases, forks): it answers like the agent, from memory,
and can stop answering as a frozen agent does (SIGSTOP, starvation)."""

from __future__ import annotations

import json
import os
import shutil
import socketserver
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler
from typing import Any, Dict, List, Optional, Tuple

NAMESPACE = "ns"


class FakeAgent:
    """Every acquire is granted at once (a new token each time). Answers naming a
    held grant carry ``valid_for_ms``; ``release_answer`` is the DELETE's status, or
    None to drop the connection unanswered."""

    def __init__(self, *, duration_seconds: int = 1, valid_for_ms: int = 600) -> None:
        # A short directory: a Unix socket's path is limited to about 100 bytes.
        self.dir = tempfile.mkdtemp(prefix="palisade-")
        self.path = os.path.join(self.dir, "agent.sock")
        self.duration_seconds = duration_seconds
        self.valid_for_ms = valid_for_ms
        self.release_answer: Optional[int] = 200
        self.create_delay = 0.0
        self.acquire_delay = 0.0
        self.requests: List[Tuple[float, str, str]] = []
        # The body of each acquire, as sent.
        self.acquires: List[Dict[str, Any]] = []
        # False: answer as an agent from before semaphores (no slot, no fenceKey).
        self.slots = True
        self._grants: Dict[Tuple[str, str], Dict[str, Any]] = {}
        self._sessions: Dict[str, int] = {}
        self._token = 100
        self._lock = threading.Lock()
        self._answering = threading.Event()
        self._answering.set()
        self._closed = threading.Event()
        agent = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                agent._handle(self)

            do_POST = do_DELETE = do_GET

            def log_message(self, *args: Any) -> None:
                pass

        self._server = socketserver.ThreadingUnixStreamServer(self.path, Handler)
        self._server.daemon_threads = True
        # A client that gave up on its answer is expected: no traceback.
        self._server.handle_error = lambda request, address: None  # type: ignore[method-assign]
        threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True).start()

    def freeze(self) -> None:
        """Accept connections but answer nothing, like a stopped agent."""
        self._answering.clear()

    def thaw(self) -> None:
        self._answering.set()

    def close(self) -> None:
        self._closed.set()
        self._answering.set()
        self._server.shutdown()
        self._server.server_close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def seen(self, method: str, path: str, since: float = 0.0) -> int:
        """How many requests ``method path`` (without the query) arrived since ``since``."""
        return sum(1 for at, m, p in list(self.requests) if m == method and p == path and at >= since)

    def wait_for(self, method: str, path: str, timeout: float) -> bool:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.seen(method, path):
                return True
            time.sleep(0.02)
        return False

    # -- the API --------------------------------------------------------------------

    def _view(self, doc: Dict[str, Any]) -> Dict[str, Any]:
        return dict(doc, validForMs=self.valid_for_ms if doc["state"] == "held" else 0)

    def _handle(self, h: BaseHTTPRequestHandler) -> None:
        path = h.path.split("?", 1)[0]
        self.requests.append((time.monotonic(), h.command, path))
        length = int(h.headers.get("Content-Length") or 0)
        body = json.loads(h.rfile.read(length) or b"{}") if length else {}
        self._answering.wait()
        if self._closed.is_set():
            return
        parts = path.strip("/").split("/")  # v1 sessions ID ...
        if h.command == "POST" and parts == ["v1", "sessions"]:
            time.sleep(self.create_delay)
            with self._lock:
                sid = f"s{len(self._sessions) + 1}"
                self._sessions[sid] = body.get("keepaliveMs", 5000)
            return _json(h, 201, self._session_doc(sid))
        sid = parts[2] if len(parts) > 2 else ""
        if sid not in self._sessions:
            return _json(h, 404, {"error": "unknown_session", "message": f"no session {sid}"})
        rest = parts[3:]
        if rest == [] and h.command == "GET":
            return _json(h, 200, self._session_doc(sid))
        if rest == [] and h.command == "DELETE":
            return _json(h, 204, None)
        if rest == ["keepalive"]:
            return _json(h, 204, None)
        if rest == ["events"]:
            return self._stream(h, sid)
        if rest == ["leases"] and h.command == "POST":
            time.sleep(self.acquire_delay)
            with self._lock:
                self.acquires.append(body)
                self._token += 1
                key = (sid, body["name"])
                namespace = body.get("namespace", NAMESPACE)
                self._grants[key] = {
                    "name": body["name"], "namespace": namespace, "state": "held",
                    "token": self._token, "claim": f"{body['name']}-c{self._token}", "holderIdentity": "pod",
                    "durationSeconds": self.duration_seconds,
                }
                if self.slots:
                    slot = body.get("slot", 0)
                    fence_key = f"{namespace}/{body['name']}" + (f"#{slot}" if slot else "")
                    self._grants[key].update(slot=slot, fenceKey=fence_key)
            return _json(h, 200, self._view(self._grants[key]))
        if len(rest) == 3 and rest[0] == "leases":
            doc = self._grants.get((sid, rest[2]))
            if doc is None:
                return _json(h, 404, {"error": "unknown_grant", "message": "no such grant"})
            if h.command == "GET":
                return _json(h, 200, self._view(doc))
            if self.release_answer is None:
                return  # the connection closes unanswered
            if self.release_answer != 200:
                return _json(h, self.release_answer, {"error": "kubernetes_unavailable", "message": "try later"})
            doc["state"] = "released"
            return _json(h, 200, self._view(doc))
        _json(h, 404, {"error": "not_found", "message": path})

    def _session_doc(self, sid: str) -> Dict[str, Any]:
        grants = [self._view(d) for (s, _), d in list(self._grants.items()) if s == sid]
        return {"id": sid, "namespace": NAMESPACE, "keepaliveMs": self._sessions[sid], "grants": grants}

    def _stream(self, h: BaseHTTPRequestHandler, sid: str) -> None:
        h.send_response(200)
        h.send_header("Content-Type", "text/event-stream")
        h.end_headers()
        try:
            h.wfile.write(f"event: session\ndata: {json.dumps(self._session_doc(sid))}\n\n".encode())
            h.wfile.flush()
            while not self._closed.wait(0.2):
                if self._answering.is_set():
                    h.wfile.write(b": keepalive\n\n")
                    h.wfile.flush()
        except OSError:
            pass


def _json(h: BaseHTTPRequestHandler, status: int, doc: Any) -> None:
    payload = b"" if doc is None else json.dumps(doc).encode()
    h.send_response(status)
    if doc is not None:
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(payload)))
    h.end_headers()
    h.wfile.write(payload)
