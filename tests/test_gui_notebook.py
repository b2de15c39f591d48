"""The walkthrough notebook runs headless from top to bottom (nbclient), and its views display inline."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "studio.ipynb"


@pytest.mark.slow
@pytest.mark.timeout(1500)  # the whole walkthrough on the demo: 8 minutes on an idle machine when its cache is cold
def test_walkthrough_notebook_runs(demo_cache):
    pytest.importorskip("rapidocr_onnxruntime", reason="the demo model needs `pip install mpstudio[demo]`")
    import nbformat
    from nbclient import NotebookClient

    notebook = nbformat.read(NOTEBOOK, as_version=4)
    env = {"MPSTUDIO_CACHE_DIR": os.environ.get("MPSTUDIO_TEST_DEMO_CACHE") or demo_cache}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)  # the kernel inherits it: the demo study goes to the test run's cache
    try:
        NotebookClient(notebook, timeout=900, kernel_name="python3",
                       resources={"metadata": {"path": str(NOTEBOOK.parent)}}).execute()
    finally:
        for key, value in old.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    outputs = [out for cell in notebook.cells if cell.cell_type == "code" for out in cell.get("outputs", [])]
    assert not [out for out in outputs if out.get("output_type") == "error"]
    text = "\n".join(out.get("text", "") for out in outputs if out.get("output_type") == "stream")
    assert "done" in text and ".overrides.json" in text
    # Each view cell displays a Panel object inline (its notebook MIME bundle).
    inline = [out for out in outputs if out.get("output_type") in ("display_data", "execute_result")
              and "application/vnd.holoviews_exec.v0+json" in out.get("data", {})]
    assert len(inline) >= 4
