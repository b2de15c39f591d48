"""The agent's worker: a spawned process that owns every ONNX Runtime / QNN session, and its parent handle.

QNN sessions hang after a fork, ignore `RunOptions.terminate`, print on fd 1 and leave files in the
working directory, so they live in a process of their own (spawn context, own working directory) that the
agent can kill and replace when a run hangs or crashes.
"""

from __future__ import annotations

import asyncio
import csv
import functools
import json
import logging
import multiprocessing
import multiprocessing.connection
import os
import re
import shutil
import sys
import tempfile
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path

from .. import runtime
from ..errors import MpstudioError
from ..runtime import first_line, spawn_context
from .protocol import (
    IO_QUANTIZATION_REASON,
    AgentError,
    LatencyStats,
    NodeFallback,
    OpCost,
    OpProfile,
    Placement,
)

log = logging.getLogger("mpstudio.agent")

STARTUP_TIMEOUT_S = 120.0


# ================================================================================ parent side: the handle

class WorkerHandle:
    """Starts the worker process, sends it one request at a time, and replaces it when it hangs or dies."""

    def __init__(self, root: Path, settings: dict, startup_timeout: float = STARTUP_TIMEOUT_S):
        self._root = Path(root)
        self._settings = dict(settings)
        self._startup_timeout = startup_timeout
        self._context = spawn_context()  # spawned: a forked QNN session hangs
        self._lock = threading.Lock()
        self._process = None
        self._conn = None
        self._dir: Path | None = None
        self._ready: dict | None = None
        self.restarts = 0

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    @property
    def alive(self) -> bool:
        return self._process is not None and self._process.is_alive()

    @property
    def ready_info(self) -> dict | None:
        return self._ready

    def start(self) -> None:
        """Start a worker without waiting for it to be ready (the next call waits)."""
        self._dir = Path(tempfile.mkdtemp(prefix="worker-", dir=self._root))
        parent, child = self._context.Pipe()
        process = self._context.Process(
            target=worker_main, args=(child, str(self._dir), self._settings), daemon=True, name="mpstudio-worker"
        )
        process.start()
        child.close()
        self._process, self._conn, self._ready = process, parent, None
        log.info("worker started (pid %s)", process.pid)

    def wait_ready(self) -> dict:
        with self._lock:
            return self._wait_ready()

    def _wait_ready(self) -> dict:
        if self._process is None:
            self.start()
        if self._ready is None:
            try:
                if not self._conn.poll(self._startup_timeout):
                    self._replace()
                    raise AgentError(f"the worker did not start within {self._startup_timeout:.0f} s", 503)
                self._ready = self._conn.recv()
            except (EOFError, OSError):
                code = self._exitcode()
                self._replace()
                raise AgentError(f"the worker process exited while starting (exit code {code})", 503) from None
        return self._ready

    def call(self, request: dict, timeout: float) -> dict:
        """Send one request and return the worker's result; raise AgentError on failure, hang or crash.

        A worker found dead before the request reaches it (it died while idle) is replaced first, so the
        request runs on the fresh one instead of failing.
        """
        with self._lock:
            self._revive()
            self._wait_ready()
            try:
                self._send(request)
                if not self._conn.poll(timeout):
                    raise self._timed_out(timeout)
                reply = self._conn.recv()
            except (EOFError, OSError):
                raise self._died() from None
        return self._result(reply)

    def _revive(self) -> None:
        """Replace a worker that exited while nobody was talking to it."""
        if self._process is not None and not self._process.is_alive():
            pid, code = self.pid, self._exitcode()
            log.warning("worker %s had exited while idle (exit code %s); starting a new one", pid, code)
            self._replace()

    def _send(self, request: dict) -> None:
        """Send a request; when the pipe is already broken the worker never saw it: replace it and resend."""
        try:
            self._conn.send(request)
        except OSError:
            self._revive()
            self._wait_ready()
            self._conn.send(request)

    def _timed_out(self, timeout: float) -> AgentError:
        """Kill and replace a worker that overran; the error the request gets."""
        pid = self.pid
        self._replace()
        return AgentError(
            f"the request exceeded the agent's run timeout of {timeout:g} s; its worker (pid {pid}) was "
            "killed and replaced",
            504,
        )

    def _died(self) -> AgentError:
        """Replace a worker that died mid-request; the error the request gets."""
        pid, code = self.pid, self._exitcode()
        self._replace()
        return AgentError(
            f"the worker process (pid {pid}) died during the request (exit code {code}); it was replaced, "
            "and the next request runs on a fresh worker",
            502,
        )

    @staticmethod
    def _result(reply: dict) -> dict:
        if reply.get("ok"):
            return reply["result"]
        raise AgentError(reply["error"], int(reply.get("status", 422)))

    async def call_async(self, request: dict, timeout: float) -> dict:
        """`call` for an asyncio server: waits on the pipe in the event loop instead of a thread.

        Saves two thread hand-offs per request, which on a busy small machine are most of the agent's
        overhead. Falls back to `call` in a thread where the loop cannot watch a pipe (Windows), while the
        worker is starting, and when it has to be restarted.
        """
        loop = asyncio.get_running_loop()
        if os.name == "nt" or self._ready is None or not self.alive or not hasattr(loop, "add_reader") \
                or not self._lock.acquire(blocking=False):
            return await loop.run_in_executor(None, self.call, request, timeout)
        try:
            self._conn.send(request)
        except OSError:  # died while idle, just now: `call` replaces it and sends there
            self._lock.release()
            return await loop.run_in_executor(None, self.call, request, timeout)
        try:
            try:
                readable = loop.create_future()
                fd = self._conn.fileno()
                loop.add_reader(fd, lambda: readable.done() or readable.set_result(None))
                try:
                    await asyncio.wait_for(readable, timeout)
                except asyncio.TimeoutError:
                    raise self._timed_out(timeout) from None
                finally:
                    loop.remove_reader(fd)
                reply = self._conn.recv()
            except (EOFError, OSError):
                raise self._died() from None
        finally:
            self._lock.release()
        return self._result(reply)

    def stop(self) -> None:
        with self._lock:
            self._kill(grace=5.0)

    def _exitcode(self):
        if self._process is None:
            return None
        self._process.join(timeout=2)
        return self._process.exitcode

    def _replace(self) -> None:
        self._kill()
        self.restarts += 1
        self.start()

    def _kill(self, grace: float = 0.0) -> None:
        process, old_dir = self._process, self._dir
        if process is not None:
            if grace and self._conn is not None:
                self._conn.close()  # an idle worker leaves its loop when the pipe closes
                self._conn = None
                process.join(timeout=grace)
            if process.is_alive():
                process.kill()
            process.join(timeout=10)
            log.info("worker %s stopped (exit code %s)", process.pid, process.exitcode)
        if self._conn is not None:
            self._conn.close()
        self._process = self._conn = self._ready = None
        if old_dir is not None:
            shutil.rmtree(old_dir, ignore_errors=True)


# ================================================================================ child side: the worker

def worker_main(conn, workdir: str, settings: dict) -> None:
    """Entry point of the worker process: serve requests from `conn` until it closes."""
    os.chdir(workdir)  # QNN writes stray files into the current directory
    # libQnnHtp prints on fd 1 at C level: keep it away from whatever the agent's stdout carries.
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.close(devnull)
    _exit_with_parent()
    engine = Engine(Path(workdir), settings)
    conn.send(engine.probe())
    while True:
        try:
            request = conn.recv()
        except (EOFError, OSError):
            break
        try:
            reply = {"ok": True, "result": engine.handle(request)}
        except AgentError as exc:
            reply = {"ok": False, "error": str(exc), "status": exc.status}
        except MpstudioError as exc:
            reply = {"ok": False, "error": str(exc), "status": 422}
        except Exception as exc:  # an internal fault: report it instead of dying silently
            reply = {"ok": False, "error": f"internal worker error: {type(exc).__name__}: {first_line(exc)}",
                     "status": 500}
        conn.send(reply)


def _exit_with_parent() -> None:
    """Exit when the agent process dies, so no orphaned worker keeps the device."""
    parent = multiprocessing.parent_process()
    if parent is None:
        return

    def watch():
        multiprocessing.connection.wait([parent.sentinel])
        os._exit(0)

    threading.Thread(target=watch, daemon=True, name="parent-watch").start()


class Engine:
    """Sessions, runs, placement, profiles and context binaries, inside the worker."""

    def __init__(self, workdir: Path, settings: dict):
        self.workdir = workdir
        self.device = settings["device"]
        self.emulated = bool(settings["emulated"])
        self.max_sessions = int(settings.get("max_sessions", 4))
        self.min_free_memory = float(settings.get("min_free_memory", 0.15))
        self.intra_op_threads = int(settings.get("intra_op_threads", 0))
        self._sessions: OrderedDict[tuple, object] = OrderedDict()
        self._placements: dict[tuple, Placement] = {}

    # ------------------------------------------------------------------ requests

    def probe(self) -> dict:
        info = {"pid": os.getpid(), "htp_error": None, "htp_available": False}
        try:
            runtime.register_qnn()
            info["htp_available"] = True
        except MpstudioError as exc:
            info["htp_error"] = str(exc)
        return info

    def handle(self, request: dict) -> dict:
        op = request.get("op")
        if op == "run":
            return self.run(request)
        if op == "context":
            return self.build_context(request)
        raise AgentError(f"unknown worker request {op!r}", 500)

    def run(self, request: dict) -> dict:
        import numpy as np

        key = _session_key(request)
        feeds = request["inputs"]
        started = time.perf_counter()
        result: dict = {"session_reused": False, "session_retried": False, "session_create_ms": 0.0}
        for attempt in (1, 2):
            session, reused, create_ms = self._session(key, request)
            result.update(session_reused=reused, session_create_ms=create_ms)
            self._check_feeds(session, feeds)
            try:
                for _ in range(int(request["warmup"])):
                    session.run(None, feeds)
                times: list[int] = []
                names = [o.name for o in session.get_outputs()]
                for _ in range(int(request["iterations"])):
                    t0 = time.perf_counter_ns()
                    outputs = session.run(None, feeds)
                    times.append(time.perf_counter_ns() - t0)
                break
            except Exception as exc:
                # An HTP subsystem restart surfaces as ENGINE_ERROR: the session must be recreated (seed 001).
                if attempt == 1 and _is_engine_error(exc):
                    log.warning("QNN engine error; recreating the session and retrying once")
                    self._sessions.pop(key, None)
                    result["session_retried"] = True
                    continue
                raise MpstudioError(f"the {request['backend']} run failed: {first_line(exc)}") from None
        if request.get("return_outputs", True):
            result["outputs"] = {name: np.asarray(value) for name, value in zip(names, outputs)}
        result["latency"] = asdict(
            LatencyStats.from_times(times, source=self._source(request), device=self._device(request),
                                    backend=request["backend"])
        )
        if request.get("return_placement"):
            result["placement"] = self.placement(key, request).to_dict()
        if request.get("return_profile"):
            result["profile"] = self.profile(request, feeds).to_dict()
        result["worker_ms"] = (time.perf_counter() - started) * 1e3
        return result

    def build_context(self, request: dict) -> dict:
        out = self.workdir / f"context-{uuid.uuid4().hex}_ctx.onnx"
        started = time.perf_counter()
        config = {"ep.context_enable": "1", "ep.context_file_path": str(out), "ep.context_embed_mode": "1"}
        try:
            session = runtime.create_session(
                request["model_path"], "htp", request["provider_options"], session_config=config,
                allow_cpu_fallback=bool(request.get("allow_cpu_fallback")),
            )
        except MpstudioError as exc:
            raise self._explain_failure(request, exc) from None
        del session
        if not out.exists():
            raise AgentError("QNN created the session but wrote no context binary", 500)
        return {"path": str(out), "build_ms": (time.perf_counter() - started) * 1e3}

    # ------------------------------------------------------------------ sessions

    def _session(self, key: tuple, request: dict):
        session = self._sessions.get(key)
        if session is not None:
            self._sessions.move_to_end(key)
            return session, True, 0.0
        self._make_room()
        started = time.perf_counter()
        try:
            session = runtime.create_session(
                request["model_path"], request["backend"], request["provider_options"],
                allow_cpu_fallback=bool(request.get("allow_cpu_fallback")),
                intra_op_threads=self.intra_op_threads,
            )
        except MpstudioError as exc:
            raise self._explain_failure(request, exc) from None
        self._sessions[key] = session
        return session, False, (time.perf_counter() - started) * 1e3

    def _make_room(self) -> None:
        """Drop least recently used sessions beyond the limit or while memory is short."""
        while self._sessions and (len(self._sessions) >= self.max_sessions or _memory_is_short(self.min_free_memory)):
            dropped, _ = self._sessions.popitem(last=False)
            log.info("session dropped to free memory: %s", dropped[0][:12])

    @staticmethod
    def _check_feeds(session, feeds: dict) -> None:
        expected = {i.name: i for i in session.get_inputs()}
        missing = sorted(set(expected) - set(feeds))
        unknown = sorted(set(feeds) - set(expected))
        if missing or unknown:
            parts = []
            if missing:
                parts.append(f"missing inputs {missing}")
            if unknown:
                parts.append(f"unknown inputs {unknown}")
            raise MpstudioError(f"the inputs do not match the model: {'; '.join(parts)} (model inputs: {sorted(expected)})")
        for name, meta in expected.items():
            shape = tuple(feeds[name].shape)
            want = meta.shape
            if len(shape) != len(want) or any(isinstance(w, int) and w != s for w, s in zip(want, shape)):
                raise MpstudioError(f"input {name!r} has shape {list(shape)}; the model expects {want}")

    # ------------------------------------------------------------------ placement and failures

    def placement(self, key: tuple, request: dict) -> Placement:
        if request["backend"] == "cpu":
            nodes = _model_nodes(request["model_path"])
            return Placement("cpu", (), tuple(NodeFallback(n, t, "cpu backend") for n, t in nodes), 0)
        if key not in self._placements:
            log_text, error = self._verbose_session(request)
            if error is not None:
                raise error
            self._placements[key] = parse_placement(log_text, _model_nodes(request["model_path"]))
        return self._placements[key]

    def _verbose_session(self, request: dict) -> tuple[str, MpstudioError | None]:
        """Create a throwaway session with ORT's verbose log captured; its per-run logging is too slow to keep."""
        log_path = self.workdir / f"ort-verbose-{uuid.uuid4().hex}.log"
        error = None
        with _capture_fd2(log_path):
            try:
                session = runtime.create_session(
                    request["model_path"], request["backend"], request["provider_options"],
                    allow_cpu_fallback=bool(request.get("allow_cpu_fallback")), log_severity=0,
                )
                del session
            except MpstudioError as exc:
                error = exc
        text = log_path.read_text(errors="replace")
        log_path.unlink(missing_ok=True)
        return text, error

    def _explain_failure(self, request: dict, error: MpstudioError) -> MpstudioError:
        """Replace ORT's generic message with the nodes QNN refused and QNN's reasons, from the verbose log."""
        if request["backend"] != "htp":
            return error
        text, _ = self._verbose_session(request)
        refused = parse_refusals(text)
        if not refused:
            return error
        shown = [f"node {f.node!r} ({f.op_type}): {f.reason.rstrip('.')}" for f in refused[:12]]
        more = f"; and {len(refused) - 12} more" if len(refused) > 12 else ""
        hint = _dynamic_shape_hint(request["model_path"])
        if not request.get("allow_cpu_fallback"):
            hint += " Nodes QNN cannot take are errors because CPU fallback is off for htp runs."
        return AgentError(
            f"the model cannot run on the HTP backend; QNN refused {len(refused)} node(s): "
            + "; ".join(shown) + more + "." + hint,
            422,
        )

    # ------------------------------------------------------------------ profiles

    def profile(self, request: dict, feeds: dict) -> OpProfile:
        runs = max(1, min(int(request.get("profile_runs", 5)), 50))
        backend = request["backend"]
        prefix = self.workdir / f"profile-{uuid.uuid4().hex}"
        path = prefix.with_suffix(".csv") if backend == "htp" else prefix
        session = runtime.create_session(
            request["model_path"], backend, request["provider_options"], profiling_file=path, profile_ops=True,
            allow_cpu_fallback=bool(request.get("allow_cpu_fallback")), intra_op_threads=self.intra_op_threads,
        )
        session.run(None, feeds)  # the first run carries one-time costs: profiled but left out below
        for _ in range(runs):
            session.run(None, feeds)
        nodes = _model_nodes(request["model_path"])
        if backend == "cpu":
            json_path = Path(session.end_profiling())
            del session
            ops = parse_cpu_profile(json.loads(json_path.read_text()), nodes, skip_runs=1)
            json_path.unlink(missing_ok=True)
            unit = "us"
        else:
            del session  # the CSV is complete once the session is gone
            ops = parse_qnn_profile(path.read_text(), nodes, skip_runs=1)
            path.unlink(missing_ok=True)
            unit = "cycles"
        return OpProfile(ops=tuple(ops), unit=unit, source=self._source(request), device=self._device(request),
                         backend=backend, runs=runs)

    # ------------------------------------------------------------------ labels

    def _source(self, request: dict) -> str:
        return "emulator" if request["backend"] == "htp" and self.emulated else "measured"

    def _device(self, request: dict) -> str:
        if request["backend"] == "cpu":
            return f"{self.device} CPU"
        return self.device


def _session_key(request: dict) -> tuple:
    return (
        request["model_id"],
        request["backend"],
        tuple(sorted(request["provider_options"].items())),
        bool(request.get("allow_cpu_fallback")),
    )


def _is_engine_error(exc: BaseException) -> bool:
    return type(exc).__name__ == "EngineError" or "ENGINE_ERROR" in str(exc)


@contextmanager
def _capture_fd2(path: Path):
    """Send fd 2 to `path` for the duration: ORT writes its log to stderr from C++, past Python's sys.stderr."""
    sys.stderr.flush()
    saved = os.dup(2)
    target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(target, 2)
    os.close(target)
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)


def _memory_is_short(min_free_fraction: float) -> bool:
    """True when less than `min_free_fraction` of physical memory is available (unknown: False)."""
    try:
        import psutil  # optional; present on most installs

        memory = psutil.virtual_memory()
        return memory.available < min_free_fraction * memory.total
    except ImportError:
        pass
    try:
        fields = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines() if ":" in line)
        total = int(fields["MemTotal"].split()[0])
        available = int(fields["MemAvailable"].split()[0])
        return available < min_free_fraction * total
    except (OSError, KeyError, ValueError):
        return False


@functools.lru_cache(maxsize=8)
def _model_nodes(model_path: str) -> tuple[tuple[str, str], ...]:
    """(name, op_type) of the model's top-level nodes, in order. Model files are named by their sha256, so a
    path always holds the same model."""
    import onnx

    model = onnx.load(model_path, load_external_data=False)
    return tuple((n.name, n.op_type) for n in model.graph.node)


def _dynamic_shape_hint(model_path: str) -> str:
    import onnx

    model = onnx.load(model_path, load_external_data=False)
    dynamic = []
    for value in model.graph.input:
        dims = value.type.tensor_type.shape.dim
        if any(not d.HasField("dim_value") for d in dims):
            shape = [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in dims]
            dynamic.append(f"{value.name} {shape}")
    if not dynamic:
        return ""
    return (f" The model has dynamic input shapes ({', '.join(dynamic)}), which QNN does not support: fix them "
            "to static sizes (python -m onnxruntime.tools.make_dynamic_shape_fixed).")


# ================================================================================ ORT log and profile parsing

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_BLOCK = re.compile(r"Validation (FAILED|PASSED) for \d+ nodes in \w+ \(([^)]*)\)")
_BLOCK_NODE = re.compile(r"^\s*Operator type: (\S+) Node name: (.*?) Node index: \d+")
_BLOCK_REASON = re.compile(r"^\s*REASON : (.*)")
_PLACED = re.compile(r"(All nodes|Node\(s\)) placed on \[(\w+)\]\. Number of nodes: (\d+)")
_PLACED_NODE = re.compile(r"VerifyEachNodeIsAssignedToAnEp\]\s+(\S+) \((.*)\)\s*$")
_IO_Q = "not take Q nodes that consume a graph input"
_IO_DQ = "not take DQ nodes that produce a graph output"


def _clean_reason(reason: str) -> str:
    if _IO_Q in reason or _IO_DQ in reason:
        return f"{IO_QUANTIZATION_REASON} (offload_graph_io_quantization)"
    return reason.strip() or "QNN validation failed"


def _validation_blocks(text: str) -> list[list]:
    """[FAILED|PASSED, [(op_type, node)], reason] for each node-unit validation QNN logged."""
    blocks = []
    current = None
    for raw in text.splitlines():
        line = _ANSI.sub("", raw)
        match = _BLOCK.search(line)
        if match:
            current = [match.group(1), [], ""]
            blocks.append(current)
            continue
        if current is None:
            continue
        node = _BLOCK_NODE.match(line)
        if node:
            current[1].append((node.group(1), node.group(2)))
            continue
        reason = _BLOCK_REASON.match(line)
        if reason:
            current[2] = reason.group(1)
            continue
        if line.strip() == "" or line.startswith("20"):
            current = None
    return blocks


def parse_refusals(text: str) -> list[NodeFallback]:
    """Nodes QNN refused (not counting graph-I/O quantization it leaves to CPU by design), with reasons."""
    refused: dict[str, NodeFallback] = {}
    for status, nodes, reason in _validation_blocks(text):
        if status != "FAILED":
            continue
        reason = _clean_reason(reason)
        if reason.startswith(IO_QUANTIZATION_REASON):
            continue
        for op_type, name in nodes:
            refused.setdefault(name, NodeFallback(name, op_type, reason))
    return list(refused.values())


def parse_placement(text: str, model_nodes: Sequence[tuple[str, str]]) -> Placement:
    """Placement from ORT's verbose session log: its final node assignment, with QNN's reasons for CPU nodes."""
    reasons: dict[str, str] = {}
    for status, nodes, reason in _validation_blocks(text):
        if status == "FAILED":
            for _, name in nodes:
                reasons.setdefault(name, _clean_reason(reason))
    provider = None
    partitions = 0
    cpu: list[NodeFallback] = []
    for raw in text.splitlines():
        line = _ANSI.sub("", raw)
        placed = _PLACED.search(line)
        if placed:
            provider = placed.group(2)
            if provider == "QNNExecutionProvider":
                partitions = int(placed.group(3))
            continue
        node = _PLACED_NODE.search(line)
        if node and provider == "CPUExecutionProvider":
            op_type, name = node.group(1), node.group(2)
            cpu.append(NodeFallback(name, op_type, reasons.get(name, "not taken into a QNN partition")))
    on_cpu = {f.node for f in cpu}
    on_htp = tuple(name for name, _ in model_nodes if name not in on_cpu)
    return Placement("htp", on_htp, tuple(cpu), partitions)


def _map_op(sources: list[str], qnn_op: str, model_nodes: dict[str, str]) -> tuple[str, str, tuple[str, ...]]:
    """(node, op_type, onnx_nodes) for a profiled op: its main ONNX node is the first that is not a Q/DQ."""
    known: list[str] = []
    # ORT's graph rewrites suffix node names with "_token_N"; the stem is the ONNX node.
    for name in sources or [qnn_op]:
        stem = name if name in model_nodes else re.sub(r"(_token_\d+)+$", "", name)
        if stem in model_nodes and stem not in known:
            known.append(stem)
    if not known:
        return qnn_op, "", ()
    main = next((s for s in known if model_nodes[s] not in ("QuantizeLinear", "DequantizeLinear")), known[0])
    return main, model_nodes[main], tuple(known)


def parse_qnn_profile(text: str, model_nodes: Sequence[tuple[str, str]], skip_runs: int = 1) -> list[OpCost]:
    """Mean cycles per run of each QNN op in a detailed profile CSV with the ONNX source-ops column."""
    nodes = dict(model_nodes)
    runs: list[list[tuple[str, float, list[str]]]] = []
    for row in csv.DictReader(text.splitlines()):
        event = row.get("Event Identifier") or ""
        if row.get("Message") == "BACKEND" and event == "Accelerator (execute) time (cycles)":
            runs.append([])
        elif row.get("Message") == "NODE" and runs and row.get("Unit of Measurement") == "CYCLES":
            name = re.sub(r"(:OpId_\d+)? \(cycles\)$", "", event)
            if name.startswith(("Input OpId", "Output OpId")):
                continue
            sources = [s for s in (row.get("ONNX Source Ops") or "").split(";") if s]
            runs[-1].append((name, float(row["Time"]), sources))
    kept = runs[skip_runs:] or runs
    totals: OrderedDict[str, list] = OrderedDict()
    for run in kept:
        for name, cycles, sources in run:
            entry = totals.setdefault(name, [0.0, sources])
            entry[0] += cycles
    ops = []
    for name, (cycles, sources) in totals.items():
        node, op_type, onnx_nodes = _map_op(sources, name, nodes)
        ops.append(OpCost(op=name, node=node, op_type=op_type, onnx_nodes=onnx_nodes,
                          cost=cycles / max(len(kept), 1), unit="cycles"))
    return ops


def parse_cpu_profile(events: list[dict], model_nodes: Sequence[tuple[str, str]],
                      skip_runs: int = 1) -> list[OpCost]:
    """Mean microseconds per run of each ORT CPU kernel, from ORT's JSON profile."""
    nodes = dict(model_nodes)
    run_starts = [e["ts"] for e in events if e.get("cat") == "Session" and e.get("name") == "model_run"]
    cutoff = sorted(run_starts)[skip_runs] if len(run_starts) > skip_runs else -1
    runs = max(len(run_starts) - (skip_runs if cutoff >= 0 else 0), 1)
    totals: OrderedDict[str, list] = OrderedDict()
    for event in events:
        if event.get("cat") != "Node" or not event.get("name", "").endswith("_kernel_time") or event["ts"] < cutoff:
            continue
        name = event["name"][: -len("_kernel_time")]
        entry = totals.setdefault(name, [0.0, event.get("args", {}).get("op_name", "")])
        entry[0] += float(event["dur"])
    ops = []
    for name, (dur, kernel) in totals.items():
        node, op_type, onnx_nodes = _map_op([], name, nodes)
        ops.append(OpCost(op=f"{name} ({kernel})" if kernel else name, node=node, op_type=op_type,
                          onnx_nodes=onnx_nodes, cost=dur / runs, unit="us"))
    return ops
