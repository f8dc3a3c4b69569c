"""Error mapping (no agent needed)."""

import pickle

from palisade import AgentError, AgentUnreachable, LeaseLost, StaleTokenError
from palisade.errors import error_from_response


def test_agent_error_document():
    err = error_from_response(
        400, b'{"error":"invalid_field","field":"name","message":"must be a DNS subdomain name"}'
    )
    assert (err.status, err.code, err.field, err.message) == (
        400, "invalid_field", "name", "must be a DNS subdomain name",
    )
    assert str(err) == "palisade agent: 400 invalid_field (name): must be a DNS subdomain name"


def test_error_without_field():
    err = error_from_response(404, b'{"error":"unknown_session","message":"no session s1"}')
    assert err.field is None and err.code == "unknown_session"
    assert str(err) == "palisade agent: 404 unknown_session: no session s1"


def test_error_that_is_not_the_agents_document():
    err = error_from_response(502, b"<html>Bad Gateway</html>")
    assert err.status == 502 and err.code == "unexpected_response"
    assert "Bad Gateway" in err.message
    assert error_from_response(500, b"").message == "HTTP 500 with no error body"
    assert error_from_response(400, b'{"error": 3}').code == "unexpected_response"
    # Wrongly typed optional members are dropped, not passed on.
    odd = error_from_response(400, b'{"error":"invalid_json","field":7}')
    assert odd.field is None and odd.message == ""


def test_unreachable_is_an_agent_error_without_status():
    err = AgentUnreachable("cannot connect")
    assert isinstance(err, AgentError)
    assert err.status is None and err.code == "agent_unreachable"
    assert str(err) == "palisade agent: agent_unreachable: cannot connect"


def test_lease_lost_carries_its_reason_and_pickles():
    err = LeaseLost("Revoked", "the pod was deleted")
    assert err.reason == "Revoked"
    assert str(err) == "lease lost: Revoked: the pod was deleted"
    again = pickle.loads(pickle.dumps(err))
    assert again.reason == "Revoked" and again.message == "the pod was deleted"
    agent = pickle.loads(pickle.dumps(AgentError(409, "grant_lost", None, "lost")))
    assert (agent.status, agent.code) == (409, "grant_lost")
    unreachable = pickle.loads(pickle.dumps(AgentUnreachable("gone")))
    assert unreachable.message == "gone" and unreachable.status is None


def test_stale_token_error_says_what_was_refused_and_pickles():
    err = StaleTokenError("payments/billing", 33, 34)
    assert str(err) == (
        'write rejected: stale fencing token 33 for key "payments/billing" is lower than the '
        "highest admitted token 34; the transaction is aborted: roll it back and stop writing"
    )
    again = pickle.loads(pickle.dumps(err))
    assert (again.key, again.token, again.highest) == ("payments/billing", 33, 34)
    assert "admitted token;" in str(StaleTokenError("k", 1))
