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
import struct
import tempfile
import threading
import time
from multiprocessing.reduction import ForkingPickler
from pathlib import Path

from ...runtime import spawn_context
from ..protocol import AgentError
from .engine import worker_main

log = logging.getLogger("mpstudio.agent")

STARTUP_TIMEOUT_S = 120.0
# A request pickled to at most this many bytes fits the pipe's buffer (about 200 KB on Linux) at once, so its
# send cannot block even when the worker has stopped reading; larger ones are sent from a thread.
INLINE_SEND_BYTES = 64 * 1024


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

        The run timeout starts before the send: a worker that stopped reading would otherwise block a large
        send forever, with no timeout running. A worker found dead before the request reaches it (it died
        while idle) is replaced first, so the request runs on the fresh one instead of failing.
        """
        with self._lock:
            self._revive()
            self._wait_ready()
            deadline = time.monotonic() + timeout
            try:
                self._send(ForkingPickler.dumps(request), deadline, timeout)
                if not self._conn.poll(max(deadline - time.monotonic(), 0.0)):
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

    def _send(self, data: bytes, deadline: float, timeout: float) -> None:
        """Send a pickled request by `deadline`; when the pipe is already broken the worker never saw it:
        replace it and resend."""
        try:
            self._send_by(data, deadline, timeout)
        except OSError:
            self._revive()
            self._wait_ready()
            self._send_by(data, deadline, timeout)

    def _send_by(self, data: bytes, deadline: float, timeout: float) -> None:
        if len(data) <= INLINE_SEND_BYTES:
            self._conn.send_bytes(data)
            return
        failure: list[BaseException] = []
        sender = threading.Thread(target=_send_bytes, args=(self._conn, data, failure), daemon=True,
                                  name="worker-send")
        sender.start()
        sender.join(max(deadline - time.monotonic(), 0.0))
        if sender.is_alive():
            self._process.kill()  # the blocked send fails once its reader is gone
            sender.join(10)
            raise self._timed_out(timeout)
        if failure:
            raise failure[0]

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
        """`call` for an asyncio server: sends and waits on the pipe without blocking the event loop.

        Small requests are sent on the loop (they fit the pipe's buffer) and the reply is awaited there,
        which saves two thread hand-offs per request, most of the agent's overhead on a busy small machine;
        large ones are pickled and sent from a thread. The run timeout covers the send. Falls back to
        `call` in a thread where the loop cannot watch a pipe (Windows), while the worker is starting, and
        when it has to be restarted.
        """
        loop = asyncio.get_running_loop()
        if os.name == "nt" or self._ready is None or not self.alive or not hasattr(loop, "add_reader") \
                or not self._lock.acquire(blocking=False):
            return await loop.run_in_executor(None, self.call, request, timeout)
        deadline = loop.time() + timeout
        held = True
        try:
            try:
                sent = await self._send_async(request, deadline)
            except OSError:  # died while idle, just now: `call` replaces it and sends there
                self._lock.release()
                held = False
                return await loop.run_in_executor(None, self.call, request, timeout)
            try:
                if not sent:
                    raise asyncio.TimeoutError
                await self._readable(deadline)
                reply = await self._receive(deadline)
            except asyncio.TimeoutError:
                raise await loop.run_in_executor(None, self._timed_out, timeout) from None
            except (EOFError, OSError):
                raise await loop.run_in_executor(None, self._died) from None
        except asyncio.CancelledError:
            if held:
                self._replace()  # a half-sent request or an unread reply would reach the next request
            raise
        finally:
            if held:
                self._lock.release()
        return self._result(reply)

    async def _send_async(self, request: dict, deadline: float) -> bool:
        """Send `request` by `deadline` without blocking the loop; False when the worker had to be killed
        mid-send (it stopped reading), raise OSError when the pipe was already broken."""
        loop = asyncio.get_running_loop()
        inputs = request.get("inputs") or {}
        if sum(getattr(a, "nbytes", 0) for a in inputs.values()) <= INLINE_SEND_BYTES // 2:
            data = ForkingPickler.dumps(request)
            if len(data) <= INLINE_SEND_BYTES:
                self._conn.send_bytes(data)
                return True
        else:
            data = await loop.run_in_executor(None, ForkingPickler.dumps, request)
        sending = loop.run_in_executor(None, self._conn.send_bytes, data)
        done, _ = await asyncio.wait({sending}, timeout=max(deadline - loop.time(), 0.0))
        if done:
            sending.result()
            return True
        self._process.kill()  # the blocked send fails once its reader is gone
        await asyncio.wait({sending}, timeout=10)
        if sending.done():
            sending.exception()  # retrieved: the broken pipe is the expected end of this send
        return False

    async def _readable(self, deadline: float) -> None:
        loop = asyncio.get_running_loop()
        readable = loop.create_future()
        fd = self._conn.fileno()
        loop.add_reader(fd, lambda: readable.done() or readable.set_result(None))
        try:
            await asyncio.wait_for(readable, max(deadline - loop.time(), 0.0))
        finally:
            loop.remove_reader(fd)

    async def _receive(self, deadline: float) -> dict:
        """The worker's reply: read on the loop when all of it has arrived, else from a thread by `deadline`
        (a worker stopped half-way through a large reply must not block the loop either)."""
        loop = asyncio.get_running_loop()
        if _whole_message_buffered(self._conn.fileno()):
            return self._conn.recv()
        receiving = loop.run_in_executor(None, self._conn.recv)
        done, _ = await asyncio.wait({receiving}, timeout=max(deadline - loop.time(), 0.0))
        if done:
            return receiving.result()
        self._process.kill()
        await asyncio.wait({receiving}, timeout=10)
        if receiving.done():
            receiving.exception()
        raise asyncio.TimeoutError

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


def _send_bytes(conn, data: bytes, failure: list) -> None:
    try:
        conn.send_bytes(data)
    except BaseException as exc:  # handed to the waiting thread
        failure.append(exc)


def _whole_message_buffered(fd: int) -> bool:
    """Whether a whole multiprocessing message (its length header and body) is waiting on `fd`."""
    import fcntl
    import socket
    import termios

    available = struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0"))[0]
    if available < 4:
        return False
    with socket.socket(fileno=os.dup(fd)) as peek:
        head = peek.recv(12, socket.MSG_PEEK)
    size = struct.unpack("!i", head[:4])[0]
    if size == -1:  # a message of 2 GiB or more: its length follows in 8 bytes
        return len(head) == 12 and available >= 12 + struct.unpack("!Q", head[4:12])[0]
    return available >= 4 + size
