"""The conformance driver of the Python client (clients/python), for tests/conformance.

    python driver.py --lease NAME [--namespace NS] [--duration-seconds N] [--keepalive-ms N]

The agent's socket comes from $PALISADE_AGENT_SOCKET. The protocol: acquire (waiting
as long as it takes), print ``granted T slot=S fence-key=K``, then ``write T`` every 100 ms without
looking at the grant (the suite's fence judges each write); when the client reports
the grant lost, ``lost R`` and one more ``write T`` (the write that was in flight),
exit 3; on a line ``release``, stdin's end or SIGTERM, release, print ``released``,
exit 0. Uses the client's public API only.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from pathlib import Path

try:
    import palisade
except ImportError:  # run with a Python that lacks the package: use the repository's
    sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "clients" / "python" / "src"))
    import palisade

WRITE_EVERY = 0.1
EXIT_LOST = 3


class Stop(BaseException):
    """Raised in the main thread to stop an acquire that is still waiting."""


def say(line: str) -> None:
    print(line, flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lease", required=True)
    parser.add_argument("--namespace")
    parser.add_argument("--duration-seconds", type=int)
    parser.add_argument("--keepalive-ms", type=int)
    args = parser.parse_args()

    stop = threading.Event()
    state = {"granted": False, "interrupted": False}
    main_thread = threading.get_ident()

    def on_term(signum: int, frame: object) -> None:
        stop.set()
        # Until the grant, the main thread waits inside acquire: stop it there (once).
        if not state["granted"] and not state["interrupted"]:
            state["interrupted"] = True
            raise Stop()

    def watch_stdin() -> None:
        for line in sys.stdin:
            if line.strip() == "release":
                break
        # A directed signal wakes the main thread out of a blocking socket read.
        signal.pthread_kill(main_thread, signal.SIGTERM)

    session = None
    try:
        signal.signal(signal.SIGTERM, on_term)
        threading.Thread(target=watch_stdin, name="stdin", daemon=True).start()
        session = palisade.Session(keepalive_ms=args.keepalive_ms, name="conformance-python")
        grant = session.acquire(
            args.lease, namespace=args.namespace, duration_seconds=args.duration_seconds
        )
        state["granted"] = True
    except Stop:
        if session is not None:
            session.close()  # ends the session: the agent drops the waiting claim
        say("released")
        return 0
    except palisade.LeaseLost as e:
        print(f"driver: acquire: {e}", file=sys.stderr)
        say(f"lost {e.reason}")
        return EXIT_LOST
    except palisade.AgentUnreachable as e:
        print(f"driver: {e}", file=sys.stderr)
        say("lost AgentUnreachable")
        return EXIT_LOST
    except palisade.AgentError as e:
        print(f"driver: acquire: {e}", file=sys.stderr)
        return 1

    # The slot and its key: the suite fences this grant's writes under that key.
    say(f"granted {grant.token} slot={grant.slot} fence-key={grant.fence_key}")
    while True:
        # `lost` reads the grant's local deadline too: a stopped agent shows here in time.
        if grant.lost:
            say(f"lost {grant.lost_reason}")
            say(f"write {grant.token}")
            return EXIT_LOST
        if stop.is_set():
            break
        say(f"write {grant.token}")
        grant.wait_lost(WRITE_EVERY)  # wakes at once on a loss
    try:
        grant.release()
    except palisade.AgentError as e:
        print(f"driver: release: {e}", file=sys.stderr)
        return 1
    if grant.lost:  # it was lost before the release got there
        say(f"lost {grant.lost_reason}")
        say(f"write {grant.token}")
        return EXIT_LOST
    say("released")
    session.close()
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BrokenPipeError:  # the suite stopped reading
        sys.exit(1)
