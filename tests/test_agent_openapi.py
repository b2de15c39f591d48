"""The agent's OpenAPI schema against the real agent: schemathesis generates requests for every operation
(valid and invalid ones), sends them over loopback, and checks that no answer is a 5xx and that status
codes, content types, headers and bodies are the ones the schema documents."""

from __future__ import annotations

import base64
import copy
import hashlib
import io
import json
import socket
import time

import httpx
import jsonschema
import numpy as np
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

from agent_fixtures import conv_model
from mpstudio.agent import LocalAgent

EXAMPLES = 15  # per operation and generation mode: about 270 requests in all
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_headers_conformance,
          response_schema_conformance]


@pytest.fixture(scope="module")
def agent(tmp_path_factory):
    log = tmp_path_factory.mktemp("openapi-agent") / "agent.log"
    with LocalAgent(max_upload_mb=1, run_timeout=30, log_path=log, extra_args=("--header-timeout", "2")) as local:
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


# ---------------------------------------------------------------- the schema against the API it describes

PROBED_METHODS = ("GET", "HEAD", "PUT", "POST", "PATCH", "DELETE", "OPTIONS")


def _strict(node):
    """The documented schema with undocumented fields refused: every object lists all it may hold."""
    if isinstance(node, list):
        return [_strict(item) for item in node]
    if not isinstance(node, dict):
        return node
    node = {key: _strict(value) for key, value in node.items()}
    if "properties" in node and "additionalProperties" not in node:
        node["additionalProperties"] = False
    return node


class Documented:
    """The served schema, read as what each operation accepts and answers."""

    def __init__(self, schema: dict):
        self.schema = schema
        self.components = _strict(schema["components"])

    def operation(self, method: str, path: str) -> dict:
        return self.schema["paths"][path][method.lower()]

    def validator(self, fragment: dict) -> jsonschema.Draft202012Validator:
        return jsonschema.Draft202012Validator({**_strict(copy.deepcopy(fragment)), "components": self.components})

    def body_schema(self, method: str, path: str) -> dict:
        return self.operation(method, path)["requestBody"]["content"]["application/json"]["schema"]

    def resolved(self, fragment: dict) -> dict:
        ref = fragment.get("$ref")
        return self.schema["components"]["schemas"][ref.rsplit("/", 1)[1]] if ref else fragment

    def check(self, method: str, path: str, response: httpx.Response) -> None:
        """The answer's status, content type and body are the ones the schema documents for the operation."""
        where = f"{method} {path} -> {response.status_code}"
        responses = self.operation(method, path)["responses"]
        assert str(response.status_code) in responses, f"{where}: status not documented ({response.text[:200]})"
        content = responses[str(response.status_code)].get("content", {})
        media = response.headers.get("content-type", "").split(";")[0]
        assert media in content, f"{where}: content type {media!r} not documented (documented: {list(content)})"
        if method == "HEAD" or media != "application/json":
            return
        documented = content[media].get("schema", {})
        assert documented, f"{where}: the JSON body's shape is not documented"
        errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
                  for e in self.validator(documented).iter_errors(response.json())]
        assert not errors, f"{where}: body differs from the schema: {errors[:5]}"


@pytest.fixture(scope="module")
def documented(agent):
    return Documented(httpx.get(f"{agent.url}/openapi.json").json())


@pytest.fixture(scope="module")
def uploaded(agent):
    data = conv_model().SerializeToString()
    model_id = hashlib.sha256(data).hexdigest()
    agent.client.upload(data)
    buffer = io.BytesIO()
    np.savez(buffer, x=np.ones((1, 3, 16, 16), np.float32))
    return model_id, base64.b64encode(buffer.getvalue()).decode()


def _concrete(path: str, model_id: str, run_id: str) -> str:
    return path.replace("{model_id}", model_id).replace("{run_id}", run_id)


def test_the_schema_lists_exactly_the_routes_the_agent_serves(agent, documented, uploaded):
    """Every method on every documented path is tried on the running agent: what it answers other than 405
    is what the schema lists, and nothing more."""
    model_id, inputs = uploaded
    headers = {"Authorization": f"Bearer {agent.token}"}
    run = httpx.post(f"{agent.url}/v1/runs", headers=headers, timeout=60,
                     json={"model_id": model_id, "backend": "cpu", "inputs_npz": inputs}).json()
    served = set()
    for path in documented.schema["paths"]:
        for method in PROBED_METHODS:
            body = b"" if method in ("PUT", "POST", "PATCH") else None
            response = httpx.request(method, f"{agent.url}{_concrete(path, model_id, run['run_id'])}",
                                     headers=headers, content=body, timeout=60)
            if response.status_code != 405:
                served.add((method, path))
    listed = {(method.upper(), path) for path, methods in documented.schema["paths"].items() for method in methods}
    assert served == listed


def test_real_answers_match_the_documented_shapes(agent, documented, uploaded):
    """One real call per operation, with and without the token: statuses, content types and every field of
    every JSON body are the documented ones (undocumented fields count as differences)."""
    model_id, inputs = uploaded
    url, headers = agent.url, {"Authorization": f"Bearer {agent.token}"}
    calls = [
        ("GET", "/health", {}),
        ("GET", "/v1/info", {}),
        ("GET", "/v1/models/{model_id}", {}),
        ("GET", "/v1/models/{model_id}/content", {}),
        ("PUT", "/v1/models/{model_id}", {"content": conv_model().SerializeToString()}),
        ("POST", "/v1/runs", {"json": {"model_id": model_id, "backend": "cpu", "inputs_npz": inputs,
                                       "return_placement": True, "return_profile": True}}),
        ("POST", "/v1/runs", {"json": {"model_id": model_id, "backend": "htp", "inputs_npz": inputs,
                                       "return_placement": True, "return_profile": True}}),
        ("POST", "/v1/runs", {"json": {"model_id": model_id, "backend": "cpu", "inputs_npz": inputs,
                                       "return_outputs": False}}),
        ("POST", "/v1/runs/npz", {"content": b"not an npz"}),
        ("POST", "/v1/contexts", {"json": {"model_id": model_id}}),
    ]
    run_ids = []
    for method, path, kwargs in calls:
        response = httpx.request(method, f"{url}{_concrete(path, model_id, '0' * 32)}", headers=headers,
                                 timeout=120, **kwargs)
        documented.check(method, path, response)
        if path == "/v1/runs":
            assert response.status_code == 200, response.text
            run_ids.append(response.json()["run_id"])
        refused = httpx.request(method, f"{url}{_concrete(path, model_id, '0' * 32)}", timeout=60, **kwargs)
        assert refused.status_code == 401
        documented.check(method, path, refused)
    members = {"x": np.ones((1, 3, 16, 16), np.float32),
               "__run__": np.frombuffer(json.dumps({"model_id": model_id, "backend": "cpu"}).encode(), np.uint8)}
    buffer = io.BytesIO()
    np.savez(buffer, **members)
    response = httpx.post(f"{url}/v1/runs/npz", headers=headers, content=buffer.getvalue(), timeout=120)
    assert response.status_code == 200, response.text
    documented.check("POST", "/v1/runs/npz", response)
    with np.load(io.BytesIO(response.content), allow_pickle=False) as answer:
        result = json.loads(answer["__result__"].tobytes())
    assert "RunSummary" in documented.operation("POST", "/v1/runs/npz")["description"]
    errors = [e.message for e in documented.validator({"$ref": "#/components/schemas/RunSummary"}).iter_errors(result)]
    assert not errors, f"the binary run's __result__ differs from RunSummary: {errors[:5]}"
    run_ids.append(result["run_id"])
    for run_id in run_ids:
        response = httpx.get(f"{url}/v1/runs/{run_id}", headers=headers)
        assert response.status_code == 200
        documented.check("GET", "/v1/runs/{run_id}", response)
    documented.check("GET", "/v1/runs/{run_id}", httpx.get(f"{url}/v1/runs/{'0' * 32}", headers=headers))


@pytest.mark.parametrize("path", ["/v1/runs", "/v1/contexts"])
def test_required_fields_are_the_ones_the_agent_requires(agent, documented, uploaded, path):
    """A body missing a field the schema calls required is refused (422); one missing an optional field is
    not refused for it; a body the schema calls invalid is refused as invalid (422), not looked up."""
    model_id, inputs = uploaded
    headers = {"Authorization": f"Bearer {agent.token}"}
    full = {"model_id": model_id, "inputs_npz": inputs, "backend": "cpu"} if path == "/v1/runs" else \
        {"model_id": model_id}
    schema = documented.resolved(documented.body_schema("POST", path))
    required = set(schema.get("required", []))
    assert required <= set(schema["properties"])
    for field in full:
        body = {key: value for key, value in full.items() if key != field}
        response = httpx.post(f"{agent.url}{path}", headers=headers, json=body, timeout=120)
        documented.check("POST", path, response)
        if field in required:
            assert response.status_code == 422, (field, response.text)
        else:
            assert response.status_code < 400, (field, response.status_code, response.text)
    body = {**full, "model_id": "not-a-sha256"}
    assert not documented.validator(documented.body_schema("POST", path)).is_valid(body), \
        "the schema lets through a model id the agent can never hold"
    response = httpx.post(f"{agent.url}{path}", headers=headers, json=body)
    assert response.status_code == 422, response.text


def test_refusals_before_a_route_are_documented(agent, documented):
    """Answers the agent's HTTP guard gives on a request's head alone (an oversized header, a header that
    never ends) are statuses every operation documents."""
    response = httpx.get(f"{agent.url}/health", headers={"Authorization": f"Bearer {agent.token}",
                                                         "X-Padding": "a" * 70_000})
    documented.check("GET", "/health", response)
    host, port = agent.url.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: agent\r\n")  # the head never ends
        started, answer = time.monotonic(), b""
        while b"\r\n\r\n" not in answer and time.monotonic() - started < 8:
            chunk = sock.recv(4096)
            if not chunk:
                break
            answer += chunk
    status = int(answer.split(b" ", 2)[1])
    assert str(status) in documented.operation("GET", "/health")["responses"], answer[:200]
