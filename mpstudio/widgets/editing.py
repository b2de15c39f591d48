"""Editing the current plan from the studio: the selected activation tensors promoted to 16 bits or demoted,
tensors found by name, and the current plan exported."""

from __future__ import annotations

from fnmatch import fnmatchcase

import pandas as pd

from ..plan import PrecisionPlan
from .constants import writable


def edit_plan(state, tensors, to: str) -> PrecisionPlan:
    """The current plan of `state` with the quantizable `tensors` at `to` ("uint16" or "uint8"), made current
    (and, with `state.evaluate_on_edit`, previewed and evaluated)."""
    study = state.require_study()
    if not tensors:
        state.show_error("select tensors first (box-select in the graph, or rows in the table)")
        return state.plan
    graph = study.graph
    chosen = [t for t in tensors if graph.tensors[t].quantizable]
    base = state.plan
    default = base.activation_type
    if to == default:
        plan = base.without(chosen)
    else:
        plan = base.with_overrides({t: to for t in chosen}, name="")
    plan.validate(graph, study.htp_arch)
    if state.evaluate_on_edit and plan.hash != base.hash:
        state.preview_plan(plan)
    verb = "promoted" if to == "uint16" else "demoted"

    def show():
        state.set_plan(plan)
        with writable(state):
            state.param.update(message=f"{verb} {len(chosen)} tensor(s); plan {plan.summary()}", error="")
    # Served, the predicted point goes to the browser with this event's reply, and the graph's and table's
    # larger update in the next one (at once here otherwise).
    state.post(show)
    return plan


PATTERN_CHARACTERS = "*?["


def is_pattern(text: str) -> bool:
    """Whether a Find text asks for a pattern (shell-style: *, ?, [...]) rather than a whole name."""
    return any(c in text for c in PATTERN_CHARACTERS)


def matching_tensors(frame: pd.DataFrame, text: str) -> list[str]:
    """Tensors of `frame` (StudioState.tensors) whose name, or whose producer's name, is `text` (lower-case):
    the whole name ("p2o.Add.27" is not "p2o.Add.270"), or, when `text` is a pattern, every name it matches."""
    tensors, nodes = frame["tensor"].str.lower(), frame["node"].str.lower()
    if is_pattern(text):
        hit = tensors.map(lambda name: fnmatchcase(name, text)) | nodes.map(lambda name: fnmatchcase(name, text))
    else:
        hit = (tensors == text) | (nodes == text)
    return frame[hit.astype(bool)]["tensor"].tolist()


def find_message(text: str, hits: list[str]) -> str:
    """What a Find of `text` says: how many tensors match, or how to look for part of a name."""
    if hits:
        return f"{len(hits)} tensor(s) match {text!r}"
    if is_pattern(text):
        return f"nothing matches {text!r}"
    return f"no tensor or node is called {text!r}; for part of a name, use a pattern such as *{text}*"


def find_tensors(state, text: str) -> list[str]:
    """StudioState.find: select the tensors a Find of `text` matches, scroll to the first, say how many."""
    text = text.strip().lower()
    if not text or state.tensors.empty:
        return []
    hits = matching_tensors(state.tensors, text)
    state.select(hits)
    with writable(state):
        state.param.update(focus=hits[0] if hits else "", message=find_message(text, hits))
    return hits


def export_current(state, formats: tuple[str, ...], out_dir=None):
    """StudioState.export: the current plan written in `formats`, in a folder confined to the server's roots (the
    study's exports/ folder by default)."""
    from ..export import export_plan

    study = state.require_study()
    out_dir = state.policy.confine(out_dir, "export folder") if out_dir else study.folder / "exports"
    return export_plan(study.quantizer, state.plan, out_dir, formats)
