"""A study used from Python as the README shows: a metric given by name, plans named as the command line names
them, and metric values written with the digits that tell plans apart (an output cosine near 1)."""

from __future__ import annotations

import onnx
import pytest

from conftest import chain_feeds, make_chain_model
from mpstudio.data import FeedList
from mpstudio.errors import MpstudioError
from mpstudio.plan import PrecisionPlan
from mpstudio.study import Study
from mpstudio.value_text import value_text


@pytest.fixture
def chain_path(tmp_path):
    path = tmp_path / "chain.onnx"
    onnx.save(make_chain_model(), path)
    return path


@pytest.fixture
def cosine_study(tmp_path, chain_path):
    study = Study.create(tmp_path / "study", chain_path, FeedList(chain_feeds(6)), metric="cosine")
    yield study
    study.close()


def test_a_metric_is_given_by_its_name(cosine_study, tmp_path):
    assert cosine_study.metric_name == "output cosine" and cosine_study.higher_is_better
    cosine_study.close()
    assert Study.open(tmp_path / "study").metric_spec.name == "output cosine"  # stored, not only for this process


def test_a_metric_that_cannot_be_had_is_refused_before_anything_is_written(tmp_path, chain_path):
    with pytest.raises(MpstudioError, match="unknown metric 'cosin'.*cosine"):
        Study.create(tmp_path / "typo", chain_path, FeedList(chain_feeds(2)), metric="cosin")
    with pytest.raises(MpstudioError, match="metric= takes a metric's name"):
        Study.create(tmp_path / "function", chain_path, FeedList(chain_feeds(2)), metric=lambda outputs: 1.0)
    assert not (tmp_path / "typo").exists() and not (tmp_path / "function").exists()


def test_plans_are_named_as_the_command_line_names_them(cosine_study):
    a8 = cosine_study.evaluate("a8w8")
    assert a8.name == "a8w8" and a8.plan_hash == PrecisionPlan.a8w8().hash
    assert cosine_study.evaluate(a8.plan_id).cached
    a16 = cosine_study.evaluate(PrecisionPlan.a16w8())
    paired = cosine_study.compare("a16w8", "a8w8")
    assert paired.plan == "a16w8" and paired.versus == "a8w8"
    assert paired.difference == pytest.approx(a16.value - a8.value)
    with pytest.raises(MpstudioError, match="unknown plan 'a8w8-pcx'.*1 \\(a8w8\\)"):
        cosine_study.compare("a16w8", "a8w8-pcx")
    with pytest.raises(MpstudioError, match="'a16w8-pc' has no result in this study yet; evaluate it first"):
        cosine_study.compare("a16w8-pc", "a8w8")


def test_values_near_one_keep_the_digits_that_tell_them_apart(cosine_study):
    assert value_text(0.9999139646876208) == "0.9999140"
    assert value_text(0.9999986364723465) == "0.99999864"
    assert value_text(-3.715e-05, sign=True) == "-0.0000372"
    assert value_text(0.0129) == "0.0129" and value_text(37.65931) == "37.6593" and value_text(1.0) == "1.0000"
    assert value_text(12.00004) == "12.0000"  # an SNR in dB is not near a bound
    a8, a16 = cosine_study.evaluate("a8w8"), cosine_study.evaluate("a16w8")
    assert value_text(a8.value) != value_text(a16.value)
    summary = cosine_study.summary()
    assert f" {value_text(a8.value)} " in summary and f" {value_text(a16.value)} " in summary
    assert f"output cosine {value_text(a8.value)} (95 % interval {value_text(a8.low)}-" in a8.describe()
    paired = cosine_study.compare("a16w8", "a8w8").describe()
    assert paired.startswith(f"output cosine {value_text(a16.value - a8.value, sign=True)} [")


def test_creating_and_analysing_say_how_far_they_are_unless_quiet(tmp_path, chain_path, capsys):
    study = Study.create(tmp_path / "told", chain_path, FeedList(chain_feeds(6)), metric="cosine")
    created = capsys.readouterr().err
    study.sensitivity(samples=4, isolation_samples=4, workers=1)
    analysed = capsys.readouterr().err
    study.close()
    assert created.startswith("mpstudio: ") and "scoring tensors" in analysed and "isolating up to" in analysed
    quiet = Study.create(tmp_path / "quiet", chain_path, FeedList(chain_feeds(6)), metric="cosine", quiet=True)
    quiet.sensitivity(samples=4, isolation_samples=4, workers=1, quiet=True)
    quiet.close()
    assert capsys.readouterr().err == ""
