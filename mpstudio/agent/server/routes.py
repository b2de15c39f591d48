"""The agent's HTTP routes: health, info, models by sha256, runs (JSON and binary) and context binaries."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Annotated

import numpy as np
from fastapi import APIRouter, Depends, Request
from fastapi import Path as PathParam
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, Response
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.convertors import Convertor, register_url_convertor

from ..protocol import API_PREFIX, RESULT_MEMBER, RUN_MEMBER, AgentError, b64decode, b64encode
from .codec import encoded
from .replies import AgentInfo, RunResult, RunSummary
from .state import AgentState
from .wire import Context, ContextRequest, Health, ModelStatus, RunRequest, RunSpec, Upload, error_responses

ModelId = Annotated[str, PathParam(pattern=r"^[0-9a-f]{64}$", description="sha256 hex digest of the model")]
RunId = Annotated[str, PathParam(pattern=r"^[0-9a-f]{32}$", description="uuid4 hex of a run")]
_BINARY_BODY = {"requestBody": {"content": {"application/octet-stream": {"schema": {"type": "string",
                                                                                     "format": "binary"}}},
                                "required": True}}
_RUN_ERRORS = error_responses(404, 411, 413, 422, 500, 502, 504)


class _RunIdConvertor(Convertor):
    """Run ids only: `/v1/runs/npz` is then no run id, and a GET there is 405 as the schema says."""

    regex = "[0-9a-f]{32}"

    def convert(self, value: str) -> str:
        return value

    def to_string(self, value: str) -> str:
        return value


register_url_convertor("mpstudio_run_id", _RunIdConvertor())


def _state(request: Request) -> AgentState:
    return request.app.state.agent


Agent = Annotated[AgentState, Depends(_state)]
# Refusals any route can give: credentials in the URL, a wrong token, a busy agent or too many connections.
router = APIRouter(responses=error_responses(400, 401, 408, 431, 503))


@router.get("/health", summary="Liveness, worker and queue", response_model=Health)
async def health(state: Agent):
    return state.health()


@router.get(f"{API_PREFIX}/info", summary="Platform, versions, backends and what the HTP really is",
            response_model=AgentInfo)
async def info(state: Agent):
    if state.worker.ready_info is None:  # waiting for the lock would otherwise queue behind a run
        await run_in_threadpool(state.worker.wait_ready)
    return asdict(state.info())


@router.get(f"{API_PREFIX}/models/{{model_id}}", summary="Whether the agent has a model",
            response_model=ModelStatus, responses=error_responses(404, 422))
async def model_status(model_id: ModelId, state: Agent):
    path = state.store.existing(model_id)
    return {"model_id": model_id, "size_bytes": path.stat().st_size}


@router.get(f"{API_PREFIX}/models/{{model_id}}/content", summary="Download a model (e.g. a context binary)",
            response_class=FileResponse, responses={200: {"content": {"application/octet-stream": {}}},
                                                    **error_responses(404, 422)})
async def model_content(model_id: ModelId, state: Agent):
    path = state.store.existing(model_id)
    return FileResponse(path, media_type="application/octet-stream", filename=f"{model_id}.onnx")


@router.put(f"{API_PREFIX}/models/{{model_id}}", status_code=201,
            summary="Upload a model; the body is the file, the id its sha256 (verified)",
            openapi_extra=_BINARY_BODY, response_model=Upload, response_model_exclude_none=True,
            responses={200: {"model": Upload, "description": "the agent already has the model"},
                       **error_responses(411, 413, 422, 507)})
async def upload_model(model_id: ModelId, request: Request, state: Agent):
    if state.store.has(model_id):
        return JSONResponse({"model_id": model_id, "stored": False}, status_code=200)
    length = request.headers.get("content-length")
    if length is not None and length.isdigit():
        state.store.check_fits(int(length))  # before a byte of a model that could never be kept
    size = await state.receive_model(model_id, request.stream())
    return {"model_id": model_id, "stored": True, "size_bytes": size}


@router.post(f"{API_PREFIX}/runs", summary="Run a model and return outputs, latency, placement, profile",
             response_model=RunResult, responses=_RUN_ERRORS)
async def run(body: RunRequest, state: Agent):
    state.store.existing(body.model_id)  # an unknown model is a 404 whatever the inputs
    reply, outputs = await state.run(body, b64decode(body.inputs_npz, "inputs_npz"))
    if outputs is not None:
        reply = {**reply, "outputs_npz": b64encode(await encoded(outputs))}
    return JSONResponse(jsonable_encoder(reply))


@router.post(
    f"{API_PREFIX}/runs/npz",
    summary="The same run in binary: one .npz each way, no base64 (what AgentClient uses)",
    description=(
        "The request body is an .npz of the inputs plus a uint8 member `__run__` holding the JSON of a "
        "RunRequest without `inputs_npz`. The response is an .npz of the outputs plus a uint8 member "
        "`__result__` holding the JSON result (a RunSummary). Pickled members are refused."
    ),
    openapi_extra=_BINARY_BODY,
    response_class=Response,
    responses={200: {"content": {"application/octet-stream": {}}}, **_RUN_ERRORS},
)
async def run_npz(request: Request, state: Agent):
    data = await request.body()
    await state.check_inputs(data)
    spec = (await state.decode_inputs(data, members=lambda name: name == RUN_MEMBER)).get(RUN_MEMBER)
    if spec is None or spec.dtype != np.uint8:
        raise AgentError(f"the .npz has no uint8 {RUN_MEMBER!r} member with the run's JSON")
    try:
        body = RunSpec.model_validate_json(spec.tobytes())
    except ValidationError as exc:
        raise RequestValidationError([{**e, "loc": ("body", *e["loc"])} for e in exc.errors()]) from None
    reply, outputs = await state.run(body, data, members=lambda name: name != RUN_MEMBER)
    arrays = dict(outputs or {})
    arrays[RESULT_MEMBER] = np.frombuffer(json.dumps(jsonable_encoder(reply)).encode(), dtype=np.uint8)
    return Response(await encoded(arrays), media_type="application/octet-stream")


@router.get(f"{API_PREFIX}/runs/{{run_id:mpstudio_run_id}}", summary="A past run's result (without outputs)",
            response_model=RunSummary, response_model_exclude_unset=True,
            responses=error_responses(404, 422))
async def run_status(run_id: RunId, state: Agent):
    if run_id not in state.runs:
        raise AgentError(f"run {run_id} is unknown to this agent (it keeps the last 256)", 404)
    return state.runs[run_id]


@router.post(f"{API_PREFIX}/contexts", status_code=201,
             summary="Build an EPContext model (QNN context binary) for a model and options",
             response_model=Context, responses=error_responses(404, 411, 413, 422, 500, 502, 504, 507))
async def build_context(body: ContextRequest, state: Agent):
    return await state.build_context(body)
