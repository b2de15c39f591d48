"""The worker process itself: its request loop, and the engine that runs models and builds context binaries.

It runs in a spawned process with its own working directory (see `handle`), so QNN's stray files, fd-1
prints and hangs stay away from the agent.
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from dataclasses import asdict
from pathlib import Path

from ... import runtime
from ...errors import MpstudioError
from ...runtime import exit_with_parent, first_line
from ..protocol import AgentError, LatencyStats
from .placement import PlacementReader
from .profiles import profile_ops
from .sessions import SessionCache, check_feeds, is_engine_error, session_key

log = logging.getLogger("mpstudio.agent")


def worker_main(conn, workdir: str, settings: dict) -> None:
    """Entry point of the worker process: serve requests from `conn` until it closes."""
    os.chdir(workdir)  # QNN writes stray files into the current directory
    # libQnnHtp prints on fd 1 at C level: keep it away from whatever the agent's stdout carries.
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.close(devnull)
    exit_with_parent()  # no orphaned worker keeps the device
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


class Engine:
    """Runs and context binaries inside the worker, over its session cache, placement reader and profiler."""

    def __init__(self, workdir: Path, settings: dict):
        self.workdir = workdir
        self.device = settings["device"]
        self.emulated = bool(settings["emulated"])
        self.max_sessions = int(settings.get("max_sessions", 4))
        self.min_free_memory = float(settings.get("min_free_memory", 0.15))
        self.intra_op_threads = int(settings.get("intra_op_threads", 0))
        self.sessions = SessionCache(self.max_sessions, self.min_free_memory, self.intra_op_threads)
        self.placements = PlacementReader(workdir)

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

        key = session_key(request)
        feeds = request["inputs"]
        started = time.perf_counter()
        result: dict = {"session_reused": False, "session_retried": False, "session_create_ms": 0.0}
        for attempt in (1, 2):
            session, reused, create_ms = self._session(key, request)
            result.update(session_reused=reused, session_create_ms=create_ms)
            check_feeds(session, feeds)
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
                if attempt == 1 and is_engine_error(exc):
                    log.warning("QNN engine error; recreating the session and retrying once")
                    self.sessions.drop(key)
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
            result["placement"] = self.placements.placement(key, request).to_dict()
        if request.get("return_profile"):
            result["profile"] = profile_ops(request, feeds, self.workdir, self.intra_op_threads,
                                            self._source(request), self._device(request)).to_dict()
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
            raise self.placements.explain_failure(request, exc) from None
        del session
        if not out.exists():
            raise AgentError("QNN created the session but wrote no context binary", 500)
        return {"path": str(out), "build_ms": (time.perf_counter() - started) * 1e3}

    def _session(self, key: tuple, request: dict):
        """(session, reused, create_ms) of the request; a session ORT cannot create says what QNN refused."""
        try:
            return self.sessions.open(key, request)
        except MpstudioError as exc:
            raise self.placements.explain_failure(request, exc) from None

    # ------------------------------------------------------------------ labels

    def _source(self, request: dict) -> str:
        return "emulator" if request["backend"] == "htp" and self.emulated else "measured"

    def _device(self, request: dict) -> str:
        if request["backend"] == "cpu":
            return f"{self.device} CPU"
        return self.device
