"""The agent's HTTP service: models by sha256, runs, context binaries, info and health (FastAPI).

One worker process runs everything on the device, one request at a time; other requests wait in a
bounded queue. Every endpoint but the OpenAPI schema needs the bearer token when one is set.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import ipaddress
import logging
import os
import platform
import shutil
import sys
import tempfile
import time
import uuid
from collections import OrderedDict
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

from fastapi import FastAPI, Request, Security
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, Response
from fastapi.security import HTTPBearer
import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.concurrency import run_in_threadpool

from .. import __version__
from ..errors import MpstudioError
from ..runtime import DEFAULT_HTP_ARCH, first_line, htp_is_emulated, qnn_library_path, validate_provider_options
from .protocol import (
    API_PREFIX,
    RESULT_MEMBER,
    RUN_MEMBER,
    AgentError,
    AgentInfo,
    b64decode,
    b64encode,
    check_model_id,
    check_run_id,
    decode_npz,
    encode_npz,
    sha256_file,
)
from .worker import WorkerHandle

log = logging.getLogger("mpstudio.agent")

MAX_ITERATIONS = 100_000
MAX_WARMUP = 1_000


@dataclass(frozen=True)
class AgentConfig:
    """How one agent serves: where it listens, its token, limits, and the device it speaks for."""

    host: str = "127.0.0.1"
    port: int = 0
    token: str | None = None
    workdir: Path | None = None
    max_upload_mb: float = 512.0
    run_timeout_s: float = 300.0
    max_queue: int = 64
    max_sessions: int = 4
    device_name: str | None = None
    htp_arch: str = DEFAULT_HTP_ARCH
    soc_model: str | None = None
    intra_op_threads: int = 0

    def check(self) -> None:
        """Refuse settings that would expose the device: any non-loopback address needs a strong token."""
        if self.token is not None and len(self.token) < 16:
            raise MpstudioError("the agent token must be at least 16 characters (use a random one)")
        if not is_loopback(self.host) and not self.token:
            raise MpstudioError(
                f"refusing to listen on {self.host} without a token: anyone who can reach it could run code "
                "on the device. Set MPSTUDIO_AGENT_TOKEN (or --token) to a long random secret, or listen on "
                "127.0.0.1"
            )
        if self.max_upload_mb <= 0 or self.run_timeout_s <= 0 or self.max_queue < 1 or self.max_sessions < 1:
            raise MpstudioError("upload limit, run timeout, queue size and session count must be positive")
        validate_provider_options(self.default_options(), "htp")

    def default_options(self) -> dict[str, str]:
        """Provider options this device adds to each htp run that does not set them."""
        options = {"htp_arch": self.htp_arch}
        if self.soc_model:
            options["soc_model"] = self.soc_model
        return options


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def default_device_name() -> str:
    """Host name and CPU, e.g. 'surface (Snapdragon X Elite - X1E80100 - Qualcomm Oryon CPU)'."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{platform.node() or 'host'} ({cpu})"


# ============================================================================================ state

class DeviceQueue:
    """One request on the device at a time; at most `max_waiting` others wait (FIFO), the rest get 503."""

    def __init__(self, max_waiting: int):
        self.max_waiting = max_waiting
        self.waiting = 0
        self.busy = False
        self._lock = asyncio.Lock()

    @asynccontextmanager
    async def slot(self):
        if self.waiting >= self.max_waiting:
            raise AgentError(f"the agent is busy ({self.waiting} requests waiting); retry later", 503)
        self.waiting += 1
        try:
            await self._lock.acquire()
        finally:
            self.waiting -= 1
        self.busy = True
        try:
            yield
        finally:
            self.busy = False
            self._lock.release()


class ModelStore:
    """Model files named by their verified sha256, under the agent's work directory."""

    def __init__(self, root: Path):
        self.root = root
        self.models = root / "models"
        self.incoming = root / "incoming"
        self.models.mkdir(parents=True, exist_ok=True)
        self.incoming.mkdir(parents=True, exist_ok=True)

    def path(self, model_id: str) -> Path:
        return self.models / f"{check_model_id(model_id)}.onnx"

    def existing(self, model_id: str) -> Path:
        path = self.path(model_id)
        if not path.exists():
            raise AgentError(f"model {model_id} is not on this agent; upload it first", 404)
        return path

    def new_incoming(self) -> Path:
        return self.incoming / f"{uuid.uuid4().hex}.part"

    def adopt(self, path: Path, model_id: str) -> Path:
        """Move a verified file into the store (atomic, so a concurrent reader never sees half a model)."""
        final = self.path(model_id)
        os.replace(path, final)
        return final


def check_model_file(path: Path) -> None:
    """Refuse models that would make ORT read other files: external data and non-embedded EP contexts."""
    import onnx

    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:
        raise AgentError(f"the upload is not an ONNX model: {first_line(exc)}") from None

    def graphs(graph):
        yield graph
        for node in graph.node:
            for attribute in node.attribute:
                if attribute.g.ByteSize():
                    yield from graphs(attribute.g)
                for sub in attribute.graphs:
                    yield from graphs(sub)

    for graph in graphs(model.graph):
        for tensor in graph.initializer:
            if tensor.data_location == onnx.TensorProto.EXTERNAL:
                raise AgentError(
                    f"initializer {tensor.name!r} keeps its data in an external file, which the agent does not "
                    "accept: save the model with all tensors inside (onnx.save(..., save_as_external_data=False))"
                )
        for node in graph.node:
            if node.op_type == "EPContext":
                embed = next((a.i for a in node.attribute if a.name == "embed_mode"), 1)
                if embed != 1:
                    raise AgentError(
                        f"EPContext node {node.name!r} points to a context binary file; the agent accepts only "
                        "embedded context binaries (ep.context_embed_mode=1)"
                    )


class AgentState:
    def __init__(self, config: AgentConfig):
        self.config = config
        self._own_workdir = config.workdir is None
        root = Path(config.workdir) if config.workdir else Path(tempfile.mkdtemp(prefix="mpstudio-agent-"))
        root.mkdir(parents=True, exist_ok=True)
        self.root = root
        self.store = ModelStore(root)
        workers = root / "workers"
        workers.mkdir(exist_ok=True)
        self.device = config.device_name or default_device_name()
        self.emulated = htp_is_emulated()
        self.worker = WorkerHandle(workers, {
            "device": self.device,
            "emulated": self.emulated,
            "max_sessions": config.max_sessions,
            "intra_op_threads": config.intra_op_threads,
        })
        self.queue = DeviceQueue(config.max_queue)
        self.runs: OrderedDict[str, dict] = OrderedDict()
        self.started = time.time()

    def close(self) -> None:
        self.worker.stop()
        if self._own_workdir:
            shutil.rmtree(self.root, ignore_errors=True)

    def remember(self, run_id: str, summary: dict) -> None:
        self.runs[run_id] = summary
        while len(self.runs) > 256:
            self.runs.popitem(last=False)

    async def call_worker(self, request: dict) -> dict:
        async with self.queue.slot():
            return await self.worker.call_async(request, self.config.run_timeout_s)

    def info(self) -> AgentInfo:
        ready = self.worker.ready_info or {}
        htp = bool(ready.get("htp_available"))
        try:
            import onnxruntime_qnn

            qnn_version = getattr(onnxruntime_qnn, "__version__", None) or _dist_version("onnxruntime-qnn")
        except ImportError:
            qnn_version = None
        import onnxruntime

        return AgentInfo(
            device=self.device,
            os=platform.system(),
            os_release=platform.release(),
            arch=platform.machine(),
            python=platform.python_version(),
            onnxruntime=onnxruntime.__version__,
            onnxruntime_qnn=qnn_version,
            backends=("cpu", "htp") if htp else ("cpu",),
            htp_kind=("emulator" if self.emulated else "npu") if htp else None,
            htp_arch=self.config.htp_arch,
            soc_model=self.config.soc_model,
            agent_version=__version__,
            worker_pid=self.worker.pid,
            max_upload_mb=self.config.max_upload_mb,
            run_timeout_s=self.config.run_timeout_s,
            htp_error=ready.get("htp_error") if qnn_library_path() else "onnxruntime-qnn is not installed",
        )


def _dist_version(name: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None


# ============================================================================================ wire models

class RunRequest(BaseModel):
    """One run: which model, where, with what inputs, how many times, and what to send back."""

    model_config = ConfigDict(extra="forbid")

    model_id: str = Field(description="sha256 of an uploaded model")
    backend: Literal["htp", "cpu"] = Field("htp", description="htp (QNN EP) or cpu (ORT's QDQ reference)")
    provider_options: dict[str, str | int | bool] = Field(default_factory=dict,
                                                           description="QNN EP options (whitelisted)")
    inputs_npz: str = Field("", description="base64 of an .npz of the model inputs (no pickled arrays); "
                                            "empty in the binary form, where the inputs are the .npz itself")
    warmup: int = Field(0, ge=0, le=MAX_WARMUP)
    iterations: int = Field(1, ge=1, le=MAX_ITERATIONS)
    return_outputs: bool = True
    return_placement: bool = False
    return_profile: bool = False
    profile_runs: int = Field(5, ge=1, le=50)
    allow_cpu_fallback: bool = Field(False, description="let nodes QNN refuses run on ORT's CPU EP")


class ContextRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model_id: str
    provider_options: dict[str, str | int | bool] = Field(default_factory=dict)
    allow_cpu_fallback: bool = False


# ============================================================================================ app

class _Guard:
    """ASGI middleware: bearer token (constant-time compare) and request-size limit, before any body is read."""

    OPEN_PATHS = ("/openapi.json",)

    def __init__(self, app, token: str | None, max_bytes: int):
        self.app = app
        self.token = token.encode() if token else None
        self.max_bytes = max_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope["headers"])
        if self.token is not None and scope["path"] not in self.OPEN_PATHS:
            given = headers.get(b"authorization", b"")
            scheme, _, credential = given.partition(b" ")
            if scheme.lower() != b"bearer" or not hmac.compare_digest(credential.strip(), self.token):
                return await _send_error(send, 401, "missing or wrong bearer token",
                                         [(b"www-authenticate", b"Bearer")])
        if scope["method"] in ("POST", "PUT", "PATCH"):
            length = headers.get(b"content-length")
            if length is None:
                if b"chunked" in headers.get(b"transfer-encoding", b""):
                    return await _send_error(send, 411, "send a Content-Length; chunked bodies are not accepted")
            elif not length.isdigit() or int(length) > self.max_bytes:
                return await _send_error(
                    send, 413, f"request body larger than the agent's limit of {self.max_bytes / 2**20:g} MB "
                    "(start the agent with a larger --max-upload-mb)")
        return await self.app(scope, receive, send)


async def _send_error(send, status: int, message: str, extra_headers=()):
    body = JSONResponse({"detail": message}).body
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            *extra_headers]})
    await send({"type": "http.response.body", "body": body})


def create_app(config: AgentConfig) -> FastAPI:
    config.check()
    state = AgentState(config)

    @asynccontextmanager
    async def lifespan(app):
        state.worker.start()
        yield
        await run_in_threadpool(state.close)

    bearer = HTTPBearer(auto_error=False, description="the agent token (MPSTUDIO_AGENT_TOKEN)")
    app = FastAPI(
        title="mpstudio agent",
        version=__version__,
        description="Runs ONNX models on a Qualcomm HTP (or its x86_64 emulator) through ONNX Runtime's QNN EP.",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        # Declares the bearer scheme in the OpenAPI schema; the check itself is in _Guard.
        dependencies=[Security(bearer)],
    )
    app.state.agent = state
    app.add_middleware(_Guard, token=config.token, max_bytes=int(config.max_upload_mb * 2**20))

    @app.exception_handler(AgentError)
    async def _agent_error(request: Request, exc: AgentError):
        return JSONResponse({"detail": str(exc)}, status_code=exc.status)

    @app.exception_handler(MpstudioError)
    async def _user_error(request: Request, exc: MpstudioError):
        return JSONResponse({"detail": str(exc)}, status_code=422)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError):
        # Say which field is wrong without echoing the (possibly huge) input back.
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'][1:]) or 'body'}: {e['msg']}" for e in exc.errors())
        return JSONResponse({"detail": f"invalid request: {problems}"}, status_code=422)

    @app.get("/health", summary="Liveness, worker and queue")
    async def health():
        return {
            "status": "ok",
            "worker_pid": state.worker.pid,
            "worker_alive": state.worker.alive,
            "worker_ready": state.worker.ready_info is not None,
            "worker_restarts": state.worker.restarts,
            "busy": state.queue.busy,
            "queued": state.queue.waiting,
            "uptime_s": round(time.time() - state.started, 1),
        }

    @app.get(f"{API_PREFIX}/info", summary="Platform, versions, backends and what the HTP really is")
    async def info():
        if state.worker.ready_info is None:  # waiting for the lock would otherwise queue behind a run
            await run_in_threadpool(state.worker.wait_ready)
        return asdict(state.info())

    @app.get(f"{API_PREFIX}/models/{{model_id}}", summary="Whether the agent has a model")
    async def model_status(model_id: str):
        path = state.store.existing(model_id)
        return {"model_id": model_id, "size_bytes": path.stat().st_size}

    @app.get(f"{API_PREFIX}/models/{{model_id}}/content", summary="Download a model (e.g. a context binary)")
    async def model_content(model_id: str):
        path = state.store.existing(model_id)
        return FileResponse(path, media_type="application/octet-stream", filename=f"{model_id}.onnx")

    @app.put(f"{API_PREFIX}/models/{{model_id}}", status_code=201,
             summary="Upload a model; the body is the file, the id its sha256 (verified)",
             openapi_extra={"requestBody": {"content": {"application/octet-stream": {"schema": {"type": "string",
                                                                                                  "format": "binary"}}},
                                            "required": True}})
    async def upload_model(model_id: str, request: Request):
        check_model_id(model_id)
        if state.store.path(model_id).exists():
            return JSONResponse({"model_id": model_id, "stored": False}, status_code=200)
        limit = int(config.max_upload_mb * 2**20)
        part = state.store.new_incoming()
        digest = hashlib.sha256()
        size = 0
        try:
            with open(part, "wb") as out:
                async for chunk in request.stream():
                    size += len(chunk)
                    if size > limit:
                        raise AgentError(f"model larger than the agent's limit of {config.max_upload_mb:g} MB", 413)
                    digest.update(chunk)
                    out.write(chunk)
            if digest.hexdigest() != model_id:
                raise AgentError(f"the upload's sha256 is {digest.hexdigest()}, not {model_id}: corrupt or wrong file", 400)
            await run_in_threadpool(check_model_file, part)
            state.store.adopt(part, model_id)
        finally:
            part.unlink(missing_ok=True)
        log.info("model %s stored (%.1f MB)", model_id[:12], size / 2**20)
        return {"model_id": model_id, "stored": True, "size_bytes": size}

    @app.post(f"{API_PREFIX}/runs", summary="Run a model and return outputs, latency, placement, profile")
    async def run(body: RunRequest):
        path = state.store.existing(body.model_id)  # an unknown model is a 404 whatever the inputs
        inputs = decode_npz(b64decode(body.inputs_npz, "inputs_npz"))
        reply, outputs = await _run(body, path, inputs)
        if outputs is not None:
            reply = {**reply, "outputs_npz": b64encode(encode_npz(outputs))}
        return JSONResponse(jsonable_encoder(reply))

    @app.post(
        f"{API_PREFIX}/runs/npz",
        summary="The same run in binary: one .npz each way, no base64 (what AgentClient uses)",
        description=(
            "The request body is an .npz of the inputs plus a uint8 member `__run__` holding the JSON of a "
            "RunRequest without `inputs_npz`. The response is an .npz of the outputs plus a uint8 member "
            "`__result__` holding the JSON result. Pickled members are refused."
        ),
        openapi_extra={"requestBody": {"content": {"application/octet-stream": {
            "schema": {"type": "string", "format": "binary"}}}, "required": True}},
        response_class=Response,
        responses={200: {"content": {"application/octet-stream": {}}}},
    )
    async def run_npz(request: Request):
        inputs = decode_npz(await request.body())
        spec = inputs.pop(RUN_MEMBER, None)
        if spec is None or spec.dtype != np.uint8:
            raise AgentError(f"the .npz has no uint8 {RUN_MEMBER!r} member with the run's JSON")
        try:
            body = RunRequest.model_validate_json(spec.tobytes())
        except ValidationError as exc:
            raise RequestValidationError([{**e, "loc": ("body", *e["loc"])} for e in exc.errors()]) from None
        reply, outputs = await _run(body, state.store.existing(body.model_id), inputs)
        arrays = dict(outputs or {})
        arrays[RESULT_MEMBER] = np.frombuffer(json.dumps(jsonable_encoder(reply)).encode(), dtype=np.uint8)
        return Response(encode_npz(arrays), media_type="application/octet-stream")

    async def _run(body: RunRequest, path: Path, inputs: dict) -> tuple[dict, dict | None]:
        options = _options(body.backend, body.provider_options)
        run_id = uuid.uuid4().hex
        started = time.perf_counter()
        result = await state.call_worker({
            "op": "run", "model_id": body.model_id, "model_path": str(path), "backend": body.backend,
            "provider_options": options, "inputs": inputs, "warmup": body.warmup, "iterations": body.iterations,
            "return_outputs": body.return_outputs, "return_placement": body.return_placement,
            "return_profile": body.return_profile, "profile_runs": body.profile_runs,
            "allow_cpu_fallback": body.allow_cpu_fallback,
        })
        outputs = result.pop("outputs", None)
        reply = {
            "run_id": run_id, "model_id": body.model_id, "backend": body.backend, "provider_options": options,
            "device": state.device, "emulated": body.backend == "htp" and state.emulated, **result,
        }
        state.remember(run_id, reply)
        log.info("run %s model %s %s x%d: %.0f ms", run_id[:8], body.model_id[:12], body.backend, body.iterations,
                 (time.perf_counter() - started) * 1e3)
        return reply, outputs

    @app.get(f"{API_PREFIX}/runs/{{run_id}}", summary="A past run's result (without outputs)")
    async def run_status(run_id: str):
        check_run_id(run_id)
        if run_id not in state.runs:
            raise AgentError(f"run {run_id} is unknown to this agent (it keeps the last 256)", 404)
        return state.runs[run_id]

    @app.post(f"{API_PREFIX}/contexts", status_code=201,
              summary="Build an EPContext model (QNN context binary) for a model and options")
    async def build_context(body: ContextRequest):
        path = state.store.existing(body.model_id)
        options = _options("htp", body.provider_options)
        result = await state.call_worker({
            "op": "context", "model_id": body.model_id, "model_path": str(path), "provider_options": options,
            "allow_cpu_fallback": body.allow_cpu_fallback,
        })
        built = Path(result["path"])  # in the worker's directory, under the same root as the store
        try:
            digest = await run_in_threadpool(sha256_file, built)
            size = built.stat().st_size
            state.store.adopt(built, digest)
        finally:
            built.unlink(missing_ok=True)
        return {"model_id": digest, "source_model_id": body.model_id, "provider_options": options,
                "size_bytes": size, "build_ms": result["build_ms"]}

    def _options(backend: str, given: dict) -> dict[str, str]:
        if backend == "cpu":
            return validate_provider_options(given, "cpu")
        return validate_provider_options({**config.default_options(), **given}, "htp")

    return app


def serve(config: AgentConfig, *, log_level: str = "info", announce=sys.stdout) -> None:
    """Serve until interrupted. Prints one line with the URL once listening (the port may be chosen by the OS)."""
    import socket

    import uvicorn

    app = create_app(config)
    family = socket.AF_INET6 if ":" in config.host else socket.AF_INET
    # proto must say TCP: asyncio sets TCP_NODELAY only on such sockets, and without it every response
    # waits ~40 ms for a delayed ACK (Nagle).
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((config.host, config.port))
    port = sock.getsockname()[1]
    host = f"[{config.host}]" if ":" in config.host else config.host
    # log_config=None: uvicorn's records (access lines too) go through the agent's logging, to stderr,
    # keeping stdout for the one "listening on" line a parent process reads.
    server = uvicorn.Server(uvicorn.Config(app, log_level=log_level, log_config=None, timeout_keep_alive=30))
    log.info("HTP is %s; %s", "the x86_64 emulator (timings are host time)" if htp_is_emulated() else "the device NPU",
             "bearer token required" if config.token else "no token (loopback only)")
    print(f"mpstudio agent listening on http://{host}:{port}", file=announce, flush=True)
    server.run(sockets=[sock])
