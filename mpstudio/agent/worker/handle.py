"""The agent's handle on its worker: a spawned process that owns every ONNX Runtime / QNN session.

QNN sessions hang after a fork, ignore `RunOptions.terminate`, print on fd 1 and leave files in the
working directory, so they live in a process of their own (spawn context, own working directory) that the
agent can kill and replace when a run hangs or crashes.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import tempfile
import threading
from pathlib import Path

from ...runtime import spawn_context
from ..protocol import AgentError
from .engine import worker_main

log = logging.getLogger("mpstudio.agent")

STARTUP_TIMEOUT_S = 120.0


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
