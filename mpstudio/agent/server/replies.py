"""The agent's success bodies as OpenAPI models: a run's result, a past run, and what the agent runs on."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field


class RunLatency(BaseModel):
    """Milliseconds over `n` timed iterations; `source` "emulator" is host time of the HTP emulator."""

    min_ms: float
    median_ms: float
    p90_ms: float
    mean_ms: float
    std_ms: float
    n: int
    source: Literal["measured", "emulator"]
    device: str
    backend: Literal["htp", "cpu"]


class NodeFallback(BaseModel):
    node: str
    op_type: str
    reason: str


class RunPlacement(BaseModel):
    backend: Literal["htp", "cpu"]
    on_htp: list[str]
    on_cpu: list[NodeFallback]
    htp_partitions: int


class OpCost(BaseModel):
    op: str
    node: str
    op_type: str
    onnx_nodes: list[str]
    cost: float = Field(description="mean per timed run, in `unit`")
    unit: str


class RunProfile(BaseModel):
    ops: list[OpCost]
    unit: str = Field(description="cycles for QNN ops, us for ORT CPU kernels")
    source: Literal["measured", "emulator"]
    device: str
    backend: Literal["htp", "cpu"]
    runs: int


class RunSummary(BaseModel):
    """A run as the agent keeps it (`GET /v1/runs/{run_id}`): everything but the outputs."""

    run_id: str
    model_id: str
    backend: Literal["htp", "cpu"]
    provider_options: dict[str, str]
    device: str
    emulated: bool = Field(description="true when the HTP is the x86_64 emulator: timings are host time")
    session_reused: bool
    session_retried: bool
    session_create_ms: float
    latency: RunLatency
    placement: RunPlacement | None = Field(None, description="present when return_placement was set")
    profile: RunProfile | None = Field(None, description="present when return_profile was set")
    worker_ms: float


class RunResult(RunSummary):
    """The answer of `POST /v1/runs`."""

    outputs_npz: str | None = Field(None, description="base64 of an .npz of the outputs; present when "
                                                       "return_outputs was set")


class AgentInfo(BaseModel):
    """What the agent runs on; `htp_kind` is "npu", "emulator", or null without a usable HTP backend."""

    device: str
    os: str
    os_release: str
    arch: str
    python: str
    onnxruntime: str
    onnxruntime_qnn: str | None
    backends: list[Literal["htp", "cpu"]]
    htp_kind: Literal["npu", "emulator"] | None
    htp_arch: str
    soc_model: str | None
    agent_version: str
    worker_pid: int | None
    max_upload_mb: float
    run_timeout_s: float
    htp_error: str | None
