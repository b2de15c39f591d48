"""The agent's HTTP service: models by sha256, runs, context binaries, info and health (FastAPI).

One worker process runs everything on the device, one request at a time; other requests wait in a
bounded queue. Every endpoint but the OpenAPI schema needs the bearer token when one is set.
"""

from __future__ import annotations

import asyncio
import hashlib
import ipaddress
import json
import logging
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
from typing import Annotated, Literal

import numpy as np
from fastapi import APIRouter, Depends, FastAPI, Request, Security
from fastapi import Path as PathParam
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, Response
from fastapi.security import HTTPBearer
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.concurrency import run_in_threadpool

from .. import __version__
from ..errors import MpstudioError
from ..runtime import DEFAULT_HTP_ARCH, htp_is_emulated, qnn_library_path, validate_provider_options
from .guards import ConnectionLimits, RedactQuery, RequestGuard, guarded_protocol
from .protocol import (
    API_PREFIX,
    RESULT_MEMBER,
    RUN_MEMBER,
    AgentError,
    AgentInfo,
    b64decode,
    b64encode,
    decode_npz,
    encode_npz,
    npz_declared_bytes,
    sha256_file,
)
from .store import ModelStore, check_model_file
from .worker import WorkerHandle

log = logging.getLogger("mpstudio.agent")

MAX_ITERATIONS = 100_000
MAX_WARMUP = 1_000
HTTP_IMPLEMENTATIONS = ("auto", "h11", "httptools")
KEEP_ALIVE_S = 30
# Arrays up to this size are (de)coded on the event loop: well under a millisecond, less than a thread hop.
INLINE_BYTES = 1 << 20


@dataclass(frozen=True)
class AgentConfig:
    """How one agent serves: where it listens, its token, limits, and the device it speaks for.

    Sizes are in MB (2**20 bytes), times in seconds. `max_inputs_mb` bounds a run's input arrays once
    decompressed and decoded (default: the upload limit); `max_store_mb` bounds the models kept on disk
    (the least recently used are evicted); `max_uploads` bounds uploads in progress at once; the timeouts
    and `max_connections` bound what a slow or idle client can hold (see `guards.ConnectionLimits`).
    """

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
    max_inputs_mb: float | None = None
    max_store_mb: float = 10240.0
    max_uploads: int = 2
    max_connections: int = 128
    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    request_timeout_s: float = 600.0
    http: str = "auto"

    def check(self) -> None:
        """Refuse settings that would expose the device (any non-loopback address needs a strong token)
        or that no client could use."""
        self._check_token()
        if not is_loopback(self.host) and not self.token:
            raise MpstudioError(
                f"refusing to listen on {self.host} without a token: anyone who can reach it could run code "
                "on the device. Set MPSTUDIO_AGENT_TOKEN (or --token) to a long random secret, or listen on "
                "127.0.0.1"
            )
        positive = {"--max-upload-mb": self.max_upload_mb, "--run-timeout": self.run_timeout_s,
                    "--max-queue": self.max_queue, "--max-sessions": self.max_sessions,
                    "--max-inputs-mb": self.inputs_bytes, "--max-store-mb": self.max_store_mb,
                    "--max-uploads": self.max_uploads, "--max-connections": self.max_connections,
                    "--header-timeout": self.header_timeout_s, "--body-timeout": self.body_timeout_s,
                    "--request-timeout": self.request_timeout_s}
        bad = [name for name, value in positive.items() if not value > 0]
        if bad:
            raise MpstudioError(f"{', '.join(bad)} must be positive")
        if self.http not in HTTP_IMPLEMENTATIONS:
            raise MpstudioError(f"unknown HTTP implementation {self.http!r}; use one of {HTTP_IMPLEMENTATIONS}")
        validate_provider_options(self.default_options(), "htp")

    def _check_token(self) -> None:
        if self.token is None:
            return
        if not self.token.strip():
            raise MpstudioError("the agent token is empty or only whitespace; set MPSTUDIO_AGENT_TOKEN (or --token) "
                                "to a long random secret, e.g. python -c \"import secrets; "
                                "print(secrets.token_urlsafe(32))\"")
        if self.token != self.token.strip() or not all(33 <= ord(c) < 127 or c == " " for c in self.token):
            raise MpstudioError("the agent token must be printable ASCII without leading or trailing whitespace "
                                "(clients send it in an HTTP header); check MPSTUDIO_AGENT_TOKEN or --token")
        if len(self.token) < 16:
            raise MpstudioError("the agent token must be at least 16 characters (use a random one)")

    @property
    def upload_bytes(self) -> int:
        return int(self.max_upload_mb * 2**20)

    @property
    def inputs_bytes(self) -> int:
        return int((self.max_inputs_mb if self.max_inputs_mb is not None else self.max_upload_mb) * 2**20)

    def connection_limits(self) -> ConnectionLimits:
        return ConnectionLimits(header_timeout_s=self.header_timeout_s, body_timeout_s=self.body_timeout_s,
                                request_timeout_s=self.request_timeout_s, max_connections=self.max_connections)

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


class AgentState:
    """Everything one agent holds: its model store, its worker and the queue to it, recent runs, uploads."""

    def __init__(self, config: AgentConfig):
        self.config = config
        self._own_workdir = config.workdir is None
        root = Path(config.workdir) if config.workdir else Path(tempfile.mkdtemp(prefix="mpstudio-agent-"))
        root.mkdir(parents=True, exist_ok=True)
        self.root = root
        self.store = ModelStore(root, int(config.max_store_mb * 2**20))
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
        self.uploads = 0
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

    def options(self, backend: str, given: dict) -> dict[str, str]:
        if backend == "cpu":
            return validate_provider_options(given, "cpu")
        return validate_provider_options({**self.config.default_options(), **given}, "htp")

    async def decode_inputs(self, data: bytes) -> dict:
        """A run's inputs, refused past --max-inputs-mb before any decompression; decoded off the event loop
        unless they are small (two thread hand-offs would cost more than decoding a few arrays)."""
        if len(data) <= INLINE_BYTES and npz_declared_bytes(data) <= INLINE_BYTES:
            return decode_npz(data, self.config.inputs_bytes)
        return await run_in_threadpool(decode_npz, data, self.config.inputs_bytes)

    # ------------------------------------------------------------------ runs

    async def run(self, body: RunRequest, inputs: dict) -> tuple[dict, dict | None]:
        """Run on the worker; the result without outputs, and the outputs (None when not asked for)."""
        started = time.perf_counter()
        with self.store.in_use(body.model_id) as path:
            options = self.options(body.backend, body.provider_options)
            result = await self.call_worker({
                "op": "run", "model_id": body.model_id, "model_path": str(path), "backend": body.backend,
                "provider_options": options, "inputs": inputs, "warmup": body.warmup,
                "iterations": body.iterations, "return_outputs": body.return_outputs,
                "return_placement": body.return_placement, "return_profile": body.return_profile,
                "profile_runs": body.profile_runs, "allow_cpu_fallback": body.allow_cpu_fallback,
            })
        run_id = uuid.uuid4().hex
        outputs = result.pop("outputs", None)
        reply = {
            "run_id": run_id, "model_id": body.model_id, "backend": body.backend, "provider_options": options,
            "device": self.device, "emulated": body.backend == "htp" and self.emulated, **result,
        }
        self.remember(run_id, reply)
        log.info("run %s model %s %s x%d: %.0f ms", run_id[:8], body.model_id[:12], body.backend, body.iterations,
                 (time.perf_counter() - started) * 1e3)
        return reply, outputs

    async def build_context(self, body: ContextRequest) -> dict:
        with self.store.in_use(body.model_id) as path:
            options = self.options("htp", body.provider_options)
            result = await self.call_worker({
                "op": "context", "model_id": body.model_id, "model_path": str(path), "provider_options": options,
                "allow_cpu_fallback": body.allow_cpu_fallback,
            })
            built = Path(result["path"])  # in the worker's directory, under the same root as the store
            try:
                digest = await run_in_threadpool(sha256_file, built)
                size = built.stat().st_size
                self.store.adopt(built, digest)
            finally:
                built.unlink(missing_ok=True)
        return {"model_id": digest, "source_model_id": body.model_id, "provider_options": options,
                "size_bytes": size, "build_ms": result["build_ms"]}

    # ------------------------------------------------------------------ uploads

    @asynccontextmanager
    async def upload_slot(self):
        if self.uploads >= self.config.max_uploads:
            raise AgentError(f"{self.uploads} uploads are in progress, the agent's limit (--max-uploads); "
                             "retry later", 503)
        self.uploads += 1
        try:
            yield
        finally:
            self.uploads -= 1

    async def receive_model(self, model_id: str, chunks) -> int:
        """Store an uploaded model: size-limited, hash-verified, checked, then moved into the store."""
        limit = self.config.upload_bytes
        part = self.store.new_incoming()
        digest = hashlib.sha256()
        size = 0
        try:
            async with self.upload_slot():
                with open(part, "wb") as out:
                    async for chunk in chunks:
                        size += len(chunk)
                        if size > limit:
                            raise AgentError(
                                f"model larger than the agent's limit of {self.config.max_upload_mb:g} MB", 413)
                        digest.update(chunk)
                        out.write(chunk)
                if size == 0:
                    raise AgentError("the upload is empty: send the .onnx file as the request body")
                if digest.hexdigest() != model_id:
                    raise AgentError(f"the upload's sha256 is {digest.hexdigest()}, not {model_id}: corrupt or "
                                     "wrong file", 400)
                self.store.check_fits(size)
                await run_in_threadpool(check_model_file, part)
                self.store.adopt(part, model_id)
        finally:
            part.unlink(missing_ok=True)
        log.info("model %s stored (%.1f MB)", model_id[:12], size / 2**20)
        return size

    # ------------------------------------------------------------------ reports

    def health(self) -> dict:
        return {
            "status": "ok",
            "worker_pid": self.worker.pid,
            "worker_alive": self.worker.alive,
            "worker_ready": self.worker.ready_info is not None,
            "worker_restarts": self.worker.restarts,
            "busy": self.queue.busy,
            "queued": self.queue.waiting,
            "uptime_s": round(time.time() - self.started, 1),
        }

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


class ErrorBody(BaseModel):
    """Every error the agent sends: one sentence that says what is wrong and what to do."""

    detail: str


class Health(BaseModel):
    status: Literal["ok"]
    worker_pid: int | None
    worker_alive: bool
    worker_ready: bool
    worker_restarts: int
    busy: bool
    queued: int
    uptime_s: float


class ModelStatus(BaseModel):
    model_id: str
    size_bytes: int


class Upload(BaseModel):
    model_id: str
    stored: bool = Field(description="false when the agent already had the model (status 200)")
    size_bytes: int | None = None


class Context(BaseModel):
    model_id: str = Field(description="id of the EPContext model, to download or run")
    source_model_id: str
    provider_options: dict[str, str]
    size_bytes: int
    build_ms: float


_ERROR_MEANINGS = {
    400: "a corrupt upload (wrong sha256), or credentials in the URL",
    401: "missing or wrong bearer token",
    404: "the model or run is not on this agent",
    411: "a body without Content-Length (chunked)",
    413: "the body, the inputs once decompressed, or the model is over the agent's limits",
    422: "a bad request: ids, options, inputs, .npz, model, unsupported op, dynamic shape",
    500: "an internal fault of the worker",
    502: "the worker died during the request (it was replaced)",
    503: "the agent is busy (queue full, too many uploads or connections, worker starting): retry later",
    504: "the run exceeded the agent's run timeout (its worker was replaced)",
    507: "the models in use fill the agent's model store",
}


def _errors(*codes: int) -> dict:
    """OpenAPI entries for error responses: each has an ErrorBody."""
    return {code: {"model": ErrorBody, "description": _ERROR_MEANINGS[code]} for code in codes}


ModelId = Annotated[str, PathParam(pattern=r"^[0-9a-f]{64}$", description="sha256 hex digest of the model")]
RunId = Annotated[str, PathParam(pattern=r"^[0-9a-f]{32}$", description="uuid4 hex of a run")]
_BINARY_BODY = {"requestBody": {"content": {"application/octet-stream": {"schema": {"type": "string",
                                                                                     "format": "binary"}}},
                                "required": True}}
_RUN_ERRORS = _errors(404, 411, 413, 422, 500, 502, 504)


def _state(request: Request) -> AgentState:
    return request.app.state.agent


Agent = Annotated[AgentState, Depends(_state)]
# Refusals any route can give: credentials in the URL, a wrong token, a busy agent or too many connections.
router = APIRouter(responses=_errors(400, 401, 503))


@router.get("/health", summary="Liveness, worker and queue", response_model=Health)
async def health(state: Agent):
    return state.health()


@router.get(f"{API_PREFIX}/info", summary="Platform, versions, backends and what the HTP really is")
async def info(state: Agent):
    if state.worker.ready_info is None:  # waiting for the lock would otherwise queue behind a run
        await run_in_threadpool(state.worker.wait_ready)
    return asdict(state.info())


@router.get(f"{API_PREFIX}/models/{{model_id}}", summary="Whether the agent has a model",
            response_model=ModelStatus, responses=_errors(404, 422))
async def model_status(model_id: ModelId, state: Agent):
    path = state.store.existing(model_id)
    return {"model_id": model_id, "size_bytes": path.stat().st_size}


@router.get(f"{API_PREFIX}/models/{{model_id}}/content", summary="Download a model (e.g. a context binary)",
            response_class=FileResponse, responses={200: {"content": {"application/octet-stream": {}}},
                                                    **_errors(404, 422)})
async def model_content(model_id: ModelId, state: Agent):
    path = state.store.existing(model_id)
    return FileResponse(path, media_type="application/octet-stream", filename=f"{model_id}.onnx")


@router.put(f"{API_PREFIX}/models/{{model_id}}", status_code=201,
            summary="Upload a model; the body is the file, the id its sha256 (verified)",
            openapi_extra=_BINARY_BODY, response_model=Upload, response_model_exclude_none=True,
            responses={200: {"model": Upload, "description": "the agent already has the model"},
                       **_errors(411, 413, 422, 507)})
async def upload_model(model_id: ModelId, request: Request, state: Agent):
    if state.store.has(model_id):
        return JSONResponse({"model_id": model_id, "stored": False}, status_code=200)
    length = request.headers.get("content-length")
    if length is not None and length.isdigit():
        state.store.check_fits(int(length))  # before a byte of a model that could never be kept
    size = await state.receive_model(model_id, request.stream())
    return {"model_id": model_id, "stored": True, "size_bytes": size}


@router.post(f"{API_PREFIX}/runs", summary="Run a model and return outputs, latency, placement, profile",
             responses=_RUN_ERRORS)
async def run(body: RunRequest, state: Agent):
    state.store.existing(body.model_id)  # an unknown model is a 404 whatever the inputs
    inputs = await state.decode_inputs(b64decode(body.inputs_npz, "inputs_npz"))
    reply, outputs = await state.run(body, inputs)
    if outputs is not None:
        reply = {**reply, "outputs_npz": b64encode(await _encoded(outputs))}
    return JSONResponse(jsonable_encoder(reply))


@router.post(
    f"{API_PREFIX}/runs/npz",
    summary="The same run in binary: one .npz each way, no base64 (what AgentClient uses)",
    description=(
        "The request body is an .npz of the inputs plus a uint8 member `__run__` holding the JSON of a "
        "RunRequest without `inputs_npz`. The response is an .npz of the outputs plus a uint8 member "
        "`__result__` holding the JSON result. Pickled members are refused."
    ),
    openapi_extra=_BINARY_BODY,
    response_class=Response,
    responses={200: {"content": {"application/octet-stream": {}}}, **_RUN_ERRORS},
)
async def run_npz(request: Request, state: Agent):
    inputs = await state.decode_inputs(await request.body())
    spec = inputs.pop(RUN_MEMBER, None)
    if spec is None or spec.dtype != np.uint8:
        raise AgentError(f"the .npz has no uint8 {RUN_MEMBER!r} member with the run's JSON")
    try:
        body = RunRequest.model_validate_json(spec.tobytes())
    except ValidationError as exc:
        raise RequestValidationError([{**e, "loc": ("body", *e["loc"])} for e in exc.errors()]) from None
    reply, outputs = await state.run(body, inputs)
    arrays = dict(outputs or {})
    arrays[RESULT_MEMBER] = np.frombuffer(json.dumps(jsonable_encoder(reply)).encode(), dtype=np.uint8)
    return Response(await _encoded(arrays), media_type="application/octet-stream")


@router.get(f"{API_PREFIX}/runs/{{run_id}}", summary="A past run's result (without outputs)",
            responses=_errors(404, 422))
async def run_status(run_id: RunId, state: Agent):
    if run_id not in state.runs:
        raise AgentError(f"run {run_id} is unknown to this agent (it keeps the last 256)", 404)
    return state.runs[run_id]


@router.post(f"{API_PREFIX}/contexts", status_code=201,
             summary="Build an EPContext model (QNN context binary) for a model and options",
             response_model=Context, responses=_errors(404, 411, 413, 422, 500, 502, 504, 507))
async def build_context(body: ContextRequest, state: Agent):
    return await state.build_context(body)


async def _encoded(arrays: dict) -> bytes:
    if sum(np.asarray(a).nbytes for a in arrays.values()) <= INLINE_BYTES:
        return encode_npz(arrays)
    return await run_in_threadpool(encode_npz, arrays)


def _error_response(status: int, message: str) -> JSONResponse:
    headers = {"Retry-After": "1"} if status == 503 else None
    return JSONResponse({"detail": message}, status_code=status, headers=headers)


async def _agent_error(request: Request, exc: AgentError):
    return _error_response(exc.status, str(exc))


async def _user_error(request: Request, exc: MpstudioError):
    return _error_response(422, str(exc))


async def _validation_error(request: Request, exc: RequestValidationError):
    # Say which field is wrong without echoing the (possibly huge) input back.
    problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'][1:]) or 'body'}: {e['msg']}" for e in exc.errors())
    return _error_response(422, f"invalid request: {problems}")


def create_app(config: AgentConfig) -> FastAPI:
    """The agent's ASGI app; its worker starts with the app's lifespan and stops with it."""
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
        # Declares the bearer scheme in the OpenAPI schema; the check itself is in RequestGuard.
        dependencies=[Security(bearer)],
    )
    app.state.agent = state
    app.add_middleware(RequestGuard, token=config.token, max_bytes=config.upload_bytes)
    app.add_exception_handler(AgentError, _agent_error)
    app.add_exception_handler(MpstudioError, _user_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.include_router(router)
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
    try:
        protocol = guarded_protocol(config.http, config.connection_limits())
    except ImportError as exc:
        raise MpstudioError(f"HTTP implementation {config.http!r} is not installed ({exc}); use --http auto") from None
    logging.getLogger("uvicorn.access").addFilter(RedactQuery())
    server = uvicorn.Server(uvicorn.Config(app, log_level=log_level, log_config=None, http=protocol, ws="none",
                                           timeout_keep_alive=KEEP_ALIVE_S))
    log.info("HTP is %s; %s; HTTP parser %s", "the x86_64 emulator (timings are host time)" if htp_is_emulated()
             else "the device NPU", "bearer token required" if config.token else "no token (loopback only)",
             protocol.__mro__[2].__name__)
    print(f"mpstudio agent listening on http://{host}:{port}", file=announce, flush=True)
    server.run(sockets=[sock])
