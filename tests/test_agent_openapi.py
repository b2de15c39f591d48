"""The agent's OpenAPI schema against the real agent: schemathesis generates requests for every operation
(valid and invalid ones), sends them over loopback, and checks that no answer is a 5xx and that status
codes, content types, headers and bodies are the ones the schema documents."""

from __future__ import annotations

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from mpstudio.agent import LocalAgent

EXAMPLES = 15  # per operation and generation mode: about 270 requests in all
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_headers_conformance,
          response_schema_conformance]


@pytest.fixture(scope="module")
def agent(tmp_path_factory):
    log = tmp_path_factory.mktemp("openapi-agent") / "agent.log"
    with LocalAgent(max_upload_mb=1, run_timeout=30, log_path=log) as local:
        yield local


def test_every_documented_error_has_an_error_body(agent):
    schema = httpx.get(f"{agent.url}/openapi.json").json()
    for path, methods in schema["paths"].items():
        for method, operation in methods.items():
            responses = operation["responses"]
            assert "401" in responses and "503" in responses, (method, path)
            for code, response in responses.items():
                if int(code) >= 400:
                    body = response["content"]["application/json"]["schema"]
                    assert body == {"$ref": "#/components/schemas/ErrorBody"}, (method, path, code)
    assert schema["components"]["schemas"]["ErrorBody"]["required"] == ["detail"]


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_schemathesis_finds_no_server_error_and_no_undocumented_response(agent, mode):
    schema = schemathesis.openapi.from_url(f"{agent.url}/openapi.json")
    headers = {"Authorization": f"Bearer {agent.token}"}
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 9
    sent = []
    for operation in operations:

        @settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True,
                  suppress_health_check=list(HealthCheck))
        @given(case=operation.as_strategy(generation_mode=mode))
        def check(case):
            response = case.call_and_validate(base_url=agent.url, headers=headers, checks=CHECKS, timeout=60)
            sent.append(response.status_code)

        check()
    assert len(sent) >= len(operations)
    assert all(status < 500 for status in sent)
    assert agent.client.health()["status"] == "ok"
