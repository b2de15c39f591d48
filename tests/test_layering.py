"""The package's layering, computed from its source tree (docs/architecture.md says why each rule holds):
no import cycles among mpstudio modules, the core never imports GUI code, the agent needs only errors and
runtime, and the readers of QDQ models (latency, export) do not reach into the sensitivity engine."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "mpstudio"
GUI = ("panel", "bokeh", "param", "holoviews")


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _imports(name: str, path: Path, known: set[str]) -> tuple[set[str], set[str]]:
    """(mpstudio modules, other top-level packages) that `path` imports anywhere, lazy imports included."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    inside, outside = set(), set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                (inside if alias.name.split(".")[0] == "mpstudio" else outside).add(
                    alias.name if alias.name.split(".")[0] == "mpstudio" else alias.name.split(".")[0])
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "mpstudio":
                outside.add(target.split(".")[0])
                continue
            for alias in node.names:  # `from . import qdq` names a module; `from .qdq import read` a name in one
                sub = f"{target}.{alias.name}"
                inside.add(sub if sub in known else target)
    return {m for m in inside if m in known and m != name}, outside


@pytest.fixture(scope="module")
def graph():
    modules = _modules()
    known = set(modules)
    return {name: _imports(name, path, known) for name, path in modules.items()}


def _reach(graph, start: str) -> set[str]:
    seen, stack = set(), [start]
    while stack:
        for nxt in graph[stack.pop()][0]:
            if nxt not in seen:
                seen.add(nxt)
                stack.append(nxt)
    return seen


def _cycles(graph) -> list[list[str]]:
    """Every strongly connected component of more than one module (Tarjan)."""
    index, low, on_stack, stack, out, counter = {}, {}, set(), [], [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph[v][0]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_tree_is_read(graph):
    # A reader that found nothing would pass every rule below.
    assert {"mpstudio.qdq", "mpstudio.study", "mpstudio.sensitivity.isolation", "mpstudio.widgets.state"} <= set(graph)
    assert "mpstudio.qdq" in graph["mpstudio.export"][0]
    assert "panel" in graph["mpstudio.widgets.state"][1]


def test_no_import_cycles(graph):
    assert _cycles(graph) == []


def test_cycle_detection_sees_a_cycle():
    fake = {"a": ({"b"}, set()), "b": ({"c"}, set()), "c": ({"a"}, set()), "d": ({"a"}, set())}
    assert _cycles(fake) == [["a", "b", "c"]]


def test_core_never_imports_gui_code(graph):
    core = [m for m in graph if not m.startswith("mpstudio.widgets")]
    offenders = {m: sorted(graph[m][1] & set(GUI)) for m in core if graph[m][1] & set(GUI)}
    assert offenders == {}
    assert not any(m.startswith("mpstudio.widgets") for c in core for m in _reach(graph, c))


def test_core_imports_no_gui_modules_at_run_time(graph):
    core = sorted(m for m in graph if not m.startswith("mpstudio.widgets") and m != "mpstudio.__main__"
                  and not m.endswith(".__main__"))
    code = (
        "import importlib, sys\n"
        f"for name in {core!r}: importlib.import_module(name)\n"
        f"bad = sorted(m for m in sys.modules if m.split('.')[0] in {GUI!r})\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"GUI modules imported by the core: {out.stdout}"


def test_latency_and_export_do_not_reach_the_sensitivity_engine(graph):
    for module in ("mpstudio.latency", "mpstudio.export", "mpstudio.qdq"):
        reached = {m for m in _reach(graph, module) if m.startswith("mpstudio.sensitivity")}
        assert reached == set(), f"{module} reaches {sorted(reached)}"


def test_the_agent_needs_only_errors_and_runtime(graph):
    # htp_accumulator and htp_requantize are part of runtime's fake-quant numerics (onnx and numpy only), kept apart
    # for runtime's size
    allowed = {"mpstudio", "mpstudio.errors", "mpstudio.runtime", "mpstudio.htp_accumulator", "mpstudio.htp_requantize",
               "mpstudio.sources"}
    for module in (m for m in graph if m.startswith("mpstudio.agent")):
        outside_agent = {m for m in _reach(graph, module) if not m.startswith("mpstudio.agent")}
        assert outside_agent <= allowed, f"{module} reaches {sorted(outside_agent - allowed)}"


def test_the_store_knows_nothing_of_models_or_runs(graph):
    reached = _reach(graph, "mpstudio.store")
    above = ("mpstudio.quantize", "mpstudio.loop", "mpstudio.study", "mpstudio.search", "mpstudio.sensitivity",
             "mpstudio.agent")
    assert not {m for m in reached if m.startswith(above)}


def test_the_loop_is_built_from_collaborators(graph):
    # One plan's evaluation, prediction, the front and the job queue take their parts explicitly: nothing in
    # the loop reaches the study face that wires them, nor the search, the command line or the GUI above it.
    above = ("mpstudio.study", "mpstudio.search", "mpstudio.preview", "mpstudio.cli", "mpstudio.widgets")
    for module in (m for m in graph if m.startswith("mpstudio.loop")):
        reached = {m for m in _reach(graph, module) if m.startswith(above)}
        assert reached == set(), f"{module} reaches {sorted(reached)}"


def test_the_front_is_plain_functions_over_frames(graph):
    assert _reach(graph, "mpstudio.loop.front") == set()


def _imports_outside_type_checking(path: Path, target: str) -> list[int]:
    """Lines of `path` that import `target` outside an `if TYPE_CHECKING:` block."""
    tree = ast.parse(path.read_text(), str(path))
    guarded = {id(n) for block in ast.walk(tree) if isinstance(block, ast.If)
               and getattr(block.test, "id", getattr(block.test, "attr", None)) == "TYPE_CHECKING"
               for n in ast.walk(block)}
    found = []
    for node in ast.walk(tree):
        if id(node) in guarded:
            continue
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[-1] == target.split(".")[-1]:
            found.append(node.lineno)
        elif isinstance(node, ast.Import) and any(a.name == target for a in node.names):
            found.append(node.lineno)
    return found


def test_the_search_names_the_study_face_only_in_annotations():
    # The search drives a study it is given; the front, the mask and the evaluations it reads come from the
    # loop and the store, so it never loads the face for them.
    offenders = {str(p.relative_to(PACKAGE.parent)): lines for p in sorted((PACKAGE / "search").glob("*.py"))
                 if (lines := _imports_outside_type_checking(p, "mpstudio.study"))}
    assert offenders == {}


def test_the_type_checking_reader_sees_a_plain_import(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text("from typing import TYPE_CHECKING\nfrom ..study import Study\nif TYPE_CHECKING:\n"
                      "    from ..study import Other\n")
    assert _imports_outside_type_checking(sample, "mpstudio.study") == [2]


def test_every_module_is_placed_in_the_architecture_doc():
    text = (PACKAGE.parent / "docs" / "architecture.md").read_text()
    missing = [name for name in _modules() if f"`{name.removeprefix('mpstudio.')}`" not in text
               and name != "mpstudio"]
    assert missing == []
