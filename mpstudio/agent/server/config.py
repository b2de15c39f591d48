"""How one agent serves: where it listens, its token, the limits on what clients may make it hold, its device."""

from __future__ import annotations

import ipaddress
import platform
from dataclasses import dataclass
from pathlib import Path

from ...errors import MpstudioError
from ...runtime import DEFAULT_HTP_ARCH, validate_provider_options
from ..guards import ConnectionLimits

HTTP_IMPLEMENTATIONS = ("auto", "h11", "httptools")


@dataclass(frozen=True)
class AgentConfig:
    """How one agent serves: where it listens, its token, limits, and the device it speaks for.

    Sizes are in MB (2**20 bytes), times in seconds. `max_inputs_mb` bounds a run's input arrays once
    decompressed and decoded (default: the upload limit); `max_store_mb` bounds the models kept on disk
    (the least recently used are evicted); `max_queued_mb` bounds the request bytes held by runs
    waiting for the device; `max_uploads` bounds uploads in progress at once; the timeouts
    and `max_connections` bound what a slow or idle client can hold (see `guards.ConnectionLimits`).
    """

    host: str = "127.0.0.1"
    port: int = 0
    token: str | None = None
    workdir: Path | None = None
    max_upload_mb: float = 512.0
    run_timeout_s: float = 300.0
    max_queue: int = 64
    max_queued_mb: float = 1024.0
    max_sessions: int = 4
    device_name: str | None = None
    htp_arch: str = DEFAULT_HTP_ARCH
    soc_model: str | None = None
    intra_op_threads: int = 0
    max_inputs_mb: float | None = None
    max_store_mb: float = 10240.0
    max_uploads: int = 2
    max_connections: int = 128
    max_unauthenticated_per_client: int = 16
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
                    "--max-queue": self.max_queue, "--max-queued-mb": self.max_queued_mb,
                    "--max-sessions": self.max_sessions,
                    "--max-inputs-mb": self.inputs_bytes, "--max-store-mb": self.max_store_mb,
                    "--max-uploads": self.max_uploads, "--max-connections": self.max_connections,
                    "--max-unauthenticated-per-client": self.max_unauthenticated_per_client,
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

    @property
    def queued_bytes(self) -> int:
        return int(self.max_queued_mb * 2**20)

    def connection_limits(self) -> ConnectionLimits:
        return ConnectionLimits(header_timeout_s=self.header_timeout_s, body_timeout_s=self.body_timeout_s,
                                request_timeout_s=self.request_timeout_s, max_connections=self.max_connections,
                                max_unauthenticated_per_client=self.max_unauthenticated_per_client)

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
