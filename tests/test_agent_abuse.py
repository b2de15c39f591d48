"""The agent under abuse and faults, over real sockets on loopback: zip bombs, slow and idle connections,
models that point at other files, a full disk, chunked bodies, a dead worker, tokens in URLs."""

from __future__ import annotations

import hashlib
import io
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import zipfile
import zlib
from urllib.parse import urlsplit

import httpx
import numpy as np
import onnx
import pytest
from agent_fixtures import direct_run, models, random_inputs  # noqa: F401 - fixtures
from numpy.lib import format as npy
from onnx import TensorProto, helper, numpy_helper

from mpstudio.agent import AgentClient, AgentError, LocalAgent
from mpstudio.agent.protocol import RUN_MEMBER, encode_npz

HAS_HTTPTOOLS = __import__("importlib.util").util.find_spec("httptools") is not None
PARSERS = ["h11", pytest.param("httptools", marks=pytest.mark.skipif(not HAS_HTTPTOOLS,
                                                                     reason="httptools is not installed"))]
TIMEOUT = 1.5  # header, body and request timeouts of the tight agents below, in seconds
UPLOAD_MB = 1


@pytest.fixture(scope="module", params=PARSERS)
def tight(request, tmp_path_factory):
    """An agent with a 1 MB upload limit, 1.5 s read timeouts and 24 connections, on the given HTTP parser."""
    log = tmp_path_factory.mktemp(f"abuse-{request.param}") / "agent.log"
    args = ("--http", request.param, "--header-timeout", str(TIMEOUT), "--body-timeout", str(TIMEOUT),
            "--request-timeout", str(3 * TIMEOUT), "--max-connections", "24")
    with LocalAgent(max_upload_mb=UPLOAD_MB, run_timeout=30, extra_args=args, log_path=log) as local:
        yield local


@pytest.fixture(scope="module")
def store_agent(tmp_path_factory):
    """An agent whose model store holds about two 16 KB models, one upload at a time."""
    workdir = tmp_path_factory.mktemp("store-agent")
    with LocalAgent(workdir=workdir, extra_args=("--max-store-mb", "0.04", "--max-uploads", "1")) as local:
        local.models_dir = workdir / "models"
        yield local


def auth(agent) -> dict:
    return {"Authorization": f"Bearer {agent.token}"}


def address(agent) -> tuple[str, int]:
    parts = urlsplit(agent.url)
    return parts.hostname, parts.port


def connect(agent, timeout: float = 10.0) -> socket.socket:
    sock = socket.create_connection(address(agent), timeout=timeout)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def read_until_closed(sock: socket.socket, limit: float) -> tuple[bytes, float]:
    """Everything the server sends until it closes the connection, and when it closed (s from now)."""
    started = time.monotonic()
    sock.settimeout(limit)
    data = b""
    try:
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    except ConnectionResetError:
        pass
    except TimeoutError:
        return data, float("inf")
    return data, time.monotonic() - started


def status_of(response: bytes) -> int | None:
    return int(response.split(b" ", 2)[1]) if response.startswith(b"HTTP/1.1 ") else None


def memory_kb(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM (peak resident memory) of a process, in kB."""
    fields = {}
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            name, _, value = line.partition(":")
            if name in ("VmRSS", "VmHWM"):
                fields[name] = int(value.split()[0])
    return fields


def matmul_model(seed: int, size: int = 64) -> bytes:
    """A ~16 KB model (one MatMul with a random size x size weight): distinct bytes per seed."""
    weight = np.random.default_rng(seed).standard_normal((size, size)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["y"], name="mm")], "mm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, size])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, size])],
        [numpy_helper.from_array(weight, "W")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10).SerializeToString()


# ------------------------------------------------------------------------------------------- 1. npz bomb

def _zip(members: list[tuple[str, bytes, int, int, int]]) -> bytes:
    """A zip archive from (name, deflated data, crc32, uncompressed size, method) members, written by hand so
    a member can inflate to far more than anything held in memory here."""
    local_parts, central, offset = [], b"", 0
    for name, data, crc, size, method in members:
        raw = name.encode()
        local = struct.pack("<4sHHHHHIIIHH", b"PK\x03\x04", 20, 0, method, 0, 0, crc, len(data), size,
                            len(raw), 0) + raw
        central += struct.pack("<4sHHHHHHIIIHHHHHII", b"PK\x01\x02", 20, 20, 0, method, 0, 0, crc, len(data),
                               size, len(raw), 0, 0, 0, 0, 0, offset) + raw
        local_parts.append(local + data)
        offset += len(local) + len(data)
    end = struct.pack("<4sHHHHIIH", b"PK\x05\x06", 0, 0, len(members), len(members), len(central), offset, 0)
    return b"".join(local_parts) + central + end


def _npy_header(shape, descr="|u1") -> bytes:
    buffer = io.BytesIO()
    npy.write_array_header_1_0(buffer, {"descr": descr, "fortran_order": False, "shape": tuple(shape)})
    return buffer.getvalue()


def _run_member(model_id: str) -> tuple[str, bytes, int, int, int]:
    spec = json.dumps({"model_id": model_id, "backend": "cpu"}).encode()
    data = _npy_header((len(spec),)) + spec
    return f"{RUN_MEMBER}.npy", data, zlib.crc32(data), len(data), 0


def npz_bomb(model_id: str, body_bytes: int) -> tuple[bytes, int]:
    """A run request of at most `body_bytes` whose one input, all zeros, inflates about 1000-fold.

    Raw deflate blocks ended by a full flush are byte-aligned and independent, so one compressed MB of
    zeros repeated is a valid stream for many MB, with no need to compress them all here.
    """
    chunk = 1 << 20
    compressor = zlib.compressobj(9, zlib.DEFLATED, -15)
    piece = compressor.compress(bytes(chunk)) + compressor.flush(zlib.Z_FULL_FLUSH)
    run = _run_member(model_id)
    repeats = (body_bytes - len(run[1]) - 1024) // len(piece)
    size = repeats * chunk
    header = _npy_header((size,))
    compressor = zlib.compressobj(9, zlib.DEFLATED, -15)
    head = compressor.compress(header) + compressor.flush(zlib.Z_FULL_FLUSH)
    tail = zlib.compressobj(9, zlib.DEFLATED, -15).flush(zlib.Z_FINISH)
    crc = zlib.crc32(header)
    zeros = bytes(chunk)
    for _ in range(repeats):
        crc = zlib.crc32(zeros, crc)
    body = _zip([("x.npy", head + piece * repeats + tail, crc, len(header) + size, 8), run])
    assert len(body) <= body_bytes
    return body, len(header) + size


def test_npz_bomb_at_the_upload_limit_is_refused_with_bounded_memory(tight, models):
    client = tight.client
    model_id = client.upload(models["a8"])
    client.run(model_id, random_inputs(), backend="cpu")  # the worker is up and has run once
    body, inflated = npz_bomb(model_id, UPLOAD_MB * 2**20)
    assert inflated > 900 * 2**20 and len(body) > 0.99 * UPLOAD_MB * 2**20
    worker = client.health()["worker_pid"]
    server_before, worker_before = memory_kb(tight.pid), memory_kb(worker)
    health_times = []
    stop = threading.Event()

    def poll_health():
        with AgentClient(tight.url, tight.token) as other:
            while not stop.is_set():
                started = time.monotonic()
                other.health(timeout=30)
                health_times.append(time.monotonic() - started)
                time.sleep(0.02)

    poller = threading.Thread(target=poll_health)
    poller.start()
    try:
        for _ in range(3):
            response = httpx.post(f"{tight.url}/v1/runs/npz", content=body, timeout=60,
                                  headers={**auth(tight), "Content-Type": "application/octet-stream"})
            assert response.status_code == 413, response.text
            assert "decompressed" in response.json()["detail"] and "--max-inputs-mb" in response.json()["detail"]
    finally:
        stop.set()
        poller.join(timeout=30)
    server_after, worker_after = memory_kb(tight.pid), memory_kb(worker)
    assert server_after["VmHWM"] - server_before["VmHWM"] < 64 * 1024, (server_before, server_after)
    assert worker_after["VmHWM"] - worker_before["VmHWM"] < 16 * 1024, (worker_before, worker_after)
    assert max(health_times) < 2.0, health_times
    assert client.health()["worker_pid"] == worker  # the worker never saw it


def test_npz_declaring_a_huge_shape_is_422(tight, models):
    model_id = tight.client.upload(models["a8"])
    header = _npy_header((2**40,), "<f4")
    data = header + bytes(64)
    body = _zip([("x.npy", data, zlib.crc32(data), len(data), 0), _run_member(model_id)])
    response = httpx.post(f"{tight.url}/v1/runs/npz", content=body, headers=auth(tight))
    assert response.status_code == 422 and "declares shape [1099511627776]" in response.json()["detail"]


def test_npz_member_that_is_not_an_array_is_refused(tight, models):
    model_id = tight.client.upload(models["a8"])
    data = b"raw bytes that np.load would return as they are"
    body = _zip([("x", data, zlib.crc32(data), len(data), 0), _run_member(model_id)])
    response = httpx.post(f"{tight.url}/v1/runs/npz", content=body, headers=auth(tight))
    assert response.status_code == 422 and "not an .npy array" in response.json()["detail"]


# ------------------------------------------------------------------------------------------- 2. slow clients

def test_incomplete_requests_are_closed_in_time(tight):
    """Silent sockets, half-sent headers, a header dripped byte by byte and a stalled body: all closed."""
    host, _ = address(tight)
    silent = [connect(tight) for _ in range(4)]
    half_headers = [connect(tight) for _ in range(4)]
    for sock in half_headers:
        sock.sendall(f"GET /health HTTP/1.1\r\nHost: {host}\r\nX-Slow: ".encode())
    stalled_body = [connect(tight) for _ in range(4)]
    for sock in stalled_body:
        sock.sendall(f"PUT /v1/models/{'a' * 64} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {tight.token}\r\n"
                     "Content-Type: application/octet-stream\r\nContent-Length: 100000\r\n\r\nabc".encode())
    drip = connect(tight)
    dripped = threading.Event()

    def drip_headers():  # a byte every 0.3 s never finishes, and never goes quiet for a whole timeout
        try:
            for byte in b"GET /health HTTP/1.1\r\nX-Slow: " + b"a" * 100:
                drip.sendall(bytes([byte]))
                time.sleep(0.3)
        except OSError:
            dripped.set()

    dripper = threading.Thread(target=drip_headers, daemon=True)
    dripper.start()
    for sock in silent + half_headers:
        response, closed_after = read_until_closed(sock, 10 * TIMEOUT)
        assert closed_after < 3 * TIMEOUT, "an idle or half-sent request was never closed"
        assert status_of(response) == 408 and b"headers" in response
    for sock in stalled_body:
        response, closed_after = read_until_closed(sock, 10 * TIMEOUT)
        assert closed_after < 3 * TIMEOUT, "a stalled body was never closed"
    dripper.join(timeout=10 * TIMEOUT)
    assert dripped.is_set(), "a header dripped byte by byte was never cut off"
    for sock in silent + half_headers + stalled_body + [drip]:
        sock.close()
    assert tight.client.health()["status"] == "ok"


def test_a_body_dripped_byte_by_byte_is_cut_off_at_the_request_timeout(tight):
    host, _ = address(tight)
    sock = connect(tight)
    sock.sendall(f"PUT /v1/models/{'c' * 64} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {tight.token}\r\n"
                 "Content-Length: 100000\r\n\r\n".encode())
    started = time.monotonic()
    cut = None
    while time.monotonic() - started < 10 * TIMEOUT:  # never silent for a whole body timeout
        try:
            sock.sendall(b"x")
        except OSError:
            cut = time.monotonic() - started
            break
        time.sleep(0.25)
    sock.close()
    assert cut is not None and cut < 3 * TIMEOUT + 2.0, cut  # the request timeout is 3 x TIMEOUT


def test_connections_over_the_cap_are_refused_and_a_real_client_is_served_after(tight):
    held = [connect(tight) for _ in range(24)]  # the cap, counting none of the client's own
    try:
        extra = connect(tight)
        response, closed_after = read_until_closed(extra, 5.0)
        extra.close()
        assert status_of(response) == 503 and b"open connections" in response and closed_after < 1.0
    finally:
        started = time.monotonic()
        with AgentClient(tight.url, tight.token, retries=8, backoff_s=0.25) as client:
            info = client.info(refresh=True)  # retried on 503: served once the idle sockets time out
        waited = time.monotonic() - started
        for sock in held:
            sock.close()
    assert info.device and waited < 4 * TIMEOUT


def test_oversized_headers_are_refused(tight):
    sock = connect(tight)
    try:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")
        for _ in range(80):  # 80 KB of headers, past the 64 KB limit, with either parser
            sock.sendall(b"X-Filler: " + b"a" * 1010 + b"\r\n")
    except OSError:
        pass  # the server may have answered and closed already
    response, _ = read_until_closed(sock, 10.0)
    sock.close()
    assert status_of(response) in (400, 431)


# ------------------------------------------------------------------------------------------- 3. external data

def _with_external(tensor: onnx.TensorProto, location: str) -> onnx.TensorProto:
    tensor.ClearField("raw_data")
    tensor.data_location = TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", "0"), ("length", "64")):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value
    return tensor


def _model_with_constant(constant: onnx.NodeProto) -> onnx.ModelProto:
    graph = helper.make_graph(
        [constant, helper.make_node("Add", ["x", "c"], ["y"], name="add")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [16])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def external_data_models(other_model_id: str) -> dict[str, bytes]:
    """Models whose tensors read another stored model's bytes, each hiding the tensor somewhere else."""
    target = f"{other_model_id}.onnx"
    values = numpy_helper.from_array(np.zeros(16, np.float32), "c")
    constant = helper.make_node("Constant", [], ["c"], name="const", value=_with_external(values, target))
    sparse = helper.make_sparse_tensor(_with_external(numpy_helper.from_array(np.zeros(4, np.float32), "v"), target),
                                       numpy_helper.from_array(np.arange(4, dtype=np.int64), "i"), [16])
    sparse_constant = helper.make_node("Constant", [], ["c"], name="const", sparse_value=sparse)
    branch_values = _with_external(numpy_helper.from_array(np.zeros(16, np.float32), "b"), target)
    branch = helper.make_graph([helper.make_node("Constant", [], ["b_out"], value=branch_values)], "then", [],
                               [helper.make_tensor_value_info("b_out", TensorProto.FLOAT, [16])])
    plain = helper.make_graph([helper.make_node("Constant", [], ["e_out"],
                                                value=numpy_helper.from_array(np.ones(16, np.float32)))],
                              "else", [], [helper.make_tensor_value_info("e_out", TensorProto.FLOAT, [16])])
    flag = helper.make_node("Constant", [], ["flag"], value=numpy_helper.from_array(np.array(True)))
    if_graph = helper.make_graph(
        [flag, helper.make_node("If", ["flag"], ["c"], name="if", then_branch=branch, else_branch=plain),
         helper.make_node("Add", ["x", "c"], ["y"], name="add")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [16])])
    if_model = helper.make_model(if_graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    loop_init = _with_external(numpy_helper.from_array(np.zeros(16, np.float32), "w"), target)
    body = helper.make_graph([helper.make_node("Add", ["v_in", "w"], ["v_out"]),
                              helper.make_node("Identity", ["cond_in"], ["cond_out"])], "body",
                             [helper.make_tensor_value_info("i", TensorProto.INT64, []),
                              helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
                              helper.make_tensor_value_info("v_in", TensorProto.FLOAT, [16])],
                             [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
                              helper.make_tensor_value_info("v_out", TensorProto.FLOAT, [16])], [loop_init])
    loop_graph = helper.make_graph(
        [helper.make_node("Constant", [], ["n"], value=numpy_helper.from_array(np.array(1, np.int64))),
         helper.make_node("Constant", [], ["t"], value=numpy_helper.from_array(np.array(True))),
         helper.make_node("Loop", ["n", "t", "x"], ["y"], name="loop", body=body)], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [16])])
    loop_model = helper.make_model(loop_graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    function = helper.make_function(
        "local", "AddConst", ["a"], ["b"],
        [helper.make_node("Constant", [], ["k"], value=_with_external(
            numpy_helper.from_array(np.zeros(16, np.float32), "k"), target)),
         helper.make_node("Add", ["a", "k"], ["b"])],
        [helper.make_opsetid("", 17)])
    function_graph = helper.make_graph(
        [helper.make_node("AddConst", ["x"], ["y"], domain="local")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [16])])
    function_model = helper.make_model(function_graph, functions=[function], ir_version=10,
                                       opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("local", 1)])
    return {
        "Loop body initializer": loop_model.SerializeToString(),
        "function body Constant": function_model.SerializeToString(),
        "Constant value": _model_with_constant(constant).SerializeToString(),
        "Constant sparse_value": _model_with_constant(sparse_constant).SerializeToString(),
        "If branch": if_model.SerializeToString(),
    }


def test_external_data_anywhere_in_the_model_is_refused(tight, models):
    client = tight.client
    other = client.upload(models["float"])
    for where, data in external_data_models(other).items():
        with pytest.raises(AgentError, match="external file") as info:
            client.upload(data)
        assert info.value.status == 422, where
        assert not client.has_model(hashlib.sha256(data).hexdigest()), where


# ------------------------------------------------------------------------------------------- 4. disk and uploads

def test_empty_upload_is_refused(tight):
    empty = hashlib.sha256(b"").hexdigest()
    response = httpx.put(f"{tight.url}/v1/models/{empty}", content=b"", headers=auth(tight))
    assert response.status_code == 422 and "empty" in response.json()["detail"]
    assert not tight.client.has_model(empty)


def test_model_store_keeps_its_quota_by_evicting_the_least_recently_used(store_agent):
    client = store_agent.client
    first, second, third = (matmul_model(seed) for seed in range(3))
    ids = [client.upload(first), client.upload(second)]
    feeds = {"x": np.ones((1, 64), np.float32)}
    client.run(ids[0], feeds, backend="cpu")  # the first is now the most recently used
    ids.append(client.upload(third))
    present = [client.has_model(model_id) for model_id in ids]
    assert present == [True, False, True]
    stored = sum(p.stat().st_size for p in store_agent.models_dir.glob("*.onnx"))
    assert stored <= 0.04 * 2**20
    # A model larger than the whole store is refused before its body is read.
    with pytest.raises(AgentError, match="--max-store-mb") as info:
        client.upload(matmul_model(9, size=128))
    assert info.value.status == 413
    # An evicted model comes back: the client uploads it again when the agent lost it.
    result = client.run(second, feeds, backend="cpu")
    np.testing.assert_allclose(result.outputs["y"], feeds["x"] @ np.random.default_rng(1).standard_normal(
        (64, 64)).astype(np.float32), rtol=1e-5, atol=1e-4)


def test_concurrent_uploads_are_limited(store_agent):
    host, _ = address(store_agent)
    data = matmul_model(5)
    model_id = hashlib.sha256(data).hexdigest()
    slow = connect(store_agent)
    slow.sendall(f"PUT /v1/models/{'b' * 64} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {store_agent.token}"
                 f"\r\nContent-Length: {len(data)}\r\n\r\n".encode() + data[:100])
    time.sleep(0.3)  # the first upload holds the one slot
    busy = httpx.put(f"{store_agent.url}/v1/models/{model_id}", content=data, headers=auth(store_agent))
    assert busy.status_code == 503 and "--max-uploads" in busy.json()["detail"]
    assert busy.headers["retry-after"]
    slow.close()
    with AgentClient(store_agent.url, store_agent.token, retries=6, backoff_s=0.2) as client:
        assert client.upload(data) == model_id and client.has_model(model_id)


# ------------------------------------------------------------------------------------------- 5. body limit

@pytest.mark.parametrize("encoding", ["chunked", "Chunked", "CHUNKED"])
def test_chunked_body_is_refused_whatever_the_parser(tight, encoding):
    host, _ = address(tight)
    sock = connect(tight)
    sock.sendall(f"POST /v1/runs/npz HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {tight.token}\r\n"
                 f"Content-Type: application/octet-stream\r\nTransfer-Encoding: {encoding}\r\n\r\n".encode())
    chunk = b"%x\r\n" % (1 << 20) + bytes(1 << 20) + b"\r\n"
    sent = 0
    try:
        for _ in range(64):  # 64 MB offered against a 1 MB limit
            sock.sendall(chunk)
            sent += len(chunk)
    except OSError:
        pass
    response, _ = read_until_closed(sock, 10.0)
    sock.close()
    assert status_of(response) == 411, response[:200]
    assert sent < 32 * 2**20  # the server stopped reading long before the end


# ------------------------------------------------------------------------------------------- 9. the rest

def test_worker_that_died_while_idle_is_replaced_without_an_error(tight, models):
    client = tight.client
    feeds = random_inputs(4)
    client.run(models["a8"], feeds, backend="cpu")
    health = client.health()
    os.kill(health["worker_pid"], signal.SIGKILL)
    deadline = time.monotonic() + 20
    while client.health()["worker_alive"] and time.monotonic() < deadline:
        time.sleep(0.05)
    with AgentClient(tight.url, tight.token, retries=0) as once:  # no retry may hide a 502
        result = once.run(models["a8"], feeds, backend="cpu")
    np.testing.assert_array_equal(result.outputs["y"], direct_run(models["a8"], "cpu", feeds)["y"])
    after = client.health()
    assert after["worker_pid"] != health["worker_pid"] and after["worker_restarts"] == health["worker_restarts"] + 1


def test_tokens_in_the_url_are_refused_and_never_logged(tight):
    secret = "url-secret-0123456789abcdef"
    for query in (f"token={secret}", f"access_token={secret}", f"api_key={secret}"):
        response = httpx.get(f"{tight.url}/health?{query}", headers=auth(tight))
        assert response.status_code == 400 and "Authorization" in response.json()["detail"]
    other = "other-value-0123456789abcdef"
    assert httpx.get(f"{tight.url}/health?x={other}", headers=auth(tight)).status_code == 200
    time.sleep(0.2)
    text = tight.log_path.read_text()
    assert "GET /health?<redacted>" in text  # the access log is written, query strings removed
    assert secret not in text and other not in text and tight.token not in text


@pytest.mark.parametrize("token", ["                    ", "  padded-token-0123456789  ", "tab\tinside-0123456789"])
def test_unusable_tokens_are_refused_at_start(token):
    env = {**os.environ, "MPSTUDIO_AGENT_TOKEN": token}
    done = subprocess.run([sys.executable, "-m", "mpstudio.agent", "serve", "--port", "0"], env=env,
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2
    assert "token" in done.stderr and "whitespace" in done.stderr
    assert token.strip() == "" or token.strip() not in done.stderr


def test_small_inputs_still_run_through_the_json_and_binary_forms(tight, models):
    """The limits leave ordinary work alone: both run forms, compressed inputs included."""
    client = tight.client
    model_id = client.upload(models["a8"])
    feeds = random_inputs(21)
    expected = direct_run(models["a8"], "cpu", feeds)["y"]
    np.testing.assert_array_equal(client.run(model_id, feeds, backend="cpu").outputs["y"], expected)
    buffer = io.BytesIO()
    np.savez_compressed(buffer, **feeds, **{RUN_MEMBER: np.frombuffer(
        json.dumps({"model_id": model_id, "backend": "cpu"}).encode(), np.uint8)})
    response = httpx.post(f"{tight.url}/v1/runs/npz", content=buffer.getvalue(), headers=auth(tight))
    assert response.status_code == 200
    with zipfile.ZipFile(io.BytesIO(response.content)) as archive:
        assert "y.npy" in archive.namelist()
    assert len(encode_npz(feeds)) < UPLOAD_MB * 2**20


# ------------------------------------------------------------------------------------------- round 2

@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    """An agent with a 3 s run timeout."""
    root = tmp_path_factory.mktemp("quick")
    with LocalAgent(run_timeout=3, log_path=root / "agent.log", workdir=root / "work") as local:
        local.workdir = root / "work"
        yield local


def test_a_worker_that_stops_reading_neither_freezes_the_agent_nor_escapes_the_run_timeout(quick, models):
    """Inputs far larger than the pipe's buffer, sent to a worker that no longer reads (SIGSTOP)."""
    client = quick.client
    model_id = client.upload(models["slow"])
    feeds = {"x": np.random.default_rng(3).standard_normal((384, 384)).astype(np.float32)}  # 590 KB
    client.run(model_id, feeds, backend="cpu", iterations=1)
    worker = client.health()["worker_pid"]
    os.kill(worker, signal.SIGSTOP)
    outcome = {}

    def run_it():
        started = time.monotonic()
        with AgentClient(quick.url, quick.token, retries=0, timeout=30) as once:
            try:
                once.run(model_id, feeds, backend="cpu", iterations=1)
                outcome["error"] = None
            except AgentError as exc:
                outcome["error"] = exc
        outcome["took"] = time.monotonic() - started

    runner = threading.Thread(target=run_it)
    try:
        runner.start()
        health_times = []
        while runner.is_alive() and len(health_times) < 60:
            started = time.monotonic()
            response = httpx.get(f"{quick.url}/health", headers=auth(quick), timeout=5)
            health_times.append(time.monotonic() - started)
            assert response.status_code == 200
            time.sleep(0.1)
        runner.join(timeout=30)
    finally:
        try:
            os.kill(worker, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert max(health_times) < 1.0, health_times
    assert outcome["error"] is not None and outcome["error"].status == 504, outcome
    assert outcome["took"] < 3 + 8, outcome
    after = client.health()
    assert after["worker_pid"] != worker
    np.testing.assert_allclose(client.run(model_id, feeds, backend="cpu", iterations=1).outputs["y"],
                               direct_run(models["slow"], "cpu", feeds)["y"], rtol=1e-5, atol=1e-5)


@pytest.fixture(scope="module")
def queueing(tmp_path_factory):
    """An agent whose queued runs may hold 1 MB of requests between them, and 64 MB of inputs per run."""
    log = tmp_path_factory.mktemp("queueing") / "agent.log"
    with LocalAgent(run_timeout=60, log_path=log,
                    extra_args=("--max-queued-mb", "1", "--max-inputs-mb", "64")) as local:
        yield local


def _keep_busy(agent, model_id: str, seconds: float) -> threading.Thread:
    """A thread running the slow model for about `seconds`; returns once the device is busy."""
    feeds = {"x": np.random.default_rng(5).standard_normal((384, 384)).astype(np.float32)}
    started = time.monotonic()
    agent.client.run(model_id, feeds, backend="cpu", iterations=3)
    per_run = (time.monotonic() - started) / 4
    iterations = max(int(seconds / per_run), 10)

    def run():
        with AgentClient(agent.url, agent.token, retries=0) as busy:
            busy.run(model_id, feeds, backend="cpu", iterations=iterations)

    thread = threading.Thread(target=run)
    thread.start()
    deadline = time.monotonic() + 10
    while not agent.client.health()["busy"] and time.monotonic() < deadline:
        time.sleep(0.01)
    return thread


def _npz_run(model_id: str, **arrays) -> bytes:
    buffer = io.BytesIO()
    spec = json.dumps({"model_id": model_id, "backend": "cpu"}).encode()
    np.savez_compressed(buffer, **arrays, **{RUN_MEMBER: np.frombuffer(spec, np.uint8)})
    return buffer.getvalue()


def test_queued_runs_hold_their_requests_not_their_decoded_arrays(queueing, models):
    """Six runs of 48 MB of zeros each (compressed to ~50 KB) wait behind a busy device."""
    model_id = queueing.client.upload(models["slow"])
    body = _npz_run(model_id, x=np.zeros(12 * 2**20, np.float32))
    assert len(body) < 100 * 1024
    before = memory_kb(queueing.pid)
    busy = _keep_busy(queueing, model_id, 4.0)
    statuses = []

    def post():
        response = httpx.post(f"{queueing.url}/v1/runs/npz", content=body, headers=auth(queueing), timeout=60)
        statuses.append(response.status_code)

    posters = [threading.Thread(target=post) for _ in range(6)]
    for thread in posters:
        thread.start()
    for thread in posters:
        thread.join(timeout=60)
    busy.join(timeout=60)
    after = memory_kb(queueing.pid)
    assert statuses == [422] * 6  # each ran in turn, and the worker refused the wrong shape
    grown_mb = (after["VmHWM"] - before["VmHWM"]) / 1024
    # One run decoded at a time peaks near 3 x 48 MB (the array, its pickle for the worker, the read buffer);
    # all six decoded while they wait would take 6 x 48 = 288 MB and more.
    assert grown_mb < 240, (before, after)


def test_runs_past_the_queue_byte_budget_get_503(queueing, models):
    model_id = queueing.client.upload(models["slow"])
    body = _npz_run(model_id, x=np.random.default_rng(0).standard_normal(180_000).astype(np.float32))
    assert 0.6 * 2**20 < len(body) < 2**20
    busy = _keep_busy(queueing, model_id, 3.0)
    results = []

    def post():
        response = httpx.post(f"{queueing.url}/v1/runs/npz", content=body, headers=auth(queueing), timeout=60)
        results.append((response.status_code, response.json().get("detail", "") if response.status_code != 200
                        else ""))

    first = threading.Thread(target=post)
    first.start()
    deadline = time.monotonic() + 10
    while queueing.client.health()["queued"] < 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    post()  # the second would take the queue past 1 MB
    first.join(timeout=60)
    busy.join(timeout=60)
    status, detail = results[0]
    assert status == 503 and "--max-queued-mb" in detail, results
    assert results[1][0] == 422  # the first waited, then ran (the shape is wrong for the model)


def _connect_from(agent, source: str) -> socket.socket:
    sock = socket.create_connection(address(agent), timeout=10, source_address=(source, 0))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def test_clients_without_the_token_cannot_hold_every_connection(tmp_path):
    """Three addresses of loopback hold all 24 connections without sending a byte; one of them cannot hold
    more than 8, and a client with the token is served at once, not after the 10 s header timeout."""
    args = ("--max-connections", "24", "--max-unauthenticated-per-client", "8", "--header-timeout", "10")
    with LocalAgent(extra_args=args, log_path=tmp_path / "agent.log") as agent:
        held = [_connect_from(agent, "127.0.0.2") for _ in range(8)]
        try:
            extra = _connect_from(agent, "127.0.0.2")
            response, closed_after = read_until_closed(extra, 5.0)
            extra.close()
            assert status_of(response) == 503 and b"not sent the token" in response and closed_after < 1.0
            held += [_connect_from(agent, f"127.0.0.{n}") for n in (3, 4, 5) for _ in range(8)]  # past the cap
            time.sleep(0.3)
            started = time.monotonic()
            with AgentClient(agent.url, agent.token, retries=0) as client:
                assert client.health(timeout=5)["status"] == "ok"
                assert client.info(refresh=True).device
            assert time.monotonic() - started < 3.0
            gave_way = []
            for sock in held:  # the oldest gave way, with a reason
                sock.settimeout(0.05)
                try:
                    gave_way.append(sock.recv(4096))
                except TimeoutError:
                    pass
            assert gave_way and all(status_of(r) == 503 and b"make room" in r for r in gave_way), gave_way
        finally:
            for sock in held:
                sock.close()


def test_a_zip_whose_end_record_understates_its_members_is_held_to_the_member_cap(tight, models):
    model_id = tight.client.upload(models["a8"])
    empty = _npy_header((0,))
    members = [(f"m{i}.npy", empty, zlib.crc32(empty), len(empty), 0) for i in range(3000)]
    body = bytearray(_zip([*members, _run_member(model_id)]))
    at = body.rfind(b"PK\x05\x06")
    body[at + 8:at + 12] = struct.pack("<HH", 2, 2)  # the end record claims two members
    started = time.monotonic()
    response = httpx.post(f"{tight.url}/v1/runs/npz", content=bytes(body), headers=auth(tight), timeout=30)
    assert response.status_code == 422 and "members; at most 1024" in response.json()["detail"], response.text
    assert time.monotonic() - started < 2.0


def tile_model(length: int, repeats: int) -> bytes:
    """y = x tiled `repeats` times: a small request whose answer is large."""
    graph = helper.make_graph(
        [helper.make_node("Tile", ["x", "r"], ["y"], name="tile")], "tile",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [length])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [length * repeats])],
        [numpy_helper.from_array(np.array([repeats], np.int64), "r")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10).SerializeToString()


def test_an_answer_the_client_never_reads_is_dropped_after_the_body_timeout(tight):
    model_id = tight.client.upload(tile_model(1024, 4096))  # a 16 MB answer
    spec = json.dumps({"model_id": model_id, "backend": "cpu"}).encode()
    body = encode_npz({"x": np.ones(1024, np.float32), RUN_MEMBER: np.frombuffer(spec, np.uint8)})
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a reader that holds almost nothing
    sock.settimeout(10)
    sock.connect(address(tight))
    host, _ = address(tight)
    sock.sendall(f"POST /v1/runs/npz HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {tight.token}\r\n"
                 f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    time.sleep(3 * TIMEOUT + 1.0)  # the body timeout, with room for the run
    response, _ = read_until_closed(sock, 10.0)
    sock.close()
    assert status_of(response) == 200
    assert len(response) < 8 * 2**20, len(response)  # dropped long before the whole answer was read
    assert "read nothing of its answer" in tight.log_path.read_text()
    assert tight.client.health()["status"] == "ok"


def test_a_run_that_overruns_one_agent_does_not_set_the_pool_aside(quick, models, tmp_path):
    from mpstudio.agent import AgentPool, AgentRunTimeout

    feeds = {"x": np.random.default_rng(3).standard_normal((384, 384)).astype(np.float32)}
    with LocalAgent(run_timeout=3, log_path=tmp_path / "second.log") as second, \
            AgentPool([quick.url, second.url], quick.token) as pool:
        pool.agents[1] = AgentClient(second.url, second.token)
        with pytest.raises(AgentRunTimeout):
            pool.run(models["slow"], feeds, backend="cpu", iterations=100_000)
        assert len(pool.healthy(check=False)) == 2  # neither agent was set aside for the run's length
        result = pool.run(models["slow"], feeds, backend="cpu", iterations=1)
        np.testing.assert_allclose(result.outputs["y"], direct_run(models["slow"], "cpu", feeds)["y"], rtol=1e-5,
                                   atol=1e-5)


class _HostileAgent:
    """An HTTP server on loopback that answers like an agent, with what a hostile agent could send."""

    def __init__(self, run_answer: bytes):
        import http.server

        answer = run_answer

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _send(self, status: int, body: bytes, kind: str) -> None:
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                self._send(200, json.dumps({"model_id": self.path.rsplit("/", 1)[-1], "size_bytes": 1}).encode(),
                           "application/json")

            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                self._send(200, answer, "application/octet-stream")

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


def test_agent_client_bounds_what_an_agent_sends_back():
    model_id = "ab" * 32
    bomb, inflated = npz_bomb(model_id, 3 * 2**20 // 2)
    assert inflated > 1024 * 2**20
    peak_before = memory_kb(os.getpid())["VmHWM"]
    with _HostileAgent(bomb) as hostile, AgentClient(hostile.url, retries=0) as client:
        with pytest.raises(AgentError) as refused:
            client.run(model_id, {"x": np.zeros(4, np.float32)}, backend="cpu")
        assert refused.value.status == 502 and "max_response_mb" in str(refused.value)
        with AgentClient(hostile.url, retries=0, max_response_mb=1) as small:
            with pytest.raises(AgentError) as too_large:
                small.run(model_id, {"x": np.zeros(4, np.float32)}, backend="cpu")
        assert too_large.value.status == 502 and "more than 1 MB" in str(too_large.value)
    assert memory_kb(os.getpid())["VmHWM"] - peak_before < 200 * 1024


@pytest.mark.skipif(not __import__("agent_fixtures").HAS_QNN, reason="onnxruntime-qnn is not installed")
def test_profiled_htp_runs_leave_no_files_in_the_worker_directory(quick, models):
    for _ in range(2):
        result = quick.client.run(models["a8"], random_inputs(), backend="htp", profile=True, profile_runs=2)
        assert result.profile.ops
    left = [p.name for p in (quick.workdir / "workers").glob("worker-*/*")]
    assert left == [], left


def test_a_header_over_the_limit_is_refused_when_it_arrives_in_one_read(tight):
    head = (b"GET /health HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + tight.token.encode() + b"\r\n"
            + b"".join(b"X-Filler-%d: " % i + b"a" * 1010 + b"\r\n" for i in range(80)) + b"\r\n")
    assert len(head) > 80 * 1024
    sock = connect(tight)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 20)
    sock.sendall(head)  # one write; on loopback it arrives in one read
    response, _ = read_until_closed(sock, 10.0)
    sock.close()
    assert status_of(response) in (400, 431), response[:200]


def test_a_full_disk_under_the_agent_is_a_clear_507(tmp_path):
    """The agent with a 256 KB file-size limit (RLIMIT_FSIZE): a model larger than that cannot be written."""
    import resource

    def limit_files():
        resource.setrlimit(resource.RLIMIT_FSIZE, (256 * 1024, 256 * 1024))

    token = "disk-full-token-0123456789"
    process = subprocess.Popen([sys.executable, "-m", "mpstudio.agent", "serve", "--port", "0", "--workdir",
                                str(tmp_path / "work")], env={**os.environ, "MPSTUDIO_AGENT_TOKEN": token},
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, preexec_fn=limit_files)
    try:
        url = process.stdout.readline().strip().rsplit(" ", 1)[-1]
        assert url.startswith("http://"), url
        with AgentClient(url, token, retries=8, backoff_s=0.25) as client:
            client.info()
            small = matmul_model(1)
            assert client.upload(small)  # 16 KB fits
            large = matmul_model(2, size=320)  # 400 KB does not
            with pytest.raises(AgentError) as refused:
                client.upload(large)
            assert refused.value.status == 507 and "no room" in str(refused.value), refused.value
            assert client.health()["status"] == "ok"
    finally:
        process.kill()
        process.wait(timeout=30)
