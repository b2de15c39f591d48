"""The promotion order by what a promotion surely removes (`search.order.promotion_order`), on a real model and its
real analysis. Two branches: `a` (an Add) is rounded on every sample; `b` (x times 30, so a coarse 8-bit grid) is
multiplied by a gate input that is open on one sample in eight, so its rounding reaches the outputs on one
isolation sample only. Promoting `b` removes far more noise on average than promoting `a`, but all of it on that
one sample: a paired bootstrap over the samples cannot rule out that it removes nothing, while `a`'s smaller
removal is solid. The per-sample noise terms behind it travel with the saved report."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from conftest import IR
from mpstudio.data import FeedList
from mpstudio.latency import promotion_costs
from mpstudio.loop.uncertainty import lower_bounds
from mpstudio.noise import noise_power, removed_noise
from mpstudio.plan import PrecisionPlan
from mpstudio.search import promotion_order
from mpstudio.sensitivity import SensitivityReport
from mpstudio.study import Study

WIDTH = 256
SAMPLES = 8  # isolation samples: the gate is open on the first only
GATE_EVERY = 8


def _gated() -> onnx.ModelProto:
    """ya = (x + c) * 2 and yb = (x * 30) * gate."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.normal(0, 0.1, WIDTH).astype(np.float32), "c"),
             numpy_helper.from_array(np.full(WIDTH, 2.0, np.float32), "two"),
             numpy_helper.from_array(np.full(WIDTH, 30.0, np.float32), "thirty")]
    nodes = [helper.make_node("Add", ["x", "c"], ["a"], name="/a/Add"),
             helper.make_node("Mul", ["a", "two"], ["ya"], name="/a/Mul"),
             helper.make_node("Mul", ["x", "thirty"], ["b"], name="/b/Mul"),
             helper.make_node("Mul", ["b", "gate"], ["yb"], name="/b/Gate")]
    graph = helper.make_graph(
        nodes, "gated",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, WIDTH]),
         helper.make_tensor_value_info("gate", TensorProto.FLOAT, [1, WIDTH])],
        [helper.make_tensor_value_info("ya", TensorProto.FLOAT, [1, WIDTH]),
         helper.make_tensor_value_info("yb", TensorProto.FLOAT, [1, WIDTH])],
        initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=IR)


def _feeds(count: int, seed: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [{"x": rng.normal(size=(1, WIDTH)).astype(np.float32),
             "gate": np.full((1, WIDTH), float(i % GATE_EVERY == 0), np.float32)} for i in range(count)]


@pytest.fixture(scope="module")
def gated(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gated")
    onnx.save(_gated(), folder / "gated.onnx")
    with Study.create(folder / "study", folder / "gated.onnx", FeedList(_feeds(16, 0)),
                      FeedList(_feeds(16, 1))) as study:
        yield study, study.sensitivity(samples=16, isolation_samples=SAMPLES)


def _per_ms(study, report, tensors):
    costs = promotion_costs(study.quantizer.generate(PrecisionPlan.a8w8()), tensors, study.htp_arch,
                            graph=study.graph)
    iso = report.isolation
    removed = removed_noise(iso.all_8, iso.per_tensor()["promoted"].astype(float))
    per_sample = iso.side_terms("all_8").loc[""].to_numpy() - iso.side_terms("promoted").loc[tensors].to_numpy()
    surely = dict(zip(tensors, lower_bounds(per_sample.T)))
    return ({t: removed[t] / costs[t] for t in tensors}, {t: surely[t] / costs[t] for t in tensors}, per_sample)


def test_a_solid_removal_comes_before_a_larger_one_within_the_samples_noise(gated):
    study, report = gated
    mean, surely, per_sample = _per_ms(study, report, ["a", "b"])
    # The premise: by the mean, b removes more per ms than a; all of b's removal is on the one open-gate sample,
    # and a's is on every sample.
    assert mean["b"] > mean["a"] > 0
    assert per_sample[1, 0] > 0 and np.all(np.abs(per_sample[1, 1:]) <= 1e-3 * per_sample[1, 0])
    assert np.all(per_sample[0] > 0)
    assert surely["a"] > 0 >= surely["b"]
    order, predicted = promotion_order(study, report, PrecisionPlan.a8w8())
    assert order.index("a") < order.index("b")
    assert len(predicted) == len(report.isolation.per_tensor())


def test_the_terms_sum_to_each_noise_power_and_survive_a_round_trip(gated, tmp_path):
    _, report = gated
    iso = report.isolation
    per = iso.per_tensor()
    promoted = iso.side_terms("promoted")
    assert set(promoted.index) == set(per.index) and promoted.shape[1] == SAMPLES
    np.testing.assert_allclose(promoted.sum(axis=1), noise_power(per.loc[promoted.index, "promoted"].astype(float)),
                               rtol=1e-6)
    np.testing.assert_allclose(iso.side_terms("all_16").loc[""].sum(), noise_power(iso.all_16), rtol=1e-6)
    report.save(tmp_path / "r")
    loaded = SensitivityReport.load(tmp_path / "r").isolation
    for side in ("all_8", "all_16", "promoted", "demoted"):
        np.testing.assert_array_equal(loaded.side_terms(side).to_numpy(), iso.side_terms(side).to_numpy())
        assert loaded.side_terms(side).index.tolist() == iso.side_terms(side).index.tolist()


def test_a_report_saved_without_terms_orders_by_the_mean(gated, tmp_path):
    study, report = gated
    report.save(tmp_path / "old")
    (tmp_path / "old" / "isolation_terms.csv").unlink()  # as a report saved before the terms were kept
    old = SensitivityReport.load(tmp_path / "old")
    assert old.isolation.terms is None
    order, _ = promotion_order(study, old, PrecisionPlan.a8w8())
    assert order.index("b") < order.index("a")
    # Saved again without terms over a folder that had them, the folder keeps none.
    report.save(tmp_path / "old")
    old.save(tmp_path / "old")
    assert not (tmp_path / "old" / "isolation_terms.csv").exists()
