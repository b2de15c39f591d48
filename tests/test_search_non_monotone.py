"""The search on a real model whose accuracy is not monotone in the number of promoted tensors: promoting one
tensor reaches the target, promoting every tensor the analysis finds helpful (and all-16-bit) misses it. The walk
runs through a real study and real ONNX Runtime sessions, and must find the middle plan."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from conftest import IR
from mpstudio.data import FeedList
from mpstudio.plan import PrecisionPlan
from mpstudio.search import search
from mpstudio.study import Study

ROWS, WIDTH = 256, 256  # enough MACs that the cost model prices a partial promotion below all-16-bit
SHIFT, GAIN, LEVEL = 0.3, 0.5185, 0.3059  # found by scanning: rounding errors that cancel only in some plans


def _shift_and_scale() -> onnx.ModelProto:
    """x -> t = x + 0.3 -> y = t @ W, with W diagonal (1.0, then GAIN): every quantized value sits at a fixed
    place on its 8-bit grid, so the 8-bit rounding of y partly cancels the int8 weight's rounding of GAIN while
    the 16-bit grids of t and y leave that weight error alone."""
    weight = np.diag(np.full(WIDTH, GAIN, np.float32))
    weight[0, 0] = 1.0
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "shift"], ["t"], name="/shift/Add"),
         helper.make_node("MatMul", ["t", "weight"], ["y"], name="/scale/MatMul")],
        "shift_and_scale",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, ROWS, WIDTH])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, ROWS, WIDTH])],
        initializer=[numpy_helper.from_array(weight, "weight"),
                     numpy_helper.from_array(np.full(WIDTH, SHIFT, np.float32), "shift")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=IR)


def _feeds(count: int) -> list[dict[str, np.ndarray]]:
    x = np.full((1, ROWS, WIDTH), LEVEL, np.float32)
    x[0, 0, 0] = 1.0  # sets the 8-bit ranges: every other value is LEVEL
    return [{"x": x.copy()} for _ in range(count)]


def test_the_search_finds_a_middle_promotion_where_every_helpful_tensor_misses(tmp_path):
    path = tmp_path / "shift_and_scale.onnx"
    onnx.save(_shift_and_scale(), path)
    study = Study.create(tmp_path / "study", path, FeedList(_feeds(2)), FeedList(_feeds(2)))
    try:
        target = 60.0  # dB of output SNR against the float model
        result = search(study, target, weights="per-tensor", max_evaluations=8, confirm=None, quiet=True)
        assert len(result.order) >= 2, result.order  # more than one tensor is predicted to help
        # The premise, measured on the same study: every helpful tensor at 16 bits misses, and so does all-16-bit.
        every = study.evaluate(PrecisionPlan.a8w8().promote(list(result.order), name="every helpful"))
        assert every.value < target and result.baselines["a16w8"].value < target
        assert result.baselines["a8w8"].value < target
        # The walk does not take "every helpful tensor misses" as "nothing reaches": it finds the middle plan.
        assert result.reached, result.describe()
        pick = study.plan(result.recommended.plan_id)
        assert 0 < len(pick.overrides) < len(result.order)
        assert set(pick.overrides) == set(result.order[:len(pick.overrides)])
        assert result.recommended.value >= target > every.value
        assert result.recommended.latency("estimate").ms < result.baselines["a16w8"].latency("estimate").ms
    finally:
        study.close()


class _Walk:
    """The walk's side of a PrefixGrid with fixed values per k (the grid's own logic is what is under test)."""

    workers, hib, budget = [None], True, 16

    def __init__(self, value, threshold):
        self.value, self.threshold, self.evaluated = value, threshold, []

    def left(self):
        return self.budget - len(self.evaluated)

    def reaches(self, e):
        return e.value >= self.threshold

    def pointless(self, plan):
        return None

    def evaluate(self, plans, pass_over=False):
        from mpstudio.store import Evaluation

        self.evaluated += plans
        return [Evaluation(k, "h", f"+{k}", "cpu", "CPU", "m", self.value(k), True, None, None, 1, 0.0) for k in plans]


def _walk_in_time(walk, cap, known, seconds=20.0):
    """PrefixGrid(walk, ...).run() in a thread: its reason, or None when it has not stopped within `seconds`."""
    import threading

    from mpstudio.search.grid import PrefixGrid

    out = []
    thread = threading.Thread(target=lambda: out.append(PrefixGrid(walk, lambda k: k, cap, known).run(None)),
                              daemon=True)
    thread.start()
    thread.join(seconds)
    return out[0] if out else None


def test_the_walk_stops_when_only_all_16_bit_beyond_its_range_reaches_the_target():
    """As on the outcome benchmark's encoder: a second target that only all-16-bit (known at k = every tensor, far
    beyond the range the stored plans leave worth evaluating) reaches. The walk evaluates its range and stops,
    where it once asked for the k between its range and all-16-bit forever."""
    from mpstudio.store import Evaluation

    walk = _Walk(lambda k: 0.96 + 0.001 * k, 0.99)
    known = {0: Evaluation(0, "h", "base", "cpu", "CPU", "m", 0.96, True, None, None, 1, 0.0),
             199: Evaluation(199, "h", "a16w8", "cpu", "CPU", "m", 0.9995, True, None, None, 1, 0.0)}
    reason = _walk_in_time(walk, 7, known)
    assert reason is not None, "the walk did not stop"
    assert "no promotion reaches the target" in reason and 7 in known
    assert all(0 < k <= 7 for k in walk.evaluated)


def test_the_walk_stops_when_its_best_value_lies_beyond_its_range():
    """No k reaches the target and the best value is all-16-bit's, beyond the range: its neighbours are not asked."""
    from mpstudio.store import Evaluation

    walk = _Walk(lambda k: 0.96 + 0.001 * k, 0.9999)
    known = {0: Evaluation(0, "h", "base", "cpu", "CPU", "m", 0.96, True, None, None, 1, 0.0),
             199: Evaluation(199, "h", "a16w8", "cpu", "CPU", "m", 0.9995, True, None, None, 1, 0.0)}
    reason = _walk_in_time(walk, 7, known)
    assert reason is not None, "the walk did not stop"
    assert all(0 < k <= 7 for k in walk.evaluated) and len(walk.evaluated) <= 7


def test_the_top_down_walk_says_how_many_it_demotes_from_the_all_16_bit_plan():
    """The top-down walk's k are promotions on the base of the tensors all-16-bit keeps; its plans are named by
    what they demote from all-16-bit, and so are its reasons (they once read "the best, 0 promoted", "1 to 8
    promoted" for plans named a16w8-pc-393x8)."""
    from mpstudio.search.grid import PrefixGrid
    from mpstudio.store import Evaluation

    def known():
        return {0: Evaluation(0, "h", "base", "cpu", "CPU", "m", 0.96, True, None, None, 1, 0.0),
                40: Evaluation(40, "h", "a16w8-pc", "cpu", "CPU", "m", 0.9995, True, None, None, 1, 0.0)}

    reached = PrefixGrid(_Walk(lambda k: 0.96 + 0.001 * k, 0.965), lambda k: k, 8, known(), full=40,
                         demoted_from="a16w8-pc").run(None)
    assert reached == "target reached with 35 demoted from a16w8-pc; 36 misses", reached
    missed = PrefixGrid(_Walk(lambda k: 0.96 + 0.001 * k, 0.99), lambda k: k, 8, known(), full=40,
                        demoted_from="a16w8-pc").run(None)
    assert "the best, 32 demoted from a16w8-pc" in missed and "(39 to 32 demoted from a16w8-pc:" in missed, missed
    bottom_up = PrefixGrid(_Walk(lambda k: 0.96 + 0.001 * k, 0.965), lambda k: k, 8, known(), full=40).run(None)
    assert bottom_up == "target reached with 5 promoted; 4 misses", bottom_up
    # A range of one plan says that plan ("39 demoted", not "39 to 39 demoted").
    one = PrefixGrid(_Walk(lambda k: 0.96 + 0.001 * k, 0.99), lambda k: k, 1, known(), full=40,
                     demoted_from="a16w8-pc").run(None)
    assert "(39 demoted from a16w8-pc:" in one, one
