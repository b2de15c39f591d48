"""The agent's wire models: request and response bodies, and what each error status means (OpenAPI)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

MAX_ITERATIONS = 100_000
MAX_WARMUP = 1_000
SHA256_PATTERN = r"^[0-9a-f]{64}$"


class RunSpec(BaseModel):
    """One run: which model, where, how many times, and what to send back (the inputs travel beside it)."""

    model_config = ConfigDict(extra="forbid")

    model_id: str = Field(pattern=SHA256_PATTERN, description="sha256 of an uploaded model")
    backend: Literal["htp", "cpu"] = Field("htp", description="htp (QNN EP) or cpu (ORT's QDQ reference)")
    provider_options: dict[str, str | int | bool] = Field(default_factory=dict,
                                                           description="QNN EP options (whitelisted)")
    warmup: int = Field(0, ge=0, le=MAX_WARMUP)
    iterations: int = Field(1, ge=1, le=MAX_ITERATIONS)
    return_outputs: bool = True
    return_placement: bool = False
    return_profile: bool = False
    profile_runs: int = Field(5, ge=1, le=50)
    allow_cpu_fallback: bool = Field(False, description="let nodes QNN refuses run on ORT's CPU EP")


class RunRequest(RunSpec):
    """The JSON form of a run: the spec and its inputs in one body."""

    inputs_npz: str = Field(min_length=1, description="base64 of an .npz of the model inputs (no pickled arrays)")


class ContextRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model_id: str = Field(pattern=SHA256_PATTERN, description="sha256 of an uploaded model")
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
    408: "the request's head or body did not arrive within the agent's deadline",
    411: "a body without Content-Length (chunked)",
    413: "the body, the inputs once decompressed, or the model is over the agent's limits",
    431: "the request's headers are over the agent's limit (64 KB)",
    422: "a bad request: ids, options, inputs, .npz, model, unsupported op, dynamic shape",
    500: "an internal fault of the worker",
    502: "the worker died during the request (it was replaced)",
    503: "the agent is busy (queue full, too many uploads or connections, worker starting): retry later",
    504: "the run exceeded the agent's run timeout (its worker was replaced)",
    507: "the models in use fill the agent's model store",
}


def error_responses(*codes: int) -> dict:
    """OpenAPI entries for error responses: each has an ErrorBody."""
    return {code: {"model": ErrorBody, "description": _ERROR_MEANINGS[code]} for code in codes}
