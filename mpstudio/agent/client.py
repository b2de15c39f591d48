"""Clients of the agent: `AgentClient` for one agent by URL, `LocalAgent` for the embedded one on loopback."""

from __future__ import annotations

import atexit
import hashlib
import json
import os
import queue
import re
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from pathlib import Path

import httpx
import numpy as np

from ..errors import MpstudioError
from .protocol import (
    API_PREFIX,
    TOKEN_ENV,
    RESULT_MEMBER,
    RUN_MEMBER,
    AgentError,
    AgentInfo,
    AgentRunTimeout,
    ContextBinary,
    RunResult,
    check_model_id,
    decode_npz,
    encode_npz,
    is_model_id,
    sha256_file,
)

# Failures worth another try: the agent restarting or briefly unreachable, or its queue full.
_TRANSIENT = (httpx.ConnectError, httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError, httpx.ConnectTimeout,
              httpx.PoolTimeout)


class AgentClient:
    """One agent over HTTP. Models are uploaded once (by sha256); runs return numpy outputs and results.

    `timeout` bounds one request (a run may wait in the agent's queue first); transient failures (agent
    unreachable, connection dropped, queue full) are retried `retries` times with a growing pause.
    `max_response_mb` bounds what an agent may send back: an answer's bytes, and a run's outputs once
    decompressed (an agent is another machine; its answers are checked like a request on the agent).
    """

    def __init__(self, url: str, token: str | None = None, *, timeout: float = 900.0, connect_timeout: float = 5.0,
                 retries: int = 2, backoff_s: float = 0.5, max_response_mb: float = 1024.0):
        self.url = url.rstrip("/")
        self.max_response_bytes = int(max_response_mb * 2**20)
        self.retries = retries
        self.backoff_s = backoff_s
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        # TCP_NODELAY: a request's headers and body leave in separate writes; Nagle would hold the second.
        transport = httpx.HTTPTransport(socket_options=[(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)])
        self._http = httpx.Client(base_url=self.url, headers=headers, transport=transport,
                                  timeout=httpx.Timeout(timeout, connect=connect_timeout))
        self._known_models: set[str] = set()
        self._digests: dict[tuple, str] = {}
        self._info: AgentInfo | None = None

    def __repr__(self) -> str:
        return f"AgentClient({self.url!r})"

    # ------------------------------------------------------------------ basics

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> "AgentClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def health(self, timeout: float = 5.0) -> dict:
        return self._request("GET", "/health", timeout=timeout, retries=0).json()

    def is_healthy(self, timeout: float = 5.0) -> bool:
        try:
            return self.health(timeout).get("status") == "ok"
        except (MpstudioError, httpx.HTTPError):
            return False

    def info(self, refresh: bool = False) -> AgentInfo:
        if self._info is None or refresh:
            self._info = AgentInfo.from_wire(self._request("GET", f"{API_PREFIX}/info").json())
        return self._info

    # ------------------------------------------------------------------ models

    def model_id(self, model: str | os.PathLike | bytes) -> str:
        """The sha256 of a model given as a file, bytes, or already as an id."""
        if isinstance(model, (bytes, bytearray, memoryview)):
            return hashlib.sha256(model).hexdigest()
        if _only_an_id(model):
            return model
        path = Path(model)
        if not path.is_file():
            raise MpstudioError(f"model file {path} does not exist")
        stat = path.stat()
        key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns)
        if key not in self._digests:
            self._digests[key] = sha256_file(path)
        return self._digests[key]

    def has_model(self, model_id: str) -> bool:
        response = self._request("GET", f"{API_PREFIX}/models/{check_model_id(model_id)}", ok=(200, 404))
        return response.status_code == 200

    def upload(self, model: str | os.PathLike | bytes) -> str:
        """Upload a model unless the agent already has it; return its id."""
        model_id = self.model_id(model)
        if model_id in self._known_models or self.has_model(model_id):
            self._known_models.add(model_id)
            return model_id
        if _only_an_id(model):
            raise MpstudioError(f"agent {self.url} does not have model {model_id} and no file was given to upload")
        data = bytes(model) if isinstance(model, (bytes, bytearray, memoryview)) else Path(model).read_bytes()
        self._request("PUT", f"{API_PREFIX}/models/{model_id}", content=data,
                      headers={"Content-Type": "application/octet-stream"})
        self._known_models.add(model_id)
        return model_id

    def download(self, model_id: str, destination: str | os.PathLike) -> Path:
        """Save a model the agent holds (for example a context binary) to `destination`."""
        response = self._request("GET", f"{API_PREFIX}/models/{check_model_id(model_id)}/content")
        path = Path(destination)
        path.write_bytes(response.content)
        return path

    # ------------------------------------------------------------------ runs

    def run(
        self,
        model: str | os.PathLike | bytes,
        inputs: Mapping[str, np.ndarray],
        *,
        backend: str = "htp",
        provider_options: Mapping[str, object] | None = None,
        warmup: int = 0,
        iterations: int = 1,
        outputs: bool = True,
        placement: bool = False,
        profile: bool = False,
        profile_runs: int = 5,
        allow_cpu_fallback: bool = False,
    ) -> RunResult:
        """Run `model` on the agent's `backend` and return what was asked for.

        `model` is a file, bytes or a model id; it is uploaded first when the agent lacks it.
        """
        model_id = self.upload(model)
        arrays = dict(inputs)
        if RUN_MEMBER in arrays:
            raise MpstudioError(f"{RUN_MEMBER!r} is reserved and cannot name a model input")
        spec = {
            "model_id": model_id,
            "backend": backend,
            "provider_options": {k: (v if isinstance(v, (str, int, bool)) else str(v))
                                 for k, v in (provider_options or {}).items()},
            "warmup": warmup,
            "iterations": iterations,
            "return_outputs": outputs,
            "return_placement": placement,
            "return_profile": profile,
            "profile_runs": profile_runs,
            "allow_cpu_fallback": allow_cpu_fallback,
        }
        # The binary form: one .npz each way, the run's JSON inside it, no base64 of the tensors.
        arrays[RUN_MEMBER] = np.frombuffer(json.dumps(spec).encode(), dtype=np.uint8)
        body = encode_npz(arrays)
        post = dict(content=body, headers={"Content-Type": "application/octet-stream"})
        try:
            response = self._request("POST", f"{API_PREFIX}/runs/npz", **post)
        except AgentError as exc:
            if exc.status != 404 or model_id not in self._known_models or _only_an_id(model):
                raise
            # The agent lost the model (restarted with a fresh work directory): upload once more.
            self._known_models.discard(model_id)
            self.upload(model)
            response = self._request("POST", f"{API_PREFIX}/runs/npz", **post)
        try:
            arrays = decode_npz(response.content, self.max_response_bytes)
        except MpstudioError as exc:
            raise AgentError(f"agent {self.url} sent run outputs that were refused: {exc} (AgentClient's "
                             "max_response_mb)", 502) from None
        result = arrays.pop(RESULT_MEMBER, None)
        if result is None:
            raise AgentError(f"agent {self.url} sent a run result without {RESULT_MEMBER!r}", 502)
        return RunResult.from_wire(json.loads(result.tobytes()), agent=self.url, outputs=arrays)

    def build_context(self, model: str | os.PathLike | bytes, provider_options: Mapping[str, object] | None = None,
                      *, allow_cpu_fallback: bool = False) -> ContextBinary:
        """Build an EPContext model (a QNN context binary embedded in ONNX) on the agent; download() fetches it."""
        model_id = self.upload(model)
        data = self._request("POST", f"{API_PREFIX}/contexts", json={
            "model_id": model_id, "provider_options": dict(provider_options or {}),
            "allow_cpu_fallback": allow_cpu_fallback,
        }).json()
        self._known_models.add(data["model_id"])
        return ContextBinary(model_id=data["model_id"], source_model_id=data["source_model_id"],
                             provider_options=data["provider_options"], size_bytes=int(data["size_bytes"]),
                             build_ms=float(data["build_ms"]))

    # ------------------------------------------------------------------ transport

    def _request(self, method: str, path: str, *, ok=(200, 201), retries: int | None = None,
                 timeout: float | None = None, **kwargs) -> httpx.Response:
        attempts = 1 + (self.retries if retries is None else retries)
        if timeout is not None:
            kwargs["timeout"] = timeout
        for attempt in range(attempts):
            last = attempt == attempts - 1
            try:
                response = self._bounded(method, path, **kwargs)
            except _TRANSIENT as exc:
                if last:
                    raise AgentError(f"agent {self.url} is unreachable: {type(exc).__name__}: {exc}", 503) from None
                time.sleep(self.backoff_s * 2**attempt)
                continue
            except httpx.TimeoutException:
                raise AgentError(f"agent {self.url} did not answer {method} {path} in time", 504) from None
            if response.status_code in ok:
                return response
            if response.status_code == 503 and not last:
                time.sleep(float(response.headers.get("retry-after", self.backoff_s * 2**attempt)))
                continue
            if response.status_code == 504:
                raise AgentRunTimeout(f"agent {self.url}: {_detail(response)}")
            raise AgentError(f"agent {self.url}: {_detail(response)}", response.status_code)
        raise AssertionError("unreachable")

    def _bounded(self, method: str, path: str, **kwargs) -> httpx.Response:
        """The response, read only up to `max_response_bytes` (its Content-Length is checked first)."""
        request = self._http.build_request(method, path, **kwargs)
        response = self._http.send(request, stream=True)
        try:
            limit = self.max_response_bytes
            declared = response.headers.get("content-length", "")
            too_large = AgentError(f"agent {self.url} answered {method} {path} with more than "
                                   f"{limit / 2**20:g} MB (AgentClient's max_response_mb)", 502)
            if declared.isdigit() and int(declared) > limit:
                raise too_large
            chunks, size = [], 0
            for chunk in response.iter_bytes():
                size += len(chunk)
                if size > limit:
                    raise too_large
                chunks.append(chunk)
        finally:
            response.close()
        # The body is already decoded: its encoding and framing headers no longer describe it.
        headers = [(k, v) for k, v in response.headers.multi_items()
                   if k.lower() not in ("content-encoding", "content-length", "transfer-encoding")]
        return httpx.Response(response.status_code, headers=headers, content=b"".join(chunks), request=request)


def _only_an_id(model) -> bool:
    """True when `model` is a model id and not also the name of a file: there is nothing to upload."""
    return is_model_id(model) and not Path(model).exists()


def _detail(response: httpx.Response) -> str:
    try:
        detail = response.json().get("detail")
    except ValueError:
        detail = None
    if isinstance(detail, list):  # FastAPI's own validation format
        detail = "; ".join(str(d.get("msg", d)) for d in detail)
    return f"{response.status_code} {detail or response.text[:200] or response.reason_phrase}"


class LocalAgent:
    """The embedded default: `mpstudio agent serve` on 127.0.0.1 with a random port and token, as a child
    process. Use as a context manager (or call stop()); it is also stopped when Python exits."""

    def __init__(self, *, run_timeout: float | None = None, max_upload_mb: float | None = None,
                 workdir: str | os.PathLike | None = None, device_name: str | None = None,
                 extra_args: tuple[str, ...] = (), startup_timeout: float = 90.0,
                 log_path: str | os.PathLike | None = None, token: str | None = None):
        self.token = token or secrets.token_urlsafe(32)
        self.startup_timeout = startup_timeout
        self._args = ["--host", "127.0.0.1", "--port", "0"]
        for flag, value in (("--run-timeout", run_timeout), ("--max-upload-mb", max_upload_mb),
                            ("--workdir", workdir), ("--device-name", device_name)):
            if value is not None:
                self._args += [flag, str(value)]
        self._args += list(extra_args)
        # A folder of this process's holds the agent's work directory and log unless they are given; made by
        # start(), it goes when the agent is stopped, even an agent that was killed and could not remove its own.
        self._own_dir: Path | None = None
        self._own_workdir = workdir is None
        self._own_log = log_path is None
        self.log_path = Path(log_path) if log_path is not None else None
        self.url: str | None = None
        self._process: subprocess.Popen | None = None
        self._client: AgentClient | None = None

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process else None

    @property
    def client(self) -> AgentClient:
        if self._client is None:
            raise MpstudioError("the local agent is not started")
        return self._client

    def start(self) -> "LocalAgent":
        if self._process is not None:
            return self
        env = {**os.environ, TOKEN_ENV: self.token}  # never on the command line, where `ps` shows it
        args = list(self._args)
        if self._own_workdir or self._own_log:
            self._own_dir = Path(tempfile.mkdtemp(prefix="mpstudio-local-agent-"))
            if self._own_workdir:
                args += ["--workdir", str(self._own_dir / "work")]
            if self._own_log:
                self.log_path = self._own_dir / "agent.log"
        log_file = open(self.log_path, "ab")
        self._process = subprocess.Popen(
            [sys.executable, "-m", "mpstudio.agent", "serve", *args],
            stdout=subprocess.PIPE, stderr=log_file, stdin=subprocess.DEVNULL, env=env,
        )
        log_file.close()
        atexit.register(self.stop)
        try:
            self.url = self._read_url()
            self._client = AgentClient(self.url, self.token)
            deadline = time.monotonic() + self.startup_timeout
            while not self._client.is_healthy(timeout=2.0):
                if self._process.poll() is not None or time.monotonic() > deadline:
                    raise MpstudioError("the local agent did not become healthy")
                time.sleep(0.05)
            self._client.info()  # waits until the worker is up, so the first run is not slowed by it
        except BaseException as exc:
            tail = self._log_tail()
            self.stop()
            if isinstance(exc, MpstudioError):
                raise MpstudioError(f"{exc}; agent log:\n{tail}") from None
            raise
        return self

    def _read_url(self) -> str:
        lines: queue.Queue = queue.Queue()
        stdout = self._process.stdout

        def read():
            lines.put(stdout.readline())

        threading.Thread(target=read, daemon=True).start()
        try:
            line = lines.get(timeout=self.startup_timeout).decode(errors="replace")
        except queue.Empty:
            raise MpstudioError(f"the local agent did not start within {self.startup_timeout:.0f} s") from None
        match = re.search(r"listening on (http://\S+)", line)
        if not match:
            raise MpstudioError(f"the local agent failed to start (exit code {self._process.poll()})")
        # Keep draining stdout so a chatty child can never block on a full pipe.
        threading.Thread(target=lambda: [None for _ in iter(stdout.readline, b"")], daemon=True).start()
        return match.group(1)

    def _log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            process.terminate()  # uvicorn shuts down and stops its worker
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=5)
        if process is not None and process.stdout is not None:
            process.stdout.close()
        if self._own_dir is not None:
            shutil.rmtree(self._own_dir, ignore_errors=True)
            self._own_dir = None
        atexit.unregister(self.stop)

    def __enter__(self) -> "LocalAgent":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
