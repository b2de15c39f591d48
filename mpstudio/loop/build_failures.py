"""Plans the HTP cannot build, kept as results: when QNN refuses a plan's QDQ model (an op it rejects at that
precision, a graph it cannot finalize), the failure is stored for the plan and the place it was built, with QNN's
own words, the first failing node where its message names one, and the toolchain that refused it. A known failure
is not built again until the toolchain changes (onnxruntime, onnxruntime-qnn or the target architecture); then it
is tried again, and forgotten when it builds.
"""

from __future__ import annotations

import hashlib
import math
import re
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..errors import MpstudioError
from ..store_builds import BuildRows
from .runners import Target

# What a refused build says: this process's session (`runtime.create_session`) or an agent's (its worker's
# `explain_failure`). Errors of a run (inputs, time-outs, a dead agent) are none of these.
_BUILD_SIGNS = ("could not create a htp session", "cannot run on the htp backend")
# Nodes in QNN's and ORT's words, with their op type, most specific first.
_NODE_PATTERNS = (re.compile(r"\{ name: ([^,}]*?)\s*, type: (\w+)\s*\}"),
                  re.compile(r"failed for node `([^`]+)` of type `(\w+)`"),
                  re.compile(r"Node '([^']+)' OpType:(\w+)"),
                  re.compile(r"node '([^']+)' \((\w+)\)"))
# The Q/DQ pairs around a refused op are refused with it: the op is what failed.
_QDQ = {"QuantizeLinear", "DequantizeLinear"}
# QNN's EP renames the nodes it lays out in NHWC ("<name>_token_7", and "_2" for the op it makes of it).
_LAYOUT_SUFFIX = re.compile(r"_token_\d+(?:_\d+)?$")
DIAGNOSE_TIMEOUT = 120.0  # seconds the verbose rebuild that reads QNN's words may take


@dataclass(frozen=True)
class BuildFailure:
    """One plan a backend could not build: where (`target`, the accuracy source a build there gives, and the
    architecture), what the build raised (`error`), QNN's words (`qnn`, may be empty), the first failing `node`
    (empty when QNN names none), the `toolchain` that refused it and how many builds failed (`attempts`).
    `estimate_ms` is the cost model's latency of the plan (None without one)."""

    plan_id: int
    name: str
    backend: str
    target: str
    htp_arch: str
    error: str
    qnn: str
    node: str
    toolchain: dict
    attempts: int = 1
    estimate_ms: float | None = None

    @property
    def where(self) -> str:
        """The backend and its architecture, e.g. "HTP v75"."""
        return f"{self.backend.upper()} v{self.htp_arch}"

    @property
    def reason(self) -> str:
        """Why, in QNN's words where they were read, else the error, with the first failing node."""
        words = self.qnn or self.error
        return f"{words} (first failing node: {self.node})" if self.node else words

    def describe(self) -> str:
        return f"plan {self.plan_id} {self.name}: cannot build on {self.where}: {self.reason}"

    def to_json(self) -> dict:
        return {"plan_id": self.plan_id, "name": self.name, "backend": self.backend, "target": self.target,
                "htp_arch": self.htp_arch, "error": self.error, "qnn": self.qnn, "node": self.node or None,
                "toolchain": dict(self.toolchain), "attempts": self.attempts, "estimate_ms": self.estimate_ms}


class BuildFailed(MpstudioError):
    """The plan cannot be built on the backend: `failure` says where and why (it is stored in the study)."""

    def __init__(self, failure: BuildFailure, known: bool = False):
        again = ("known from an earlier build with this toolchain; " if known else "")
        super().__init__(f"{failure.describe()} ({again}kept in the study as a result; it is built again only when "
                         "onnxruntime, onnxruntime-qnn or the target architecture changes)")
        self.failure = failure
        self.known = known


def is_build_failure(exc: BaseException) -> bool:
    """Whether `exc` says the backend refused to build the model (not that a run failed or an agent is gone)."""
    return isinstance(exc, MpstudioError) and any(sign in str(exc).lower() for sign in _BUILD_SIGNS)


def first_failing_node(text: str) -> str:
    """The first node QNN's (or ORT's) message names, under its name in the model, passing over the Q/DQ nodes
    refused with it; "" when it names none."""
    for pattern in _NODE_PATTERNS:
        found = [(_LAYOUT_SUFFIX.sub("", name.strip()), op) for name, op in pattern.findall(text) if name.strip()]
        if found:
            return next((name for name, op in found if op not in _QDQ), found[0][0])
    return ""


def toolchain_of(target: Target) -> dict:
    """The software that builds for `target`: onnxruntime and onnxruntime-qnn where it runs (this process, or the
    agent's own), and the target architecture."""
    agent = target.runner.agent
    if agent is None:
        from importlib.metadata import PackageNotFoundError, version

        import onnxruntime

        try:
            qnn = version("onnxruntime-qnn")
        except PackageNotFoundError:
            qnn = "none"
        return {"onnxruntime": onnxruntime.__version__, "onnxruntime_qnn": qnn, "htp_arch": target.htp_arch}
    agents = getattr(agent, "agents", None)
    info = (agents[0] if agents else agent).info()
    return {"onnxruntime": info.onnxruntime, "onnxruntime_qnn": info.onnxruntime_qnn or "none",
            "htp_arch": target.htp_arch}


def qnn_words(path: Path, htp_arch: str, timeout: float = DIAGNOSE_TIMEOUT) -> str:
    """QNN's own words on why `path` does not build here: the model built again in a spawned process with ORT's
    verbose log read (`qnn_probe`); "" when the log names nothing or the rebuild does not answer in time."""
    from ..qnn_probe import Probe, run_probes

    data = Path(path).read_bytes()
    key = hashlib.sha256(data).hexdigest()
    verdict = run_probes([Probe("model", "model", "plan", key, data)], htp_arch, timeout).get(key)
    if verdict is None or verdict.accepted or verdict.reason.startswith(("no answer", "QNN crashed")):
        return ""
    return verdict.reason


class BuildFailures:
    """The failed builds of one study: which are known (for a toolchain), recording new ones, reading them all."""

    def __init__(self, rows: BuildRows):
        self.rows = rows

    def all(self) -> list[BuildFailure]:
        """Every stored failure, oldest first."""
        return [_failure(r) for r in self.rows.frame().itertuples()]

    def known(self, plan_id: int, target: Target, toolchain: dict | None = None) -> BuildFailure | None:
        """The stored failure of `plan_id` on `target` when the same toolchain refused it; None when there is none
        or the toolchain has changed since (the plan is then worth building again)."""
        frame = self.rows.frame()
        rows = frame[(frame["plan_id"] == plan_id) & (frame["target"] == target.source)]
        if rows.empty:
            return None
        found = _failure(next(rows.itertuples()))
        return found if found.toolchain == (toolchain or toolchain_of(target)) else None

    @contextmanager
    def building(self, plan_id: int, name: str, target: Target, model: Callable[[], Path]):
        """Run the body (one evaluation of `plan_id` on `target`); when the backend refuses to build the plan,
        store the failure and raise `BuildFailed`. `model()` gives the plan's QDQ model (and stores its estimate);
        in this process's case QNN's words are read from a verbose rebuild of it. A plan that builds loses a failure an older toolchain recorded."""
        try:
            yield
        except MpstudioError as exc:
            if target.backend != "htp" or not is_build_failure(exc):
                raise
            raise BuildFailed(self._record(plan_id, name, target, str(exc), model)) from exc
        if target.backend == "htp":
            self.rows.forget(plan_id, target.source)

    def _record(self, plan_id: int, name: str, target: Target, error: str, model: Callable[[], Path]) -> BuildFailure:
        words = ""
        try:
            path = model()
            if target.runner.agent is None and not target.fallback:
                words = qnn_words(path, target.htp_arch)
        except (MpstudioError, OSError):
            words = ""  # the error alone is kept
        node = first_failing_node(words) or first_failing_node(error)
        toolchain = toolchain_of(target)
        attempts = self.rows.record(plan_id, "htp", target.source, target.htp_arch, error, words, node, toolchain)
        return BuildFailure(plan_id, name, "htp", target.source, target.htp_arch, error, words, node, toolchain,
                            attempts)


def _failure(row) -> BuildFailure:
    estimate = float(row.estimate_ms)
    return BuildFailure(int(row.plan_id), str(row.name), str(row.backend), str(row.target), str(row.htp_arch),
                        str(row.error), str(row.qnn), str(row.node), dict(row.toolchain), int(row.attempts),
                        estimate if math.isfinite(estimate) else None)


__all__ = ["BuildFailure", "BuildFailed", "BuildFailures", "is_build_failure", "first_failing_node", "toolchain_of",
           "qnn_words"]
