"""Room sizes, computed from the source tree: no module of mpstudio over 600 lines, no class over 350, no
function over 70 (docs/architecture.md says why). A definition may be longer only when its docstring says why,
in a sentence that starts with "Long because"."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "mpstudio"
LIMITS = {"module": 600, "class": 350, "function": 70}
EXCUSE = "Long because"


def _sizes(path: Path):
    """(kind, qualified name, lines, excused) for the module and every class and function in it."""
    text = path.read_text()
    tree = ast.parse(text, str(path))
    name = str(path.relative_to(PACKAGE.parent))
    yield "module", name, text.count("\n"), EXCUSE in (ast.get_docstring(tree) or "")

    def visit(node, prefix):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                kind = "class" if isinstance(child, ast.ClassDef) else "function"
                qualified = f"{prefix}{child.name}"
                yield (kind, f"{name}:{qualified}", child.end_lineno - child.lineno + 1,
                       EXCUSE in (ast.get_docstring(child) or ""))
                yield from visit(child, qualified + ".")
            else:
                yield from visit(child, prefix)

    yield from visit(tree, "")


def _over():
    return [(kind, name, lines) for path in sorted(PACKAGE.rglob("*.py")) for kind, name, lines, excused in _sizes(path)
            if lines > LIMITS[kind] and not excused]


def test_the_sizes_are_read():
    found = {(kind, name) for path in [PACKAGE / "plan.py"] for kind, name, _, _ in _sizes(path)}
    assert ("class", "mpstudio/plan.py:PrecisionPlan") in found
    assert ("module", "mpstudio/plan.py") in found


def test_no_room_over_its_limit():
    over = _over()
    assert over == [], "\n".join(f"{kind} {name}: {lines} lines (limit {LIMITS[kind]})" for kind, name, lines in over)
