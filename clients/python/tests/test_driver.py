"""The conformance driver (tests/conformance/python/driver.py) keeps to the suite's
protocol when the agent freezes: ``lost <reason>`` at the local deadline, one more
``write``, exit 3 (no agent needed: the fake one)."""

from __future__ import annotations

import os
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path

DRIVER = Path(__file__).resolve().parents[3] / "tests" / "conformance" / "python" / "driver.py"


def test_the_driver_reports_a_lapsed_local_deadline(fake_agent):
    env = dict(os.environ, PALISADE_AGENT_SOCKET=fake_agent.path)
    # The suite's frozen-agent scenario in small: the keepalive far longer than the Lease.
    args = [sys.executable, str(DRIVER), "--lease", "a", "--duration-seconds", "1", "--keepalive-ms", "10000"]
    proc = subprocess.Popen(args, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    lines: "queue.Queue[str]" = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line.strip()) for line in proc.stdout], daemon=True).start()
    try:
        first = lines.get(timeout=10)
        assert first.startswith("granted "), first
        token = first.split()[1]
        fake_agent.freeze()
        frozen = time.monotonic()
        seen = []
        while not (seen and seen[-1].startswith("lost")):
            seen.append(lines.get(timeout=max(0.01, frozen + 3 - time.monotonic())))
        assert time.monotonic() - frozen < 1.5
        assert seen[-1] == "lost LocalDeadline"
        assert set(seen[:-1]) == {f"write {token}"}
        assert lines.get(timeout=5) == f"write {token}"
        assert proc.wait(10) == 3
    finally:
        fake_agent.thaw()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
