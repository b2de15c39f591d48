"""The top-down walk (`search.topdown`) on a real model whose error only goes away when tensors are promoted
together: chains of Add/Sub pairs whose sparse constant sets one wide 8-bit range, so that every Add of a chain
quantizes onto the same grid and only the first rounding loses anything. Promoting one tensor from the
all-8-bit plan changes nothing (the next Add rounds the same way), while demoting one from the all-16-bit plan
costs its full rounding. The study's analysis isolated two tensors only, as a progressive analysis isolates 40
of the recognizer's 405: the bottom-up walk sees the rest through their cheap scores, one promotion at a time.
Real ONNX Runtime sessions and a real study throughout."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from conftest import IR
from mpstudio.data import FeedList
from mpstudio.plan import PrecisionPlan
from mpstudio.search import search
from mpstudio.search.topdown import latency_points, reserve, top_down_order
from mpstudio.study import Study

WIDE = 512  # enough bytes that the cost model prices the wide chain's promotions well above the narrow one's
NARROW_PAIRS, WIDE_PAIRS = 3, 2
NARROW_SPIKE, WIDE_SPIKE = 40.0, 44.0  # the sparse constants: each chain's 8-bit range, hence its rounding


def _chains() -> onnx.ModelProto:
    """y = wide chain of xw + narrow chain of xn; each pair adds a constant that is zero but in one element
    (setting the range) and subtracts it again."""
    nodes, initializers = [], []

    def pair(source: str, spike: float, tag: str, shape: list[int]) -> str:
        constant = np.zeros(shape, np.float32)
        constant.flat[0] = spike
        initializers.append(numpy_helper.from_array(constant, f"spike_{tag}"))
        nodes.append(helper.make_node("Add", [source, f"spike_{tag}"], [f"{tag}_up"], name=f"/{tag}/Add"))
        nodes.append(helper.make_node("Sub", [f"{tag}_up", f"spike_{tag}"], [f"{tag}_down"], name=f"/{tag}/Sub"))
        return f"{tag}_down"

    wide = "xw"
    for i in range(WIDE_PAIRS):
        wide = pair(wide, WIDE_SPIKE, f"w{i}", [WIDE])
    narrow = "xn"
    for i in range(NARROW_PAIRS):
        narrow = pair(narrow, NARROW_SPIKE, f"n{i}", [WIDE, 1])
    nodes.append(helper.make_node("Add", [wide, narrow], ["y"], name="/out/Add"))
    graph = helper.make_graph(
        nodes, "chains",
        [helper.make_tensor_value_info("xw", TensorProto.FLOAT, [1, WIDE, WIDE]),
         helper.make_tensor_value_info("xn", TensorProto.FLOAT, [1, WIDE, 1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, WIDE, WIDE])],
        initializer=initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=IR)


def _feeds(count: int, seed: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [{"xw": rng.normal(size=(1, WIDE, WIDE)).astype(np.float32),
             "xn": rng.normal(size=(1, WIDE, 1)).astype(np.float32)} for _ in range(count)]


SAMPLES, ISOLATION_SAMPLES = 4, 2


def _study(tmp_path) -> Study:
    """The study, with its all-8-bit analysis computed as a progressive analysis that isolated two tensors and
    stored where the search reads it."""
    from mpstudio.sensitivity import analyze_progressive
    from mpstudio.sensitivity.progressive import ENGINE_VERSION

    path = tmp_path / "chains.onnx"
    onnx.save(_chains(), path)
    study = Study.create(tmp_path / "study", path, FeedList(_feeds(SAMPLES, 0)), FeedList(_feeds(SAMPLES, 1)))
    report = analyze_progressive(study.quantizer, study.calibration.head(SAMPLES), None,
                                 isolation_samples=ISOLATION_SAMPLES, htp_arch=study.htp_arch, workers=0,
                                 keep=1, budget=2)
    report.save(study.folder / "sensitivity" / f"a8w8-{SAMPLES}-{ISOLATION_SAMPLES}-p{ENGINE_VERSION}")
    return study


@pytest.fixture(scope="module")
def chains(tmp_path_factory):
    study = _study(tmp_path_factory.mktemp("top_down"))
    yield study
    study.close()


def test_a_single_promotion_does_not_help_where_promotions_together_do(chains):
    """The premise, measured: the interaction the bottom-up walk cannot see one promotion at a time."""
    a8 = PrecisionPlan.a8w8()
    base = chains.evaluate(a8).value
    assert chains.evaluate(a8.promote(["w0_up"], name="w0_up")).value == pytest.approx(base, abs=0.05)
    assert chains.evaluate(a8.promote(["n0_up"], name="n0_up")).value == pytest.approx(base, abs=0.05)
    assert chains.evaluate(a8.promote(["w0_up", "w1_up"], name="wide ups")).value > base + 2.0


def test_the_demotion_order_and_its_points(chains):
    report = chains.sensitivity(samples=SAMPLES, isolation_samples=ISOLATION_SAMPLES)
    assert len(report.isolation.per_tensor()) == 2  # the premise: the analysis isolated two tensors
    base = PrecisionPlan.a8w8()
    order = top_down_order(chains, report, base)
    assert set(order) == set(chains.graph.activations())
    # The spiked Adds' 8 bits cost the most noise, the narrow ones for the least latency: they are kept at
    # 16 bits longest (promoted first).
    spiked = [t for t in order if t.endswith("_up")]
    assert order.index("n0_up") < order.index("w0_up")
    assert max(order.index(t) for t in spiked if t.startswith("n")) < len(order) // 2
    low, high = (chains.estimate(p).ms for p in (base, PrecisionPlan.a16w8()))
    points = latency_points(lambda k: chains.estimate(base.promote(order[:k])).ms, len(order), low, high)
    assert points == sorted(points) and 0 < points[0] and points[-1] < len(order)
    assert all(chains.estimate(base.promote(order[:k])).ms <= high for k in points)
    assert reserve(12) == 4 and reserve(5) == 0  # the bottom-up walk keeps at least three


def test_the_search_finds_a_partial_plan_only_the_top_down_walk_reaches(chains):
    """On the code before the top-down walk this search recommended a16w8: no prefix of the bottom-up order
    reaches 33 dB below all-16-bit's cost."""
    target = 33.0
    result = search(chains, target, weights="per-tensor", max_evaluations=12, confirm=None, quiet=True,
                    sensitivity_samples=SAMPLES, isolation_samples=ISOLATION_SAMPLES)
    assert result.baselines["a8w8"].value < target < result.baselines["a16w8"].value
    pick = chains.plan(result.recommended.plan_id)
    assert result.reached, result.describe()
    assert 0 < len(pick.overrides) < len(list(chains.graph.activations())), result.describe()
    assert "x8" in result.recommended.name and "top-down walk" in result.stop_reason
    assert result.recommended.value >= target
    assert result.recommended.latency("estimate").ms < result.baselines["a16w8"].latency("estimate").ms
