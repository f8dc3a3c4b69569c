"""Addresses, option checks, the Grant document and what each report means for a
held grant (no agent needed)."""

import json
import math

import pytest

from palisade import _api
from palisade._api import Address, GrantInfo, judge


@pytest.fixture
def env(monkeypatch):
    monkeypatch.delenv(_api.SOCKET_ENV, raising=False)
    monkeypatch.delenv(_api.URL_ENV, raising=False)
    return monkeypatch


def test_address_defaults_to_the_pod_socket(env):
    assert _api.resolve_address() == Address(path="/run/palisade/agent.sock")


def test_address_from_environment(env):
    env.setenv(_api.URL_ENV, "http://127.0.0.1:9411")
    assert _api.resolve_address() == Address(host="127.0.0.1", port=9411)
    env.setenv(_api.SOCKET_ENV, "/run/app/a.sock")
    assert _api.resolve_address() == Address(path="/run/app/a.sock"), "the socket wins"
    assert _api.resolve_address(url="http://localhost:1") == Address(host="localhost", port=1)
    assert _api.resolve_address(socket_path="/x") == Address(path="/x")
    assert str(_api.resolve_address()) == "unix:/run/app/a.sock"


@pytest.mark.parametrize(
    "url", ["https://127.0.0.1:1", "127.0.0.1:1", "http://127.0.0.1:1/v1", "http://u@127.0.0.1:1", "http://"]
)
def test_bad_agent_urls(env, url):
    with pytest.raises(ValueError, match="expected http://HOST:PORT"):
        _api.resolve_address(url=url)


def test_socket_and_url_together_are_refused(env):
    with pytest.raises(ValueError, match="not both"):
        _api.resolve_address(socket_path="/x", url="http://127.0.0.1:1")


def test_acquire_body():
    assert _api.acquire_body("billing", None, None, None, 10_000) == {"name": "billing", "waitMs": 10_000}
    assert _api.acquire_body("b", "payments", 15, "pod-1", 0) == {
        "name": "b", "namespace": "payments", "durationSeconds": 15, "holderIdentity": "pod-1", "waitMs": 0,
    }
    assert _api.acquire_body("b", None, None, None, 0, slot=0) == {"name": "b", "waitMs": 0, "slot": 0}
    assert _api.acquire_body("b", None, None, None, 0, slot=63)["slot"] == 63


@pytest.mark.parametrize(
    "slot, error, what",
    [
        (64, ValueError, r"slot must be within 0\.\.63, not 64"),
        (-1, ValueError, r"slot must be within 0\.\.63, not -1"),
        (True, TypeError, "slot must be an int, not bool"),
        ("2", TypeError, "slot must be an int, not str"),
    ],
)
def test_a_slot_is_checked(slot, error, what):
    with pytest.raises(error, match=what):
        _api.acquire_body("b", None, None, None, 0, slot=slot)


@pytest.mark.parametrize(
    "args, error, what",
    [
        ((3, None, None, None), TypeError, "name must be a str"),
        (("b", 5, None, None), TypeError, "namespace must be a str"),
        (("b", None, True, None), TypeError, "duration_seconds must be an int, not bool"),
        (("b", None, 1.5, None), TypeError, "duration_seconds must be an int"),
        (("b", None, 0, None), ValueError, r"duration_seconds must be within 1\.\.86400, not 0"),
        (("b", None, 86_401, None), ValueError, "within 1..86400"),
        (("b", None, None, b"pod"), TypeError, "holder_identity must be a str"),
    ],
)
def test_acquire_options_are_checked(args, error, what):
    with pytest.raises(error, match=what):
        _api.acquire_body(*args, wait_ms=0)


def test_session_body():
    assert _api.session_body(None, None) == {}
    assert _api.session_body(3000, "worker") == {"keepaliveMs": 3000, "name": "worker"}
    with pytest.raises(ValueError, match="keepalive_ms must be within 1000..60000"):
        _api.session_body(999, None)
    with pytest.raises(TypeError):
        _api.session_body("3000", None)


def test_timeouts():
    assert _api.check_timeout(None) is None
    assert _api.check_timeout(0) == 0.0
    assert _api.check_timeout(2.5) == 2.5
    for bad in (-1, -0.001, math.nan):
        with pytest.raises(ValueError, match="timeout must be >= 0"):
            _api.check_timeout(bad)
    for bad in (True, "5"):
        with pytest.raises(TypeError):
            _api.check_timeout(bad)


def test_wait_ms_is_bounded_by_the_agent_and_the_deadline():
    assert _api.wait_ms_for(None) == 30_000
    assert _api.wait_ms_for(100.0) == 30_000
    assert _api.wait_ms_for(1.2345) == 1234
    assert _api.wait_ms_for(-3) == 0


def test_endpoint_targets_quote_their_parameters():
    assert _api.GET_GRANT.target(session="s 1", namespace="ns", name="a/b") == "/v1/sessions/s%201/leases/ns/a%2Fb"
    assert _api.GET_GRANT.target({"waitMs": 500}, session="s", namespace="n", name="l") == (
        "/v1/sessions/s/leases/n/l?waitMs=500"
    )


GRANT = {
    "name": "billing", "namespace": "payments", "state": "held", "token": 42, "validForMs": 9500,
    "claim": "billing-x", "holderIdentity": "pod-1", "durationSeconds": 15,
}


def test_parse_grant():
    g = _api.parse_grant(GRANT)
    assert g.key == ("payments", "billing")
    assert (g.state, g.token, g.valid_for_ms, g.claim, g.duration_seconds) == ("held", 42, 9500, "billing-x", 15)
    assert g.lost_reason is None
    waiting = _api.parse_grant({"name": "b", "namespace": "n", "state": "waiting"})
    assert waiting.token is None and waiting.valid_for_ms == 0


@pytest.mark.parametrize(
    "doc, what",
    [
        ([], "a Grant is a JSON object"),
        ({"name": "b", "state": "held"}, "Grant.namespace is missing"),
        (dict(GRANT, token="42"), "Grant.token is not a int"),
        (dict(GRANT, token=True), "Grant.token is not a int"),
        (dict(GRANT, lostReason=3), "Grant.lostReason is not a str"),
    ],
)
def test_bad_grant_documents(doc, what):
    with pytest.raises(ValueError, match=what):
        _api.parse_grant(doc)


def test_bad_answers_are_agent_errors():
    with pytest.raises(_api.AgentError, match="not JSON"):
        _api.grant_from_answer(200, b"<html>")
    with pytest.raises(_api.AgentError, match="Grant.state"):
        _api.grant_from_answer(200, b'{"name":"b","namespace":"n"}')
    with pytest.raises(_api.AgentError, match="not a Session"):
        _api.session_from_answer(201, b'{"id":"s"}')
    assert _api.session_from_answer(201, b'{"id":"s","keepaliveMs":5000,"grants":[]}') == ("s", 5000)


def test_grants_of_events():
    session = {"id": "s", "keepaliveMs": 5000, "grants": [GRANT, dict(GRANT, name="other", state="waiting")]}
    grants = _api.grants_of_event("session", json.dumps(session))
    assert [g.name for g in grants] == ["billing", "other"]
    assert _api.grants_of_event("grant", json.dumps(GRANT))[0].token == 42
    assert _api.grants_of_event("message", "whatever") == ()
    with pytest.raises(ValueError):
        _api.grants_of_event("grant", "{not json")
    with pytest.raises(ValueError, match="without grants"):
        _api.grants_of_event("session", '{"id":"s"}')


def info(state, token=None, reason=None):
    return GrantInfo("b", "n", state, token, 0, reason, None, None, None, None)


def test_judge_reports_about_the_held_grant():
    assert judge(7, info("held", 7)).state is None
    lost = judge(7, info("lost", 7, "Revoked"))
    assert (lost.state, lost.reason) == ("lost", "Revoked")
    assert judge(7, info("lost", 7)).reason == "Lost", "a loss without a reason is still a loss"
    released = judge(7, info("released", 7))
    assert (released.state, released.reason) == ("lost", "SessionEnded")


def test_judge_reports_about_other_grants_of_the_lease():
    assert judge(7, info("lost", 6, "Expired")).state is None, "an earlier grant's loss"
    assert judge(7, info("released", 6)).state is None
    assert judge(7, info("waiting")).state is None, "a claim never granted"
    assert judge(7, info("released")).state is None
    later = judge(7, info("held", 8))
    assert (later.state, later.reason) == ("lost", "Superseded")


def test_claims_an_interrupted_acquire_may_have_left():
    grants = [
        dict(GRANT, namespace="a", state="waiting"),
        dict(GRANT, namespace="b"),  # held by a Grant of this process
        dict(GRANT, namespace="c", state="lost"),
        dict(GRANT, namespace="d", name="other", state="waiting"),
    ]
    body = json.dumps({"id": "s", "keepaliveMs": 5000, "grants": grants}).encode()
    known = [("b", "billing")]
    assert _api.unanswered_claims(200, body, "billing", None, known) == [("a", "billing")]
    assert _api.unanswered_claims(200, body, "billing", "b", known) == []
    assert _api.unanswered_claims(200, body, "billing", "b", []) == [("b", "billing")]
    with pytest.raises(_api.AgentError):
        _api.unanswered_claims(200, b"{}", "billing", None, [])
