"""What one agent holds: its model store, its worker and the queue to it, recent runs and uploads in progress."""

from __future__ import annotations

import hashlib
import logging
import platform
import shutil
import tempfile
import time
import uuid
from collections import OrderedDict
from pathlib import Path

from starlette.concurrency import run_in_threadpool

from ... import __version__
from ...runtime import htp_is_emulated, qnn_library_path, validate_provider_options
from ..protocol import AgentError, AgentInfo, check_npz, sha256_file
from ..store import ModelStore, check_model_file
from ..worker import WorkerHandle
from .admission import DeviceQueue, UploadSlots
from .codec import INLINE_BYTES, decoded
from .config import AgentConfig, default_device_name
from .wire import ContextRequest, RunSpec

log = logging.getLogger("mpstudio.agent")


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
        self.queue = DeviceQueue(config.max_queue, config.queued_bytes)
        self.runs: OrderedDict[str, dict] = OrderedDict()
        self.uploads = UploadSlots(config.max_uploads)
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

    async def decode_inputs(self, data: bytes, members=None) -> dict:
        """A run's inputs, refused past --max-inputs-mb before any decompression."""
        return await decoded(data, self.config.inputs_bytes, members)

    async def check_inputs(self, data: bytes) -> None:
        """Refuse a run's .npz by its directory and .npy headers, off the event loop when it is large."""
        if len(data) <= INLINE_BYTES:
            check_npz(data, self.config.inputs_bytes)
        else:
            await run_in_threadpool(check_npz, data, self.config.inputs_bytes)

    # ------------------------------------------------------------------ runs

    async def run(self, body: RunSpec, encoded_inputs: bytes, members=None) -> tuple[dict, dict | None]:
        """Run on the worker; the result without outputs, and the outputs (None when not asked for).

        The inputs wait for the device as the client sent them (an .npz, often compressed) and are decoded
        only when the run's turn comes, so queued runs hold their requests' bytes, not their arrays.
        """
        await self.check_inputs(encoded_inputs)  # what can be refused is refused before the wait
        started = time.perf_counter()
        with self.store.in_use(body.model_id) as path:
            options = self.options(body.backend, body.provider_options)
            async with self.queue.slot(len(encoded_inputs)):
                inputs = await self.decode_inputs(encoded_inputs, members)
                del encoded_inputs
                request = {
                    "op": "run", "model_id": body.model_id, "model_path": str(path), "backend": body.backend,
                    "provider_options": options, "inputs": inputs, "warmup": body.warmup,
                    "iterations": body.iterations, "return_outputs": body.return_outputs,
                    "return_placement": body.return_placement, "return_profile": body.return_profile,
                    "profile_runs": body.profile_runs, "allow_cpu_fallback": body.allow_cpu_fallback,
                }
                del inputs
                result = await self.worker.call_async(request, self.config.run_timeout_s)
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

    async def receive_model(self, model_id: str, chunks) -> int:
        """Store an uploaded model: size-limited, hash-verified, checked, then moved into the store."""
        limit = self.config.upload_bytes
        part = self.store.new_incoming()
        digest = hashlib.sha256()
        size = 0
        try:
            async with self.uploads.slot():
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
