"""What the sync and asyncio clients share: the agent's endpoints, where the agent
is, option checks and the Grant document. No I/O."""

from __future__ import annotations

import json
import os
from typing import Any, Dict, Iterable, List, NamedTuple, Optional, Tuple
from urllib.parse import quote, urlencode, urlsplit

from .errors import AgentError

DEFAULT_SOCKET = "/run/palisade/agent.sock"
SOCKET_ENV = "PALISADE_AGENT_SOCKET"
URL_ENV = "PALISADE_AGENT_URL"

# The agent's own bound on waitMs; a longer wait is a loop of such requests.
MAX_WAIT_MS = 30_000
# The highest slot of a semaphore (a Lease has at most 64 permits).
MAX_SLOT = 63
# The agent answers within waitMs + 11 s (its API server calls, retried once): a
# request still unanswered a little later than that will not be.
ANSWER_MARGIN_S = 12.0

# The client's own loss reasons (the agent's are in the OpenAPI document's Grant).
SESSION_ENDED = "SessionEnded"
KEEPALIVE_MISSED = "KeepaliveMissed"
RELEASED = "Released"
# The agent's reason, also the clients' when their own count of validForMs runs out.
LOCAL_DEADLINE = "LocalDeadline"
LAPSED = "validForMs ran out before the agent answered again"


class Endpoint(NamedTuple):
    """One operation of src/agent/openapi.yaml; the tests check each one is there."""

    method: str
    template: str

    def target(self, query: Optional[Dict[str, Any]] = None, **params: str) -> str:
        path = self.template.format(**{k: quote(v, safe="") for k, v in params.items()})
        return f"{path}?{urlencode(query)}" if query else path


CREATE_SESSION = Endpoint("POST", "/v1/sessions")
GET_SESSION = Endpoint("GET", "/v1/sessions/{session}")
END_SESSION = Endpoint("DELETE", "/v1/sessions/{session}")
EVENTS = Endpoint("GET", "/v1/sessions/{session}/events")
ACQUIRE = Endpoint("POST", "/v1/sessions/{session}/leases")
GET_GRANT = Endpoint("GET", "/v1/sessions/{session}/leases/{namespace}/{name}")
RELEASE = Endpoint("DELETE", "/v1/sessions/{session}/leases/{namespace}/{name}")
PUT_OBJECT = Endpoint("PUT", "/v1/sessions/{session}/leases/{namespace}/{name}/objects/{bucket}/{key}")
ENDPOINTS = (CREATE_SESSION, GET_SESSION, END_SESSION, EVENTS, ACQUIRE, GET_GRANT, RELEASE, PUT_OBJECT)


class Address(NamedTuple):
    """The agent's Unix socket (``path``), or its loopback TCP port (``host``, ``port``)."""

    path: Optional[str] = None
    host: Optional[str] = None
    port: Optional[int] = None

    def __str__(self) -> str:
        return f"unix:{self.path}" if self.path else f"http://{self.host}:{self.port}"


def resolve_address(socket_path: Optional[str] = None, url: Optional[str] = None) -> Address:
    """An explicit socket or URL, else $PALISADE_AGENT_SOCKET, else $PALISADE_AGENT_URL,
    else the default socket."""
    if socket_path and url:
        raise ValueError("give the agent's socket_path or its url, not both")
    if socket_path:
        return Address(path=socket_path)
    if url:
        return parse_url(url)
    env_socket = os.environ.get(SOCKET_ENV)
    if env_socket:
        return Address(path=env_socket)
    env_url = os.environ.get(URL_ENV)
    if env_url:
        return parse_url(env_url)
    return Address(path=DEFAULT_SOCKET)


def parse_url(url: str) -> Address:
    """``http://127.0.0.1:PORT``; the agent serves plain HTTP on loopback only."""
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise ValueError(f"agent URL {url!r}: expected http://HOST:PORT")
    if parts.path not in ("", "/") or parts.query or parts.username:
        raise ValueError(f"agent URL {url!r}: expected http://HOST:PORT, without a path")
    return Address(host=parts.hostname, port=parts.port or 80)


def _int(value: Any, what: str, low: int, high: int) -> int:
    # bool is an int in Python; True seconds is a mistake, not 1.
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{what} must be an int, not {type(value).__name__}")
    if not low <= value <= high:
        raise ValueError(f"{what} must be within {low}..{high}, not {value}")
    return value


def _str(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a str, not {type(value).__name__}")
    return value


def session_body(keepalive_ms: Optional[int], name: Optional[str]) -> Dict[str, Any]:
    body: Dict[str, Any] = {}
    if keepalive_ms is not None:
        body["keepaliveMs"] = _int(keepalive_ms, "keepalive_ms", 1000, 60_000)
    if name is not None:
        body["name"] = _str(name, "name")
    return body


def acquire_body(
    name: str,
    namespace: Optional[str],
    duration_seconds: Optional[int],
    holder_identity: Optional[str],
    wait_ms: int,
    slot: Optional[int] = None,
) -> Dict[str, Any]:
    """The AcquireRequest. Names are checked by the agent (its rules are the API
    server's), so a bad one is an AgentError naming the field; a slot outside a
    semaphore's 0..63 is refused here, before any request."""
    body: Dict[str, Any] = {"name": _str(name, "name"), "waitMs": wait_ms}
    if namespace is not None:
        body["namespace"] = _str(namespace, "namespace")
    if duration_seconds is not None:
        body["durationSeconds"] = _int(duration_seconds, "duration_seconds", 1, 86_400)
    if holder_identity is not None:
        body["holderIdentity"] = _str(holder_identity, "holder_identity")
    if slot is not None:
        body["slot"] = _int(slot, "slot", 0, MAX_SLOT)
    return body


def refresh_interval(keepalive_ms: int, durations: Iterable[int]) -> float:
    """Seconds between two GETs of the session: a third of the keepalive, and a sixth
    of the shortest Lease duration held, so that a healthy agent's answers (validForMs
    at least a third of a duration) always come before the last one runs out."""
    return min([keepalive_ms / 3000] + [d / 6 for d in durations])


def check_timeout(timeout: Optional[float]) -> Optional[float]:
    """None (wait as long as it takes) or seconds >= 0."""
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise TypeError(f"timeout must be seconds (a number) or None, not {type(timeout).__name__}")
    if not timeout >= 0:  # also refuses NaN
        raise ValueError(f"timeout must be >= 0 seconds, not {timeout}")
    return float(timeout)


def wait_ms_for(remaining: Optional[float]) -> int:
    """The waitMs of the next acquire/resume request, ``remaining`` seconds before the
    caller's timeout (None: no timeout)."""
    if remaining is None:
        return MAX_WAIT_MS
    return max(0, min(MAX_WAIT_MS, int(remaining * 1000)))


class GrantInfo(NamedTuple):
    """The agent's Grant document."""

    name: str
    namespace: str
    state: str
    token: Optional[int]
    valid_for_ms: int
    lost_reason: Optional[str]
    lost_message: Optional[str]
    claim: Optional[str]
    holder_identity: Optional[str]
    duration_seconds: Optional[int]
    # Absent from agents before semaphores (every grant was slot 0 of a lock).
    slot: Optional[int] = None
    fence_key: Optional[str] = None

    @property
    def key(self) -> Tuple[str, str]:
        return (self.namespace, self.name)


class ObjectWritten(NamedTuple):
    """The agent's answer to an object write (the ``ObjectWritten`` schema):
    ``previous_token`` is None when the write created the object."""

    bucket: str
    key: str
    token: int
    previous_token: Optional[int]
    etag: Optional[str]


def object_written(status: int, body: bytes) -> ObjectWritten:
    doc = parse_json(status, body)
    try:
        if not isinstance(doc, dict) or not isinstance(doc.get("bucket"), str) or not isinstance(doc.get("key"), str):
            raise ValueError(f"not an ObjectWritten: {doc!r}")
        token = _opt(doc, "token", int)
        if token is None:
            raise ValueError(f"ObjectWritten.token is missing: {doc!r}")
        return ObjectWritten(doc["bucket"], doc["key"], token, _opt(doc, "previousToken", int), _opt(doc, "etag", str))
    except ValueError as e:
        raise AgentError(status, "unexpected_response", None, str(e)) from None


def parse_json(status: int, body: bytes) -> Any:
    try:
        return json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise AgentError(status, "unexpected_response", None, f"not JSON: {e}") from None


def _opt(doc: Dict[str, Any], key: str, kind: type) -> Any:
    value = doc.get(key)
    if value is None:
        return None
    if not isinstance(value, kind) or isinstance(value, bool):
        raise ValueError(f"Grant.{key} is not a {kind.__name__}: {value!r}")
    return value


def parse_grant(doc: Any) -> GrantInfo:
    if not isinstance(doc, dict):
        raise ValueError(f"a Grant is a JSON object, not {doc!r}")
    for key in ("name", "namespace", "state"):
        if not isinstance(doc.get(key), str):
            raise ValueError(f"Grant.{key} is missing or not a string: {doc!r}")
    return GrantInfo(
        name=doc["name"],
        namespace=doc["namespace"],
        state=doc["state"],
        token=_opt(doc, "token", int),
        valid_for_ms=_opt(doc, "validForMs", int) or 0,
        lost_reason=_opt(doc, "lostReason", str),
        lost_message=_opt(doc, "lostMessage", str),
        claim=_opt(doc, "claim", str),
        holder_identity=_opt(doc, "holderIdentity", str),
        duration_seconds=_opt(doc, "durationSeconds", int),
        slot=_opt(doc, "slot", int),
        fence_key=_opt(doc, "fenceKey", str),
    )


def grant_from_answer(status: int, body: bytes) -> GrantInfo:
    try:
        return parse_grant(parse_json(status, body))
    except ValueError as e:
        raise AgentError(status, "unexpected_response", None, str(e)) from None


def session_from_answer(status: int, body: bytes) -> Tuple[str, int]:
    """(id, keepaliveMs) of a Session document."""
    doc = parse_json(status, body)
    if (
        not isinstance(doc, dict)
        or not isinstance(doc.get("id"), str)
        or not isinstance(doc.get("keepaliveMs"), int)
    ):
        raise AgentError(status, "unexpected_response", None, f"not a Session: {doc!r}")
    return doc["id"], doc["keepaliveMs"]


def grants_of_event(event: str, data: str) -> Tuple[GrantInfo, ...]:
    """The grants an SSE event reports: every grant of an ``event: session``, the one of
    an ``event: grant``; other events report none."""
    if event not in ("session", "grant"):
        return ()
    doc = json.loads(data)
    if event == "grant":
        return (parse_grant(doc),)
    grants = doc.get("grants") if isinstance(doc, dict) else None
    if not isinstance(grants, list):
        raise ValueError(f"a Session event without grants: {data!r}")
    return tuple(parse_grant(g) for g in grants)


def session_grants(status: int, body: bytes) -> List[GrantInfo]:
    """The grants of a Session document (``GET /v1/sessions/{id}``)."""
    doc = parse_json(status, body)
    grants = doc.get("grants") if isinstance(doc, dict) else None
    if not isinstance(grants, list):
        raise AgentError(status, "unexpected_response", None, f"not a Session: {doc!r}")
    try:
        return [parse_grant(g) for g in grants]
    except ValueError as e:
        raise AgentError(status, "unexpected_response", None, str(e)) from None


def unanswered_claims(
    status: int, body: bytes, name: str, namespace: Optional[str], known: Iterable[Tuple[str, str]]
) -> List[Tuple[str, str]]:
    """The keys of the Session document (``GET /v1/sessions/{id}``) that an acquire of
    ``name`` interrupted before its answer may have left waiting or held: live grants
    of that name (in ``namespace``, when given) that no Grant of this process holds."""
    known = set(known)
    keys = []
    for info in session_grants(status, body):
        if (
            info.name == name
            and (namespace is None or info.namespace == namespace)
            and info.state in ("waiting", "held")
            and info.key not in known
        ):
            keys.append(info.key)
    return keys


class Verdict(NamedTuple):
    """What an event means for a grant the client holds: lost (with why), released, or nothing."""

    state: Optional[str]
    reason: Optional[str] = None
    message: Optional[str] = None


def judge(held_token: int, info: GrantInfo) -> Verdict:
    """The decision both clients make for each reported state of a grant they hold
    with ``held_token``.

    A report without a token is about a claim never granted (an earlier wait, or a
    later one); one about another token is about an earlier grant of that Lease
    (lower token: says nothing about this one) or a later one (this one ended).
    ``released`` that this process did not ask for is a loss to it (the agent ended
    the claim, e.g. with the session).
    """
    if info.token is None or info.token < held_token:
        return Verdict(None)
    if info.state == "lost":
        return Verdict("lost", info.lost_reason or "Lost", info.lost_message)
    if info.state == "released":
        return Verdict("lost", SESSION_ENDED, "the agent released the grant")
    if info.token > held_token:
        return Verdict("lost", "Superseded", f"the agent reports token {info.token} now")
    return Verdict(None)
