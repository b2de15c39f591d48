"""The agent over real HTTP on loopback, with real worker processes (ORT CPU and the QNN HTP emulator)."""

from __future__ import annotations

import base64
import io
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import onnx
import pytest
from agent_fixtures import direct_run, models, needs_qnn, random_inputs  # noqa: F401 - fixtures

from mpstudio.agent import AgentClient, AgentError, AgentPool, LocalAgent, RunResult, by_device
from mpstudio.errors import MpstudioError

SLOW_FEEDS = {"x": np.random.default_rng(3).standard_normal((384, 384)).astype(np.float32)}


@pytest.fixture(scope="module")
def agent(tmp_path_factory):
    """The default agent: random port and token, generous timeout."""
    log = tmp_path_factory.mktemp("agent-log") / "agent.log"
    with LocalAgent(run_timeout=60, log_path=log) as local:
        yield local


@pytest.fixture(scope="module")
def tight_agent():
    """An agent with small limits: 1 MB bodies, 2 s run timeout, 2 waiting requests."""
    with LocalAgent(run_timeout=2, max_upload_mb=1, extra_args=("--max-queue", "2")) as local:
        yield local


def wait_until(predicate, timeout=20.0, interval=0.02):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    raise AssertionError("condition not met in time")


# ------------------------------------------------------------------------------------------- basics

def test_info_reports_platform_versions_and_htp_kind(agent):
    info = agent.client.info()
    assert info.onnxruntime.startswith("1.")
    assert "cpu" in info.backends
    assert info.arch and info.os
    assert info.worker_pid and info.worker_pid != agent.pid
    if "htp" in info.backends:
        assert info.onnxruntime_qnn
        assert info.htp_kind in ("npu", "emulator")
        assert info.htp_arch == "75"


def test_openapi_schema_is_served_and_declares_bearer(agent):
    schema = httpx.get(f"{agent.url}/openapi.json").json()
    assert "/v1/runs" in schema["paths"]
    assert schema["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"


def test_cpu_outputs_equal_direct_session(agent, models):
    feeds = random_inputs(5)
    result = agent.client.run(models["a8"], feeds, backend="cpu", iterations=3)
    expected = direct_run(models["a8"], "cpu", feeds)
    assert set(result.outputs) == set(expected)
    for name in expected:
        np.testing.assert_array_equal(result.outputs[name], expected[name])
    assert result.latency.source == "measured" and result.latency.n == 3
    assert result.latency.min_ms <= result.latency.median_ms <= result.latency.p90_ms


def test_upload_is_idempotent_and_verified(agent, models):
    client = agent.client
    model_id = client.upload(models["float"])
    assert client.has_model(model_id)
    assert client.upload(models["float"]) == model_id  # skipped: the agent has it
    raw = httpx.put(f"{agent.url}/v1/models/{model_id}", content=b"anything",
                    headers={"Authorization": f"Bearer {agent.token}"})
    assert raw.status_code == 200 and raw.json()["stored"] is False
    wrong = "0" * 64
    response = httpx.put(f"{agent.url}/v1/models/{wrong}", content=models["float"].read_bytes(),
                         headers={"Authorization": f"Bearer {agent.token}"})
    assert response.status_code == 400 and "sha256" in response.json()["detail"]


def test_ids_are_validated_never_paths(agent):
    headers = {"Authorization": f"Bearer {agent.token}"}
    for bad in ("..%2F..%2Fetc%2Fpasswd", "ABC", "g" * 64):
        response = httpx.get(f"{agent.url}/v1/models/{bad}", headers=headers)
        assert response.status_code in (404, 422), bad
    assert httpx.get(f"{agent.url}/v1/runs/not-a-run", headers=headers).status_code in (404, 422)


def test_model_with_external_data_is_refused(agent, models, tmp_path):
    model = onnx.load(str(models["float"]))
    onnx.save(model, str(tmp_path / "ext.onnx"), save_as_external_data=True, all_tensors_to_one_file=True,
              location="ext.bin", size_threshold=0)
    with pytest.raises(AgentError, match="external") as info:
        agent.client.upload(tmp_path / "ext.onnx")
    assert info.value.status == 422


def test_run_summary_is_kept_by_run_id(agent, models):
    result = agent.client.run(models["a8"], random_inputs(), backend="cpu")
    summary = httpx.get(f"{agent.url}/v1/runs/{result.run_id}",
                        headers={"Authorization": f"Bearer {agent.token}"}).json()
    assert summary["model_id"] == result.model_id and "outputs_npz" not in summary


def test_cpu_profile_maps_kernels_to_onnx_nodes(agent, models):
    result = agent.client.run(models["a8"], random_inputs(), backend="cpu", profile=True, profile_runs=2)
    frame = result.profile.to_frame()
    assert result.profile.unit == "us" and result.profile.source == "measured"
    assert "conv1" in set(frame["node"])
    assert frame.loc[frame["node"] == "conv1", "op_type"].iloc[0] == "Conv"


# ------------------------------------------------------------------------------------------- HTP

@pytest.mark.htp
@needs_qnn
def test_htp_a8_outputs_equal_direct_htp_session_and_are_labelled(agent, models):
    feeds = random_inputs(7)
    result = agent.client.run(models["a8"], feeds, backend="htp", warmup=1, iterations=3, placement=True)
    expected = direct_run(models["a8"], "htp", feeds)
    np.testing.assert_array_equal(result.outputs["y"], expected["y"])
    info = agent.client.info()
    assert result.emulated == (info.htp_kind == "emulator")
    if result.emulated:
        assert result.latency.source == "emulator"
        assert "not device latency" in result.latency.label
        assert not result.latency.is_device_latency
    assert result.placement.fully_on_htp
    assert "conv1" in result.placement.on_htp and result.placement.htp_partitions == 1


@pytest.mark.htp
@needs_qnn
def test_htp_mixed_precision_runs_fully_on_htp(agent, models):
    feeds = random_inputs(8)
    result = agent.client.run(models["mixed"], feeds, placement=True, profile=True, profile_runs=2)
    np.testing.assert_array_equal(result.outputs["y"], direct_run(models["mixed"], "htp", feeds)["y"])
    assert result.placement.fully_on_htp
    frame = result.profile.to_frame()
    assert result.profile.unit == "cycles"
    assert "conv1" in set(frame["node"]) and "fc" in set(frame["node"])
    assert result.profile.source == ("emulator" if result.emulated else "measured")


@pytest.mark.htp
@needs_qnn
def test_sessions_are_reused_per_model_and_options(agent, models):
    client = agent.client
    client.run(models["a8"], random_inputs(), provider_options={"htp_performance_mode": "burst"})
    again = client.run(models["a8"], random_inputs(), provider_options={"htp_performance_mode": "burst"})
    other = client.run(models["a8"], random_inputs(), provider_options={"htp_performance_mode": "balanced"})
    assert again.session_reused and not other.session_reused


@pytest.mark.htp
@needs_qnn
def test_unsupported_op_error_names_node_and_reason(agent, models):
    with pytest.raises(AgentError) as info:
        agent.client.run(models["unsupported"], random_inputs())
    assert info.value.status == 422
    message = str(info.value)
    assert "my_hardmax" in message and "Hardmax" in message and "not supported" in message


@pytest.mark.htp
@needs_qnn
def test_fallback_placement_shows_cpu_node_with_reason(agent, models):
    result = agent.client.run(models["unsupported"], random_inputs(), allow_cpu_fallback=True, placement=True)
    fallbacks = {f.node: f for f in result.placement.on_cpu}
    assert "my_hardmax" in fallbacks and "not supported" in fallbacks["my_hardmax"].reason
    assert not result.placement.fully_on_htp
    assert "conv1" in result.placement.on_htp


@pytest.mark.htp
@needs_qnn
def test_dynamic_shape_error_names_node_and_reason(agent, models):
    with pytest.raises(AgentError) as info:
        agent.client.run(models["dynamic"], random_inputs())
    message = str(info.value)
    assert info.value.status == 422
    assert "conv1" in message and "Cannot get shape" in message and "dynamic input shapes" in message


@pytest.mark.htp
@needs_qnn
def test_context_binary_builds_downloads_and_runs(agent, models, tmp_path):
    client = agent.client
    feeds = random_inputs(9)
    context = client.build_context(models["a8"])
    assert context.source_model_id == client.model_id(models["a8"]) and context.size_bytes > 0
    path = client.download(context.model_id, tmp_path / "a8_ctx.onnx")
    assert any(n.op_type == "EPContext" for n in onnx.load(str(path)).graph.node)
    from_context = client.run(context.model_id, feeds)
    np.testing.assert_array_equal(from_context.outputs["y"], client.run(models["a8"], feeds).outputs["y"])


# ------------------------------------------------------------------------------------------- validation

def test_invalid_provider_option_gives_422_naming_it(agent, models):
    with pytest.raises(AgentError) as info:
        agent.client.run(models["a8"], random_inputs(), provider_options={"htp_arch": "99"})
    assert info.value.status == 422 and "htp_arch" in str(info.value) and "99" in str(info.value)
    with pytest.raises(AgentError) as info:
        agent.client.run(models["a8"], random_inputs(), provider_options={"backend_path": "/tmp/evil.so"})
    assert info.value.status == 422 and "backend_path" in str(info.value)


def test_pickled_npz_is_refused(agent, models):
    client = agent.client
    model_id = client.upload(models["a8"])
    buffer = io.BytesIO()
    np.savez(buffer, x=np.array([{"payload": 1}], dtype=object))
    body = {"model_id": model_id, "backend": "cpu", "inputs_npz": base64.b64encode(buffer.getvalue()).decode()}
    response = httpx.post(f"{agent.url}/v1/runs", json=body, headers={"Authorization": f"Bearer {agent.token}"})
    assert response.status_code == 422 and "pickle" in response.json()["detail"]
    binary = httpx.post(f"{agent.url}/v1/runs/npz", content=buffer.getvalue(),
                        headers={"Authorization": f"Bearer {agent.token}", "Content-Type": "application/octet-stream"})
    assert binary.status_code == 422 and "pickle" in binary.json()["detail"]
    with pytest.raises(MpstudioError, match="pickle"):
        client.run(model_id, {"x": np.array([object()], dtype=object)}, backend="cpu")


def test_json_form_of_a_run_matches_the_binary_form(agent, models):
    client = agent.client
    feeds = random_inputs(12)
    model_id = client.upload(models["a8"])
    buffer = io.BytesIO()
    np.savez(buffer, **feeds)
    body = {"model_id": model_id, "backend": "cpu", "inputs_npz": base64.b64encode(buffer.getvalue()).decode(),
            "iterations": 2}
    response = httpx.post(f"{agent.url}/v1/runs", json=body, headers={"Authorization": f"Bearer {agent.token}"})
    assert response.status_code == 200
    result = RunResult.from_wire(response.json(), agent=agent.url)
    np.testing.assert_array_equal(result.outputs["y"], client.run(model_id, feeds, backend="cpu").outputs["y"])
    assert result.latency.n == 2 and result.latency.source == "measured"


def test_wrong_inputs_name_the_problem(agent, models):
    with pytest.raises(AgentError, match="missing inputs") as info:
        agent.client.run(models["a8"], {"z": np.zeros((1, 3, 16, 16), np.float32)}, backend="cpu")
    assert info.value.status == 422
    with pytest.raises(AgentError, match="shape"):
        agent.client.run(models["a8"], {"x": np.zeros((1, 3, 8, 8), np.float32)}, backend="cpu")


def test_unknown_model_is_404(agent):
    empty_npz = base64.b64encode(b"PK\x05\x06" + bytes(18)).decode()
    body = {"model_id": "a" * 64, "backend": "cpu", "inputs_npz": empty_npz}
    response = httpx.post(f"{agent.url}/v1/runs", json=body, headers={"Authorization": f"Bearer {agent.token}"})
    assert response.status_code == 404


# ------------------------------------------------------------------------------------------- security

def test_wrong_or_missing_token_gives_401(agent):
    for headers in ({}, {"Authorization": "Bearer wrong-token-wrong-token"}, {"Authorization": agent.token}):
        for method, path in (("GET", "/health"), ("GET", "/v1/info"), ("POST", "/v1/runs")):
            response = httpx.request(method, f"{agent.url}{path}", headers=headers, json={})
            assert response.status_code == 401, (headers, path)
            assert response.headers["www-authenticate"] == "Bearer"
    with pytest.raises(AgentError) as info:
        AgentClient(agent.url, "not-the-token-at-all").info()
    assert info.value.status == 401


def test_token_never_reaches_the_log(agent, models):
    agent.client.run(models["a8"], random_inputs(), backend="cpu")
    httpx.get(f"{agent.url}/v1/info", headers={"Authorization": "Bearer guessed-token-value-123"})
    text = agent.log_path.read_text()
    assert "GET /v1/info" in text or "/v1/runs" in text  # the log is really being written
    assert agent.token not in text and "guessed-token-value-123" not in text


def test_non_loopback_address_requires_a_token():
    env = {k: v for k, v in os.environ.items() if k != "MPSTUDIO_AGENT_TOKEN"}
    done = subprocess.run([sys.executable, "-m", "mpstudio.agent", "serve", "--host", "0.0.0.0", "--port", "0"],
                          env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "without a token" in done.stderr
    short = subprocess.run([sys.executable, "-m", "mpstudio.agent", "serve", "--host", "0.0.0.0", "--port", "0"],
                           env={**env, "MPSTUDIO_AGENT_TOKEN": "short"}, capture_output=True, text=True, timeout=60)
    assert short.returncode == 2 and "at least 16" in short.stderr and "short" not in short.stderr.replace(
        "at least 16", "")


def test_oversize_upload_gives_413(tight_agent, models):
    blob = os.urandom(2 * 2**20)
    with pytest.raises(AgentError) as info:
        tight_agent.client.upload(blob)
    assert info.value.status == 413 and "limit" in str(info.value)
    big_inputs = {"x": np.zeros((1, 3, 512, 512), np.float32)}  # 3 MB of inputs in a run request
    with pytest.raises(AgentError) as info:
        tight_agent.client.run(models["a8"], big_inputs, backend="cpu")
    assert info.value.status == 413


# ------------------------------------------------------------------------------------------- failures

def test_hang_hits_the_timeout_and_the_agent_recovers(tight_agent, models):
    client = tight_agent.client
    client.upload(models["slow"])
    pid_before = client.health()["worker_pid"]
    started = time.monotonic()
    with pytest.raises(AgentError) as info:
        client.run(models["slow"], SLOW_FEEDS, backend="cpu", iterations=100_000, outputs=False)
    elapsed = time.monotonic() - started
    assert info.value.status == 504 and "timeout" in str(info.value)
    assert elapsed < 30
    assert client.health()["worker_pid"] != pid_before
    result = client.run(models["a8"], random_inputs(), backend="cpu")
    assert "y" in result.outputs


def test_worker_killed_mid_run_gives_error_and_next_request_succeeds(agent, models):
    client = agent.client
    client.upload(models["slow"])
    client.run(models["slow"], SLOW_FEEDS, backend="cpu")  # the session exists; the long run starts at once
    pid = client.health()["worker_pid"]
    outcome: dict = {}

    def long_run():
        with AgentClient(agent.url, agent.token, retries=0) as other:
            try:
                other.run(models["slow"], SLOW_FEEDS, backend="cpu", iterations=100_000, outputs=False)
            except AgentError as exc:
                outcome["error"] = exc

    thread = threading.Thread(target=long_run)
    thread.start()
    wait_until(lambda: client.health()["busy"])
    time.sleep(0.3)
    os.kill(pid, signal.SIGKILL)
    thread.join(timeout=60)
    error = outcome["error"]
    assert error.status == 502 and "died" in str(error)
    feeds = random_inputs(11)
    result = client.run(models["a8"], feeds, backend="cpu")
    np.testing.assert_array_equal(result.outputs["y"], direct_run(models["a8"], "cpu", feeds)["y"])
    health = client.health()
    assert health["worker_pid"] != pid and health["worker_restarts"] >= 1


# ------------------------------------------------------------------------------------------- load

def test_many_concurrent_clients_are_all_answered(agent, models):
    model_id = agent.client.upload(models["a8"])
    expected = {seed: direct_run(models["a8"], "cpu", random_inputs(seed))["y"] for seed in range(24)}

    def one(seed):
        with AgentClient(agent.url, agent.token) as client:
            return seed, client.run(model_id, random_inputs(seed), backend="cpu", iterations=2)

    with ThreadPoolExecutor(max_workers=24) as pool:
        results = list(pool.map(one, range(24)))
    assert len(results) == 24
    for seed, result in results:
        np.testing.assert_array_equal(result.outputs["y"], expected[seed])


def test_queue_is_bounded_and_waiting_requests_are_served(tight_agent, models):
    client = tight_agent.client
    client.upload(models["slow"])
    client.upload(models["a8"])
    outcome: dict = {}

    def long_run():
        try:
            client.run(models["slow"], SLOW_FEEDS, backend="cpu", iterations=100_000, outputs=False)
        except AgentError as exc:
            outcome["long"] = exc.status

    thread = threading.Thread(target=long_run)
    thread.start()
    wait_until(lambda: client.health()["busy"])

    def short(seed):
        with AgentClient(tight_agent.url, tight_agent.token, retries=0) as other:
            try:
                return other.run(models["a8"], random_inputs(seed), backend="cpu").outputs["y"].shape
            except AgentError as exc:
                return exc.status

    with ThreadPoolExecutor(max_workers=5) as pool:
        answers = list(pool.map(short, range(5)))
    thread.join(timeout=60)
    assert outcome["long"] == 504  # the 2 s run timeout
    assert answers.count(503) == 3 and answers.count((1, 16)) == 2, answers


def test_pool_spreads_runs_skips_unhealthy_and_keeps_devices_apart(agent, tight_agent, models):
    dead = AgentClient("http://127.0.0.1:9", retries=0, connect_timeout=0.5)  # nothing listens on port 9
    pool = AgentPool([agent.client, tight_agent.client, dead])
    assert dead not in pool.healthy()
    feeds = [random_inputs(seed) for seed in range(12)]
    results = pool.map(models["a8"], feeds, backend="cpu")
    for feed, result in zip(feeds, results):
        np.testing.assert_array_equal(result.outputs["y"], direct_run(models["a8"], "cpu", feed)["y"])
    used = {r.agent for r in results}
    assert dead.url not in used and len(used) == 2
    groups = by_device(results)
    assert sum(len(g) for g in groups.values()) == 12 and len(groups) == 2
    single = pool.run(models["a8"], feeds[0], backend="cpu")
    assert single.agent in (agent.url, tight_agent.url)
    everywhere = pool.run_everywhere(models["a8"], feeds[0], backend="cpu")
    assert len(everywhere) == 2
