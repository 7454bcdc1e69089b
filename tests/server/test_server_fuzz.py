"""The server fuzzed from its own OpenAPI schema (schemathesis): a real uvicorn on loopback, the mock
executor, an API key. Every answer must be a status the schema documents, with the schema's body;
every error OpenAI's error JSON; never a 5xx, never a dropped keep-alive connection (one requests
session for the whole run). Schemathesis generates valid bodies, bodies that break the schema (which
must get a 4xx: nothing is coerced) and boundary values of every field.

Short run by default; ``HETERO_FUZZ_EXAMPLES=2000 pytest tests/server/test_server_fuzz.py`` for a long
one (examples per operation in the fuzzing phase; docs/testing.md).
"""

from __future__ import annotations

import json
import os
from collections import Counter

import pytest

schemathesis = pytest.importorskip("schemathesis")
requests = pytest.importorskip("requests")

from hypothesis import HealthCheck, settings  # noqa: E402
from schemathesis.checks import (  # noqa: E402
    not_a_server_error,
)
from schemathesis.config import SchemathesisConfig  # noqa: E402
from schemathesis.specs.openapi.checks import (  # noqa: E402
    content_type_conformance,
    negative_data_rejection,
    response_schema_conformance,
    status_code_conformance,
)

from hetero_core.server.app import openapi_schema  # noqa: E402
from tests.server.live_server import LiveServer  # noqa: E402

TALLY: Counter = Counter()  # (operation, generation mode, status) -> requests; printed at the end
EXAMPLES = int(os.environ.get("HETERO_FUZZ_EXAMPLES", "25"))
# The default run is the same every time; a long run explores (rerun a failure with --hypothesis-seed).
DERANDOMIZE = "HETERO_FUZZ_EXAMPLES" not in os.environ
API_KEY = "sk-fuzz"
AUTH = {"Authorization": f"Bearer {API_KEY}"}
ERROR_KEYS = {"message", "type", "param", "code"}


@schemathesis.check
def openai_error_json(ctx, response, case):
    """Errors are OpenAI's JSON; streams are well-formed server-sent events ending with [DONE]."""
    content_type = response.headers.get("content-type", [""])[0]
    if response.status_code >= 400:
        assert content_type == "application/json", f"error answered as {content_type!r}"
        error = json.loads(response.content)["error"]
        assert set(error) == ERROR_KEYS and isinstance(error["message"], str) and error["message"]
    elif content_type.startswith("text/event-stream"):
        events = [line[6:] for line in response.content.decode().split("\n") if line.startswith("data: ")]
        if case.path == "/v1/responses":  # typed events, no [DONE]: the last one completes the response
            types = [json.loads(event)["type"] for event in events]
            assert types and types[-1] == "response.completed" and "error" not in types, types
            return None
        assert events and events[-1] == "[DONE]", "a stream must end with data: [DONE]"
        for event in events[:-1]:
            assert "error" not in json.loads(event), f"an error inside a stream: {event}"
    return None


CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    negative_data_rejection,
    openai_error_json,
]


@pytest.fixture(scope="module")
def fuzz_server():
    import hetero_plugins_mock
    from hetero_core.builder import build_engine
    from hetero_core.plugin_system.discovery import load_plugins
    from hetero_core.settings import load_settings

    settings_ = load_settings(executor={"name": "mock", "mock": {}}, max_model_len=256, max_tokens=32)
    engine = build_engine(
        settings_, load_plugins(entry_points=[], extra_plugins=[("mock", hetero_plugins_mock)])
    )
    with LiveServer(engine, api_key=API_KEY, max_pending_requests=64) as server:
        yield server


@pytest.fixture(scope="module", autouse=True)
def tally():
    yield TALLY
    lines = [f"{n:6d}  {op}  {mode}  -> {status}" for (op, mode, status), n in sorted(TALLY.items())]
    print(f"\nschemathesis: {sum(TALLY.values())} requests\n" + "\n".join(lines))


@pytest.fixture(scope="module")
def session(fuzz_server):
    with requests.Session() as session:  # one keep-alive connection: a reset fails the run
        yield session


# The schema the server serves, built without an engine so that schemathesis can parametrize at
# collection (its fixture-based loader does not run under pytest 9); the first test checks it is the
# one served.
# Streams are read to their end (schemathesis stops after 20 events by default).
schema = schemathesis.openapi.from_dict(
    openapi_schema(has_api_key=True), config=SchemathesisConfig.from_dict({"max-stream-events": 10**6})
)


def test_the_fuzzed_schema_is_the_served_one(fuzz_server, session):
    served = session.get(fuzz_server.base_url + "/openapi.json", headers=AUTH, timeout=60).json()
    assert served == openapi_schema(has_api_key=True)


@schema.parametrize()
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=DERANDOMIZE,
    database=None,
    suppress_health_check=list(HealthCheck),
)
def test_every_answer_is_documented_and_every_error_is_openai_json(case, fuzz_server, session):
    response = case.call(base_url=fuzz_server.base_url, session=session, headers=AUTH, timeout=60)
    mode = case.meta.generation.mode.value if case.meta else "explicit"
    TALLY[(case.operation.label, mode, response.status_code)] += 1
    case.validate_response(response, checks=CHECKS, transport_kwargs={"base_url": fuzz_server.base_url})
    # The engine is left as it was: nothing pending once the answer is complete.
    assert fuzz_server.wait_until_idle(), fuzz_server.llm.stats
    # Every answer came on the one keep-alive connection (requests would silently resend a request
    # whose connection the server dropped, on a new one).
    assert connections_opened(session) == 1


def connections_opened(session) -> int:
    pools = session.get_adapter("http://").poolmanager.pools
    return sum(pools[key].num_connections for key in pools.keys())
