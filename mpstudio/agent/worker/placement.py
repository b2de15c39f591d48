"""Where a model's nodes run on the device, and why QNN refused a model, from ORT's verbose session log."""

from __future__ import annotations

import os
import sys
import uuid
from contextlib import contextmanager
from pathlib import Path

from ... import runtime
from ...errors import MpstudioError
from ..protocol import AgentError, NodeFallback, Placement
from .model_file import dynamic_shape_hint, model_nodes
from .ort_log import parse_placement, parse_refusals


class PlacementReader:
    """Placements per session key (kept: each costs a verbose session), and explained session failures."""

    def __init__(self, workdir: Path):
        self.workdir = workdir
        self._placements: dict[tuple, Placement] = {}

    def placement(self, key: tuple, request: dict) -> Placement:
        if request["backend"] == "cpu":
            nodes = model_nodes(request["model_path"])
            return Placement("cpu", (), tuple(NodeFallback(n, t, "cpu backend") for n, t in nodes), 0)
        if key not in self._placements:
            log_text, error = self._verbose_session(request)
            if error is not None:
                raise error
            self._placements[key] = parse_placement(log_text, model_nodes(request["model_path"]))
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

    def explain_failure(self, request: dict, error: MpstudioError) -> MpstudioError:
        """Replace ORT's generic message with the nodes QNN refused and QNN's reasons, from the verbose log."""
        if request["backend"] != "htp":
            return error
        text, _ = self._verbose_session(request)
        refused = parse_refusals(text)
        if not refused:
            return error
        shown = [f"node {f.node!r} ({f.op_type}): {f.reason.rstrip('.')}" for f in refused[:12]]
        more = f"; and {len(refused) - 12} more" if len(refused) > 12 else ""
        hint = dynamic_shape_hint(request["model_path"])
        if not request.get("allow_cpu_fallback"):
            hint += " Nodes QNN cannot take are errors because CPU fallback is off for htp runs."
        return AgentError(
            f"the model cannot run on the HTP backend; QNN refused {len(refused)} node(s): "
            + "; ".join(shown) + more + "." + hint,
            422,
        )


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
