"""The search's HTP confirmation: a pick within noise of the target on the HTP is reported as such (no jump to
all-16-bit), and a pick that clearly misses there is followed by the dearer plans the walk evaluated, by estimated
latency (mixed plans the CPU front leaves out included), before the all-16-bit baseline.

The within-noise case runs on the HTP emulator with measured values. A CPU/HTP disagreement large enough to turn
a clear CPU reach into a clear HTP miss cannot be built with a small onnx.helper model, so the clear-miss cases
write the CPU and HTP accuracies into a real study (its SQLite store; every plan real, estimated by the real cost
model) and run the real search and confirmation over them: every evaluation they ask for is answered by the store.
"""

from __future__ import annotations

import onnx
import pytest

from conftest import chain_feeds, make_chain_model, requires_qnn
from mpstudio.data import FeedList
from mpstudio.plan import PrecisionPlan
from mpstudio.search import search
from mpstudio.search.choice import stored_evaluations
from mpstudio.search.confirmation import confirmation_order
from walk_support import front_order
from mpstudio.search.evidence import WITHIN_NOISE
from mpstudio.store import AccuracyRecord
from mpstudio.study import Study


def _chain_study(tmp_path, sigmoid: bool = False, size: int | None = None) -> Study:
    """The chain model; with `sigmoid`, Sigmoids in place of its Relus, wider and larger: 16-bit Sigmoids cost the
    HTP much more than 8-bit ones, so the cost model prices each added promotion a little dearer, all below
    all-16-bit. `size`: the input's height and width (default 32 with `sigmoid`, else 16)."""
    size = size or (32 if sigmoid else 16)
    model = make_chain_model(blocks=6, channels=16 if sigmoid else 8, size=size)
    for node in model.graph.node:
        if sigmoid and node.op_type == "Relu":
            node.op_type = "Sigmoid"
    onnx.save(model, tmp_path / "chain.onnx")
    return Study.create(tmp_path / "study", tmp_path / "chain.onnx", FeedList(chain_feeds(8, size=size)),
                        FeedList(chain_feeds(6, size=size, seed=5)))


def test_walk_front_stops_at_a_plan_within_noise():
    """Candidates cheapest first, the pick at 2; True reaches, False clearly misses, None cannot be built."""
    N = WITHIN_NOISE
    # The pick within noise: the dearer partial promotions until one clearly reaches (within noise or missing,
    # the next), never a cheaper one, never all-16-bit (the last candidates, from `mixed` on).
    assert front_order([True, True, N, True, True], at=2) == [2, 3]
    assert front_order([True, True, N, N, False, True, True], at=2) == [2, 3, 4, 5]
    assert front_order([True, True, N, N, True], at=2, mixed=4) == [2, 3]
    assert front_order([True, True, N, True], at=2, mixed=3) == [2]
    # ... then an all-16-bit plan that costs little more (before `near`), never a dearer one.
    assert front_order([True, True, N, N, True, True], at=2, mixed=4, near=5) == [2, 3, 4]
    assert front_order([True, True, N, N, False, True], at=2, mixed=4, near=6) == [2, 3, 4, 5]
    assert front_order([True, True, N, True], at=2, mixed=3, near=3) == [2]
    assert front_order([True, True, N, N, N, True], at=2, budget=2) == [2, 3]
    # ... passing over the dearer plans the walk's backend says clearly miss the target (a clear reach is what
    # the budget looks for), whatever the confirming backend would have said of them.
    assert front_order([True, True, N, True, False, True], at=2, hopeless={3, 4}) == [2, 5]
    assert front_order([True, True, N, N, True], at=2, budget=2, hopeless={3}) == [2, 4]
    # A clear miss of the pick on the confirming backend still tries them: the backends disagree there.
    assert front_order([True, True, False, False, True], at=2, hopeless={3}) == [2, 3, 4]
    # The pick clearly misses: dearer plans until one reaches, or is within noise.
    assert front_order([True, True, False, False, True, True], at=2) == [2, 3, 4]
    assert front_order([True, True, False, N, True], at=2) == [2, 3]
    # The pick reaches: cheaper plans while they reach; one within noise is the edge.
    assert front_order([True, N, True, True], at=2) == [2, 1]
    # The pick cannot be built: the nearest dearer plan that builds sets the direction, within noise included.
    assert front_order([True, True, None, N, True], at=2) == [2, 3, 4]
    assert front_order([True, True, None, N, True], at=2, mixed=4) == [2, 3]
    # Nothing dearer builds: the cheaper plans follow until one is within noise.
    assert front_order([True, N, False, None, None], at=3) == [3, 4, 2, 1]
    # Nothing misses: the order is what it was (cheaper plans while they reach, the first miss ends it).
    assert front_order([False, True, True, True], at=3) == [3, 2, 1, 0]


def _dearer_each_step(study: Study, steps: int) -> list[str]:
    """The study's activations, ordered so that each of the first `steps` prefixes is priced dearer than the one
    before by the cost model (the cheapest such step each time): which promotions add converts and which remove
    one is the cost model's to say, so the order is asked of it rather than assumed from the graph's order."""
    chosen, rest = [], list(study.graph.activations())
    ms = study.estimate(PrecisionPlan.a8w8()).ms
    for _ in range(steps):
        priced = [(study.estimate(PrecisionPlan.a8w8().promote([*chosen, t])).ms, t) for t in rest]
        dearer = [(m, t) for m, t in priced if m > ms]
        if not dearer:
            break
        ms, pick = min(dearer)
        chosen.append(pick)
        rest.remove(pick)
    return chosen + rest


class _Stored:
    """Plans of a real chain model with their real cost-model estimates, and accuracies written into the study's
    store for the CPU and the HTP emulator (not measured: see the module docstring)."""

    def __init__(self, study: Study):
        self.study = study
        self.cpu, self.htp = study.accuracy_source("cpu"), study.accuracy_source("htp")
        self.activations = _dearer_each_step(study, 4)
        self.ids: dict[str, int] = {}

    def plan(self, k: int | str) -> PrecisionPlan:
        if k == "a8w8":
            return PrecisionPlan.a8w8()
        if k == "a16w8":
            return PrecisionPlan.a16w8()
        return PrecisionPlan.a8w8().promote(self.activations[:k], name=f"a8w8+{k}x16")

    def write(self, k, cpu: float, htp: float | None) -> int:
        plan = self.plan(k)
        plan_id = self.study.add_plan(plan, "search")
        self.study.estimate(plan)  # the real cost model's estimate, stored with the plan
        for source, backend, value in ((self.cpu, "cpu", cpu), (self.htp, "htp", htp)):
            if value is not None:
                self.study.store.record(plan_id, AccuracyRecord(backend, source, self.study.metric_name, value,
                                                                self.study.higher_is_better, value, None, 6, 0.1))
        self.ids[plan.name] = plan_id
        return plan_id

    def ms(self, name: str) -> float:
        return self.study.store.evaluation(self.ids[name], self.cpu).latency("estimate").ms


def _disagreeing_study(tmp_path, htp_plans: int = 6) -> tuple[Study, _Stored]:
    """a8w8 reaches 12 dB on the CPU (the walk's pick) and clearly misses it on the HTP; the promotions of 1, 2
    and 3 tensors are dominated on the CPU by a8w8 (no better for more latency), 4 is on the CPU front; on the
    HTP, 2 is the cheapest that reaches. The HTP values are written for the first `htp_plans` plans only (the
    study holds no others: a confirmation that asked for one would run it on the emulator)."""
    study = _chain_study(tmp_path, sigmoid=True, size=64)  # large enough that +4 is clearly under all-16-bit
    stored = _Stored(study)
    for i, (k, cpu, htp) in enumerate((("a8w8", 12.5, 10.0), (1, 12.3, 10.5), (2, 12.4, 12.8), (3, 12.2, 13.0),
                                       (4, 14.0, 14.5), ("a16w8", 35.9, 35.7))):
        stored.write(k, cpu, htp if i < htp_plans else None)
    names = ["a8w8", "a8w8+1x16", "a8w8+2x16", "a8w8+3x16", "a8w8+4x16", "a16w8"]
    estimates = [stored.ms(n) for n in names]
    assert estimates == sorted(estimates) and len(set(estimates)) == len(estimates)  # the model prices them so
    return study, stored


@requires_qnn
def test_confirmation_order_puts_every_dearer_plan_before_all_16_bit(tmp_path):
    study, stored = _disagreeing_study(tmp_path)
    with study:
        # A hand-made plan dearer than all-16-bit (the walk never evaluates one, a user may): still before it.
        every = PrecisionPlan.a8w8().promote(stored.activations, name="every-activation", to="uint16")
        plan_id = study.add_plan(every, "user")
        study.estimate(every)
        study.store.record(plan_id, AccuracyRecord("cpu", stored.cpu, study.metric_name, 30.0, True, 30.0, None, 6, 0.1))
        evaluations = stored_evaluations(study, stored.cpu)
        pick = next(e for e in evaluations if e.name == "a8w8+2x16")
        order, at = confirmation_order(evaluations, pick, True, lambda e: e.name == "a16w8")
        names = [e.name for e in order]
        # Cheaper: the CPU front only (a8w8; +1 is dominated). Dearer: +3 (dominated on the CPU) and +4 by latency,
        # the hand-made plan, all-16-bit last.
        assert names[:at + 1] == ["a8w8", "a8w8+2x16"]
        assert names[at + 1:] == ["a8w8+3x16", "a8w8+4x16", "every-activation", "a16w8"]
        # A latency budget leaves out the dearer plans over it.
        order, at = confirmation_order(evaluations, pick, True, lambda e: e.name == "a16w8",
                                       latency_budget_ms=stored.ms("a8w8+3x16"))
        assert [e.name for e in order][at + 1:] == ["a8w8+3x16"]


def test_at_one_latency_the_better_all_16_bit_plan_is_confirmed_first():
    """a16w8 and a16w8-pc are priced alike; after a pick within noise the confirmation has room for one of them
    (on the recognizer it took a16w8, CER 0.141, while a16w8-pc reached the target at 0.0031)."""
    from mpstudio.sources import Latency
    from mpstudio.store import Evaluation

    def plan(plan_id, name, value, ms):
        return Evaluation(plan_id, f"h{plan_id}", name, "cpu", "cpu", "CER", value, False, None, None, 96, 1.0,
                          (Latency(ms, "estimate", "HTP v75 (cost model)"),))
    pick = plan(3, "a8w8-pc+143x16", 0.065, 2.394)
    stored = [plan(1, "a8w8-pc", 0.107, 1.528), plan(2, "a16w8", 0.152, 2.427), pick,
              plan(4, "a16w8-pc", 0.0031, 2.427)]
    order, at = confirmation_order(stored, pick, False, lambda e: e.name.startswith("a16w8"))
    assert [e.name for e in order][at:] == ["a8w8-pc+143x16", "a16w8-pc", "a16w8"]


@pytest.mark.htp
@requires_qnn
def test_a_clear_miss_on_the_htp_tries_the_cpu_dominated_plans_before_all_16_bit(tmp_path):
    study, stored = _disagreeing_study(tmp_path, htp_plans=3)
    with study:
        result = search(study, 12.0, weights="per-tensor", max_evaluations=6, confirm_plans=3, quiet=True)
        assert result.walk_pick is not None and result.walk_pick.name == "a8w8"  # the CPU's pick
        # a8w8 clearly misses on the HTP; +1 (dominated on the CPU) misses too; +2 (dominated on the CPU) reaches:
        # the confirmation stops there, before +3, +4 and a16w8, which the old front walk went to.
        assert [c.walk.name for c in result.confirmations] == ["a8w8", "a8w8+1x16", "a8w8+2x16"]
        assert [c.verdict for c in result.confirmations] == ["misses", "misses", "reaches"]
        assert result.recommended.name == "a8w8+2x16" and result.recommended.accuracy_source == stored.htp
        assert result.reached and result.verdict == "reaches" and not result.confirm_note
        frame = study.evaluations()
        assert set(frame.loc[frame["accuracy_source"] == stored.htp, "name"]) == {"a8w8", "a8w8+1x16", "a8w8+2x16"}
        text = result.describe()
        assert "plan %d a8w8 reaches the target on %s" % (stored.ids["a8w8"], stored.cpu) in text
        record = result.to_json()
        assert [c["confirmed_verdict"] for c in record["confirmations"]] == ["misses", "misses", "reaches"]


@pytest.mark.htp
@requires_qnn
def test_a_budget_spent_on_misses_says_which_dearer_plans_were_not_confirmed(tmp_path):
    study, stored = _disagreeing_study(tmp_path, htp_plans=2)
    with study:
        result = search(study, 12.0, weights="per-tensor", max_evaluations=6, confirm_plans=2, quiet=True)
        assert [c.walk.name for c in result.confirmations] == ["a8w8", "a8w8+1x16"]
        assert not result.reached and result.verdict == "misses"
        assert result.recommended.name == "a8w8+1x16"  # the most accurate the HTP scored
        note = result.confirm_note
        assert "4 dearer plan(s)" in note and "--confirm-plans 2" in note and note in result.describe()
        for name in ("a8w8+2x16", "a8w8+4x16", "a16w8"):
            assert f"plan {stored.ids[name]} {name}" in note
        assert "a8w8+3x16" in note  # dominated on the CPU, still a candidate
        from mpstudio.widgets.search_card import search_card_html

        assert "4 dearer plan(s)" in search_card_html(result)  # the studio's card says it too


@pytest.mark.htp
@requires_qnn
def test_a_pick_within_noise_on_the_htp_is_reported_as_such(tmp_path):
    """Measured on the HTP emulator: the Sigmoid chain's all-8-bit plan scores a little lower there than on the CPU
    (the HTP's Sigmoid is not the CPU's; with the HTP's requantization in the CPU numerics, the Relu chain's two
    backends agree to 0.01 dB and the HTP no longer reads lower). With the target between the HTP interval's low
    end and the CPU's, a8w8 clearly reaches on the CPU (the walk stops at once) and is within noise on the HTP: the
    confirmation reports it so and tries no dearer plan. At 64x64 the 16-bit Sigmoids' premium is more than the cost
    model resolves (at 32x32 it is not: a latency tie, which all-16-bit's better value wins)."""
    with _chain_study(tmp_path, sigmoid=True, size=64) as study:
        cpu = study.evaluate(PrecisionPlan.a8w8(), "cpu")
        htp = study.evaluate(PrecisionPlan.a8w8(), "htp")
        assert htp.low < cpu.low  # as measured (the planted condition, not what is tested)
        target = (htp.low + cpu.low) / 2
        result = search(study, target, weights="per-tensor", max_evaluations=6, confirm_plans=3, quiet=True)
        assert result.walk_pick is None and result.recommended.name == "a8w8"
        assert result.recommended.accuracy_source == htp.accuracy_source
        assert [(c.walk.name, c.walk_verdict, c.verdict) for c in result.confirmations] == [
            ("a8w8", "reaches", "within noise")]
        assert result.within_noise and result.verdict == "within noise"
        frame = study.evaluations()
        assert "a16w8" not in set(frame.loc[frame["accuracy_source"] == htp.accuracy_source, "name"])
        text = result.describe()
        assert f"within noise of the target on {htp.accuracy_source}" in text
        assert "is within noise of it on" in text  # CPU reaches, HTP within noise: said where they disagree
        from mpstudio.widgets.search_card import search_card_html

        assert ">within noise</span>" in search_card_html(result)  # the card's CPU/HTP table


def _within_noise_study(folder, htp_plus_2: float, htp_a16w8: bool) -> tuple[Study, _Stored]:
    """The chain (Sigmoids, 64x64) with CPU and HTP accuracies written for a8w8, +1..+4 and a16w8 against a target of
    13 dB: every partial plan reaches it on the CPU and is within noise of it on the HTP (+-0.6 dB), short of it by
    its value there except +2 at `htp_plus_2`; a16w8 clearly reaches it on the CPU, and on the HTP when
    `htp_a16w8` writes it (else the study holds no HTP value of it: asking for one would run the emulator)."""
    folder.mkdir()
    study = _chain_study(folder, sigmoid=True, size=64)
    stored = _Stored(study)
    for k, cpu, htp in (("a8w8", 13.5, 12.6), (1, 13.6, 12.7), (2, 13.7, htp_plus_2), (3, 13.8, 12.7),
                        (4, 14.0, 12.9), ("a16w8", 35.9, 35.7)):
        plan = stored.plan(k)
        plan_id = study.add_plan(plan, "search")
        study.estimate(plan)
        for source, backend, value, half in ((stored.cpu, "cpu", cpu, 0.4), (stored.htp, "htp", htp, 0.6)):
            if backend == "cpu" or k != "a16w8" or htp_a16w8:
                study.store.record(plan_id, AccuracyRecord(backend, source, study.metric_name, value, True, value,
                                                           None, 6, 0.1, value - half, value + half))
        stored.ids[plan.name] = plan_id
    return study, stored


@pytest.mark.htp
@requires_qnn
def test_when_no_plan_within_noise_meets_the_target_the_last_confirmation_goes_to_all_16_bit(tmp_path):
    """The CNN of docs/benchmarks.md: on 200 images every plan from a8w8-pc to a16w8-pc was within noise of the
    target, the partial promotions read short of it on the HTP and the walk's pick with them. Confirming dearer
    partials only, the budget ran out on them and the pick stayed one that misses the target by its value on the
    HTP. Now one confirmation past the budget goes to the all-16-bit plan (dearer than "little more"), which meets
    it; a budget that ends on a plan meeting the target spends nothing more."""
    study, stored = _within_noise_study(tmp_path / "short", htp_plus_2=12.8, htp_a16w8=True)
    assert stored.ms("a16w8") > stored.ms("a8w8") * 1.1  # not "little more": never confirmed before
    with study:
        result = search(study, 13.0, weights="per-tensor", max_evaluations=6, confirm_plans=3, quiet=True)
        confirmed = [(c.walk.name, c.verdict) for c in result.confirmations]
        assert confirmed == [("a8w8", "within noise"), ("a8w8+1x16", "within noise"), ("a8w8+2x16", "within noise"),
                             ("a16w8", "reaches")]
        assert result.recommended.name == "a16w8" and result.recommended.accuracy_source == stored.htp
        assert result.reached
    study, stored = _within_noise_study(tmp_path / "meets", htp_plus_2=13.3, htp_a16w8=False)
    with study:
        result = search(study, 13.0, weights="per-tensor", max_evaluations=6, confirm_plans=3, quiet=True)
        assert [c.walk.name for c in result.confirmations] == ["a8w8", "a8w8+1x16", "a8w8+2x16"]
        assert result.recommended.name == "a8w8+2x16"  # within noise, and meets the target by its value
