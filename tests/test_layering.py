"""The core never imports GUI code: importing every core module pulls in no panel, bokeh or param."""

import subprocess
import sys

CORE = ["mpstudio", "mpstudio.model", "mpstudio.graph", "mpstudio.data", "mpstudio.plan", "mpstudio.quantize",
        "mpstudio.runtime", "mpstudio.evaluate", "mpstudio.demos", "mpstudio.cli", "mpstudio.qnn_support",
        "mpstudio.sensitivity", "mpstudio.agent", "mpstudio.latency", "mpstudio.study", "mpstudio.search",
        "mpstudio.export", "mpstudio.layout"]


def test_core_imports_no_gui_modules():
    code = (
        "import importlib, sys\n"
        f"for name in {CORE!r}: importlib.import_module(name)\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('panel', 'bokeh', 'param', 'holoviews'))\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"GUI modules imported by the core: {out.stdout}"
