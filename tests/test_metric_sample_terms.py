"""A metric given by import path with a `sample_terms` function: its results carry intervals, two plans are compared
sample by sample, a counted metric has a resolution, and terms that do not give the metric are refused before a
study is made (real studies of a small chain model, ORT on CPU)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import onnx
import pytest

from conftest import chain_feeds, make_chain_model
from mpstudio.data import FeedList
from mpstudio.errors import MpstudioError
from mpstudio.metrics import metric_spec
from mpstudio.plan import PrecisionPlan
from mpstudio.study import Study

REPO = Path(__file__).resolve().parent.parent

MODULE = """
    import numpy as np

    def _agree(outputs, reference):
        return [(int(np.sum(np.sign(o["y"]) == np.sign(r["y"]))), int(r["y"].size)) for o, r in zip(outputs, reference)]

    def sign_agreement(outputs, reference):
        rows = np.array(_agree(outputs, reference), float)
        return float(rows[:, 0].sum() / rows[:, 1].sum())

    sign_agreement.sample_terms = _agree
    sign_agreement.metric_name = "sign agreement"
    sign_agreement.higher_is_better = True

    def _errors(outputs, reference):
        return [(float(np.abs(o["y"] - r["y"]).mean()), 1.0) for o, r in zip(outputs, reference)]

    def mean_error(outputs, reference):
        return float(np.mean([e for e, _ in _errors(outputs, reference)]))

    mean_error.sample_terms = _errors
    mean_error.higher_is_better = False

    def wrong(outputs, reference):
        return 0.5

    wrong.sample_terms = lambda outputs, reference: [(1.0, 1.0)] * len(outputs)
    wrong.higher_is_better = True

    def ragged(outputs, reference):
        return 1.0

    ragged.sample_terms = lambda outputs, reference: [1.0] * len(outputs)
    ragged.higher_is_better = True
"""


@pytest.fixture
def site(tmp_path, monkeypatch):
    folder = tmp_path / "site" / "termsmetrics"
    folder.mkdir(parents=True)
    (folder / "__init__.py").write_text("")
    (folder / "scores.py").write_text(textwrap.dedent(MODULE))
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    yield tmp_path / "site"
    for name in [n for n in sys.modules if n.startswith("termsmetrics")]:
        del sys.modules[name]


def _study(tmp_path, spec, samples=12) -> Study:
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "chain.onnx"
    onnx.save(make_chain_model(blocks=4), path)
    return Study.create(tmp_path / "study", path, FeedList(chain_feeds(8)), FeedList(chain_feeds(samples, seed=5)),
                        spec)


def test_a_counted_metric_with_sample_terms_has_an_interval_a_resolution_and_paired_comparisons(tmp_path, site):
    with _study(tmp_path, metric_spec("termsmetrics.scores:sign_agreement")) as study:
        a8 = study.evaluate(PrecisionPlan.a8w8())
        a16 = study.evaluate(PrecisionPlan.a16w8())
        positions = sum(int(f["y"].size) for f in study.float_outputs())
        assert a8.resolution == pytest.approx(1.0 / positions)
        assert a8.low is not None and a8.low <= a8.value <= a8.high
        assert "95 % interval" in a8.describe() and "resolution" in a8.describe()
        terms = study.terms(a8.plan_id, a8.accuracy_source)
        assert terms.units == 12 and terms.value() == pytest.approx(a8.value)
        paired = study.compare(a16.plan_id, a8.plan_id, a8.accuracy_source)
        assert paired.difference == pytest.approx(a16.value - a8.value)
        assert paired.low <= paired.difference <= paired.high


def test_a_mean_of_per_sample_values_is_continuous(tmp_path, site):
    with _study(tmp_path, metric_spec("termsmetrics.scores:mean_error")) as study:
        a8 = study.evaluate(PrecisionPlan.a8w8())
        assert a8.resolution is None and a8.low is not None and a8.low < a8.value < a8.high
        assert not study.higher_is_better


def test_sample_terms_that_do_not_give_the_metric_are_refused_before_a_study_is_made(tmp_path, site):
    with _study(tmp_path, metric_spec("termsmetrics.scores:wrong")) as study:
        with pytest.raises(MpstudioError, match=r"sample_terms does not give the metric: .* is 1, the metric 0\.5"):
            study.float_value()
    with _study(tmp_path / "b", metric_spec("termsmetrics.scores:ragged")) as study:
        with pytest.raises(MpstudioError, match=r"returned shape \(12,\) for 12 samples: it must return one "
                                                r"\(numerator, denominator\) pair"):
            study.float_value()
    model = tmp_path / "chain.onnx"
    FeedList(chain_feeds(4)).save_npz(tmp_path / "data")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(site)])}
    run = subprocess.run([sys.executable, "-m", "mpstudio", "search", str(model), "--data", str(tmp_path / "data"),
                          "--study", str(tmp_path / "cli"), "--metric", "termsmetrics.scores:wrong", "--quiet",
                          "--no-confirm"], capture_output=True, text=True, env=env, timeout=600)
    assert run.returncode == 2 and "sample_terms does not give the metric" in run.stderr, run.stderr
    assert "was not created: fix the metric" in run.stderr and not (tmp_path / "cli" / "study.json").exists()
