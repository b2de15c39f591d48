"""The analysis's workers within the machine's memory: no more of them than the available memory holds, and a
worker lets its scoring sessions go when it turns to isolation."""

from conftest import conv_feeds, make_conv_model
from mpstudio import qdq
from mpstudio.data import FeedList
from mpstudio.graph import ModelGraph
from mpstudio.model import prepare_model
from mpstudio.plan import PrecisionPlan
from mpstudio.quantize import Quantizer
from mpstudio.runtime import available_cores, memory_status
from mpstudio.sensitivity.isolation import float_references, own_params, plan_ends
from mpstudio.sensitivity.workers import IsolationSpec, ScoringSpec, SensitivityWorker, worker_count, worker_memory


def test_no_more_workers_than_the_memory_holds():
    assert worker_count() == available_cores()
    assert worker_count(memory_each=1) == available_cores()
    status = memory_status()
    assert status is not None and 0 < status[0] <= status[1]
    assert worker_count(memory_each=status[0]) == 1  # one worker's worth: one (and never none)
    assert worker_count(memory_each=10 * status[1]) == 1


def test_a_workers_memory_grows_with_the_weights_and_the_activations():
    small = prepare_model(make_conv_model()).model
    wide = prepare_model(make_conv_model()).model
    for init in wide.graph.initializer:  # the same graph with a hundred times the weight bytes, as raw padding
        init.raw_data = init.raw_data * 100 if init.raw_data else init.raw_data
        init.dims[0] *= 100 if init.raw_data else 1
    base = worker_memory(small, ModelGraph(small))
    assert base > 256 << 20
    assert worker_memory(wide, ModelGraph(small)) > base


def test_a_worker_drops_its_scoring_sessions_when_it_turns_to_isolation(tmp_path):
    feeds = conv_feeds(4)
    quantizer = Quantizer(prepare_model(make_conv_model()), FeedList(feeds), tmp_path / "cache")
    end_8, end_16 = plan_ends(PrecisionPlan.a8w8())
    path_8, path_16 = quantizer.generate(end_8), quantizer.generate(end_16)
    params_8 = {t: v.encoding for t, v in qdq.read(qdq.load(path_8)).activations().items()}
    params_16 = {t: v.encoding for t, v in qdq.read(qdq.load(path_16)).activations().items()}
    outputs = ["y"]
    worker = SensitivityWorker(
        ScoringSpec(str(quantizer.float_path), str(path_8), params_8, params_16),
        IsolationSpec(str(quantizer.float_path), str(path_8), str(path_16), params_16,
                      own_params(quantizer, PrecisionPlan.a8w8()), feeds,
                      float_references(quantizer.float_path, FeedList(feeds), outputs), outputs))
    scored = worker.run("score", feeds)
    assert scored.samples == 4 and worker._scorer is not None
    [(value, terms)] = worker.run("isolate", ([("promote", ["relu1_out"])], 4))
    assert worker._scorer is None and value > 0 and len(terms) == 4


def test_a_large_model_gets_fewer_cut_points():
    from mpstudio.sensitivity.isolation.cuts import MOST_CUTS, cut_count

    model = prepare_model(make_conv_model()).model
    weights = sum(len(init.raw_data) or 4 * len(init.float_data) for init in model.graph.initializer)
    assert cut_count(model) == MOST_CUTS  # a small model: every cut point
    assert cut_count(model, budget=weights) == 2  # suffixes may hold the model's weights once: two cuts
    assert cut_count(model, budget=1) == 2


def test_the_switchable_model_opens_its_baseline_and_frontier_sessions_only_while_it_uses_them(tmp_path):
    from mpstudio.sensitivity.isolation import SwitchableModel
    from mpstudio.sensitivity.isolation.edges import ALL_8

    feeds = conv_feeds(3)
    quantizer = Quantizer(prepare_model(make_conv_model()), FeedList(feeds), tmp_path / "cache")
    switchable = SwitchableModel.from_quantizer(quantizer)
    cached = switchable.cached(feeds)
    assert switchable._session_8 is None  # computed the all-8-bit outputs, and let the session go
    again = [switchable.run(feed, ALL_8) for feed in feeds]
    for mine, theirs in zip(cached.outputs(ALL_8), again):
        for a, b in zip(mine, theirs):
            assert (a == b).all()
