"""The block totals say when a model's node names are flat (most tensors outside any namespace), so that a table of
one "(root)" block and single-node blocks is not read as a model's structure."""

from __future__ import annotations

import pandas as pd

from mpstudio.loop.blocks import ROOT
from mpstudio.widgets.blocks_view import flat_note


def test_most_tensors_at_the_root_is_said():
    flat = pd.DataFrame({"block": [ROOT, "p2o.MatMul.6", "p2o.MatMul.8"], "tensors": [396, 1, 1]})
    assert "396 of 398 tensors are outside any namespace" in flat_note(flat)


def test_a_namespaced_model_gets_no_note():
    layered = pd.DataFrame({"block": [ROOT, "m/encoder/layer.0", "m/encoder/layer.1"], "tensors": [24, 90, 90]})
    assert flat_note(layered) == "" and flat_note(layered.iloc[0:0]) == ""
