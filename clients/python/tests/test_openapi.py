"""The client against the agent's contract, src/agent/openapi.yaml: every operation
it calls, every field it sends or reads and every code it acts on must be there, so
a change of the spec fails here (no agent needed)."""

import re
from pathlib import Path

import pytest
import yaml

from palisade import _api
from palisade.errors import LeaseLost

SPEC_PATH = Path(__file__).resolve().parents[3] / "src" / "agent" / "openapi.yaml"


@pytest.fixture(scope="module")
def spec():
    assert SPEC_PATH.is_file(), f"the agent's OpenAPI document is missing: {SPEC_PATH}"
    return yaml.safe_load(SPEC_PATH.read_text())


def schema(spec, name):
    return spec["components"]["schemas"][name]


@pytest.mark.parametrize("endpoint", _api.ENDPOINTS, ids=lambda e: f"{e.method} {e.template}")
def test_every_operation_the_client_calls_is_in_the_spec(spec, endpoint):
    paths = spec["paths"]
    assert endpoint.template in paths, f"{endpoint.template} is not a path of {SPEC_PATH.name}"
    assert endpoint.method.lower() in paths[endpoint.template], (
        f"{endpoint.method} {endpoint.template} is not an operation of {SPEC_PATH.name}"
    )


def test_path_parameters_are_the_specs(spec):
    for endpoint in _api.ENDPOINTS:
        item = spec["paths"][endpoint.template]
        declared = set()
        for param in item.get("parameters", []) + item[endpoint.method.lower()].get("parameters", []):
            if "$ref" in param:
                param = spec["components"]["parameters"][param["$ref"].rsplit("/", 1)[1]]
            if param["in"] == "path":
                declared.add(param["name"])
        assert declared == set(re.findall(r"{(\w+)}", endpoint.template)), endpoint


def test_the_status_codes_the_client_expects_are_the_specs(spec):
    paths = spec["paths"]
    expected = {
        _api.CREATE_SESSION: {"201"},
        _api.GET_SESSION: {"200", "404"},
        _api.END_SESSION: {"204", "404"},
        _api.EVENTS: {"200"},
        _api.ACQUIRE: {"200", "202"},
        _api.GET_GRANT: {"200", "404"},
        _api.RELEASE: {"200", "404", "409"},
    }
    for endpoint, codes in expected.items():
        responses = set(paths[endpoint.template][endpoint.method.lower()]["responses"])
        assert codes <= responses, f"{endpoint.method} {endpoint.template}: {codes - responses} not in the spec"
    stream = paths[_api.EVENTS.template]["get"]["responses"]["200"]["content"]
    assert "text/event-stream" in stream


def test_the_wait_query_parameter(spec):
    params = spec["paths"][_api.GET_GRANT.template]["get"]["parameters"]
    wait = [p for p in params if p.get("name") == "waitMs"]
    assert wait and wait[0]["in"] == "query"
    assert wait[0]["schema"]["maximum"] == _api.MAX_WAIT_MS


def test_request_bodies_send_only_the_specs_fields(spec):
    acquire = schema(spec, "AcquireRequest")
    body = _api.acquire_body("b", "ns", 15, "pod", 0)
    assert set(body) <= set(acquire["properties"]), set(body) - set(acquire["properties"])
    assert set(acquire["required"]) <= set(body)
    assert acquire["properties"]["waitMs"]["maximum"] == _api.MAX_WAIT_MS
    assert set(_api.acquire_body("b", None, None, None, 0, slot=1)) <= set(acquire["properties"])
    slot = acquire["properties"]["slot"]
    assert (slot["minimum"], slot["maximum"]) == (0, _api.MAX_SLOT)
    duration = acquire["properties"]["durationSeconds"]
    assert (duration["minimum"], duration["maximum"]) == (1, 86_400)
    session = schema(spec, "SessionRequest")
    assert set(_api.session_body(5000, "worker")) <= set(session["properties"])
    keepalive = session["properties"]["keepaliveMs"]
    assert (keepalive["minimum"], keepalive["maximum"]) == (1000, 60_000)


def test_documents_the_client_reads(spec):
    grant = schema(spec, "Grant")
    read = {"name", "namespace", "state", "token", "validForMs", "lostReason", "lostMessage", "claim",
            "holderIdentity", "durationSeconds", "slot", "fenceKey"}
    assert read <= set(grant["properties"]), read - set(grant["properties"])
    assert set(grant["properties"]["state"]["enum"]) == {"waiting", "held", "lost", "released"}
    session = schema(spec, "Session")
    assert {"id", "keepaliveMs", "grants"} <= set(session["required"])


def test_error_codes_the_client_acts_on(spec):
    codes = set(schema(spec, "Error")["properties"]["error"]["enum"])
    assert {"unknown_session", "grant_lost"} <= codes
    assert {"error", "message"} <= set(schema(spec, "Error")["required"])
    client_codes = {"agent_unreachable", "unexpected_response"}
    assert not client_codes & codes, "the client's own codes must not collide with the agent's"


def test_loss_reasons(spec):
    agent = set(schema(spec, "Grant")["properties"]["lostReason"]["enum"])
    own = {_api.SESSION_ENDED, _api.KEEPALIVE_MISSED, _api.RELEASED}
    assert not own & agent, "the client's own reasons must not collide with the agent's"
    documented = set(re.findall(r"``(\w+)``", LeaseLost.__doc__ or ""))
    assert agent | own <= documented, f"LeaseLost's doc lacks {(agent | own) - documented}"


def test_the_refresh_is_a_keepalive(spec):
    # The clients refresh their deadlines with GET of the session, instead of a keepalive.
    assert "keepalive" in spec["paths"][_api.GET_SESSION.template]["get"]["summary"]
