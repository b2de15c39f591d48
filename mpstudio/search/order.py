"""The promotion order a search walks: activation tensors by the noise a promotion surely removes (a lower bound
over the isolation samples) per estimated latency cost, or (the mixed weight search) activation promotions and
weight steps in one order; and the plans a prefix of it makes."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from ..errors import MpstudioError
from ..folding import folded_activation
from ..noise import added_noise, is_output_snr, noise_power, remaining_noise, removed_noise, snr_db
from ..plan import PrecisionPlan
from ..store import Evaluation

if TYPE_CHECKING:  # the study face is only named in annotations
    from ..study import Study


def promotion_order(study: Study, report, base_plan: PrecisionPlan, first=()) -> tuple[list[str], list[float]]:
    """The tensors of `first` (those the isolation's output SNR cannot judge: `walk`), then the isolated tensors
    whose promotion surely helps on its own, by the noise it surely removes (`_surely_removed`) per estimated latency
    cost; then those whose promotion helps on average only, by the mean it removes per cost; then those whose
    demotion from all-16-bit hurts, by the noise it adds per cost; then the tensors the analysis did not isolate (by
    their cheap scores); and the predicted output SNR of each prefix of the isolated part (a tensor's share of the
    noise counted as the larger of the two sides, its mean)."""
    from ..latency import promotion_costs

    if report.isolation is None:
        raise MpstudioError("the search needs isolation scores; analyze with isolation enabled")
    iso = report.isolation
    noise_8, noise_16 = (noise_power(iso.all_8), noise_power(iso.all_16)) if is_output_snr(iso.metric) else (None, None)
    removed, added = _sides(iso)
    # A walk up from the base takes first what a promotion on its own removes (the demotion side tells what
    # matters near all-16-bit, where the top-down walk starts); the tensors that only hurt seen from the top
    # follow, then those the analysis did not isolate (a progressive analysis isolates those that can change
    # a decision), in the ranking's order of their cheap scores: never left out.
    first = [t for t in dict.fromkeys(first) if t not in base_plan.overrides]
    contribution = np.fmax(removed, added)  # a side not measured (NaN) leaves the other
    unisolated = [t for t in report.ranking["tensor"]
                  if t not in removed.index and t not in base_plan.overrides and t not in first]
    contribution = contribution[contribution > 0]
    if contribution.empty:
        return first + unisolated, []
    model = study.quantizer.generate(base_plan)
    costs = promotion_costs(model, list(contribution.index), study.htp_arch, graph=study.graph)
    costs = costs.reindex(contribution.index).fillna(costs.median() if len(costs) else 1.0)
    floor = max(float(costs[costs > 0].min()) if (costs > 0).any() else 1e-6, 1e-6)
    costs = costs.clip(lower=floor)
    surely = _surely_removed(iso, removed).reindex(costs.index)
    removed, added = removed.reindex(costs.index), added.reindex(costs.index)
    helps = removed > 0
    # A mean removal within the samples' noise, divided by a small cost, would outrank solid ones: those come
    # first, by what they surely remove.
    solid = helps & (surely > 0)
    on_average = helps & ~solid
    surely_first = (surely[solid] / costs[solid]).sort_values(ascending=False, kind="stable")
    unsure = (removed[on_average] / costs[on_average]).sort_values(ascending=False, kind="stable")
    then = (added[~helps] / costs[~helps]).sort_values(ascending=False, kind="stable")
    ranked = list(surely_first.index) + list(unsure.index) + list(then.index)
    order = first + [t for t in ranked if t not in first]
    predicted = []
    if noise_8 is not None:
        # Noise powers add: the all-8-bit noise less what each promoted tensor contributes.
        noise = noise_8
        for t in order:
            noise = remaining_noise(noise, float(contribution.get(t, 0.0)), noise_16)
            predicted.append(snr_db(noise))
    return order + unisolated, predicted


def _sides(iso) -> tuple[pd.Series, pd.Series]:
    """What each isolated tensor's 8 bits cost, seen from both ends: the noise its promotion alone removes from
    the all-8-bit plan and the noise its demotion alone adds to the all-16-bit plan (output SNR), or the metric's
    gain and loss (a task metric). Indexed by tensor."""
    per = iso.per_tensor()
    if not is_output_snr(iso.metric):
        return per["promoted_gain"].astype(float), per["demoted_loss"].astype(float)
    return (removed_noise(iso.all_8, per["promoted"].astype(float)),
            added_noise(per["demoted"].astype(float), iso.all_16))


MIN_BOOTSTRAP_SAMPLES = 4  # fewer isolation samples: a tensor's promotion is ranked by its mean removal


def _surely_removed(iso, removed: pd.Series) -> pd.Series:
    """What each tensor's promotion alone surely removes from the base: the lower end of the paired bootstrap
    interval of the noise removed over the isolation samples (`loop.uncertainty.lower_bounds`: its level, rounds
    and seed), the same samples drawn for the base and the promotion. `removed` (the mean) where there are no
    per-sample terms (a report saved before they were kept, a task metric) or fewer than `MIN_BOOTSTRAP_SAMPLES`."""
    from ..loop.uncertainty import lower_bounds

    promoted, base = iso.side_terms("promoted"), iso.side_terms("all_8")
    if promoted is None or base is None or "" not in base.index or iso.samples < MIN_BOOTSTRAP_SAMPLES:
        return removed
    known = [t for t in removed.index if t in promoted.index]
    if not known:
        return removed
    per_sample = base.loc[""].to_numpy()[None, :] - promoted.loc[known].to_numpy()  # tensors x samples
    bounds = pd.Series(lower_bounds(per_sample.T), index=known)
    return bounds.reindex(removed.index).fillna(removed)


def mixed_order(study: Study, report, base_plan: PrecisionPlan, base: Evaluation, samples: int,
                progress=None, cancel=None):
    """Activation promotions and weight steps (int4 -> int8, int8 -> int16) in one order, by predicted noise
    removed per estimated ms; the predicted output SNR of each prefix; and each step's overrides.

    Noise powers (relative to the output's power) add: an activation's share is its isolation score (as
    in `promotion_order`), a weight's is measured at the outputs with that weight alone quantized
    (`weight_isolation`), so both are priced in the same unit. A 16-bit weight also promotes the output of
    its op (HTP computes 16-bit weights only at 16 bits); its cost includes that promotion.
    """
    iso = report.isolation
    if iso is None or not is_output_snr(iso.metric):
        raise MpstudioError("the mixed weight search needs output-SNR isolation scores; analyze with isolation "
                            "enabled and no task metric")
    noise_8 = noise_power(iso.all_8)
    act_gain = np.maximum(*_sides(iso))
    act_gain = act_gain[act_gain > 0]
    weights = cached_weight_isolation(study, samples, progress, cancel)
    model = study.quantizer.generate(base_plan)
    noise = {bits: noise_power(weights[f"output_snr_{bits}"].astype(float)) for bits in (4, 8, 16)}
    candidates = _mixed_candidates(study, model, base_plan, act_gain, weights, noise)
    if not candidates:
        return [], [], []
    level = noise_power(base.snr_db) if base.snr_db is not None else noise_8
    return _greedy_steps(candidates, noise, level)


def _mixed_candidates(study: Study, model, base_plan: PrecisionPlan, act_gain: pd.Series, weights: pd.DataFrame,
                      noise: dict) -> list[tuple]:
    """The mixed order's candidate steps, (label, gain, cost, overrides): each helpful activation's promotion,
    and each int4 weight's int8 step and (where the HTP computes 16-bit weights) int16 step with its op's output."""
    from ..latency import promotion_costs, weight_costs
    from ..plan import MIN_ARCH_16BIT_WEIGHTS, TensorOverride
    from ..sensitivity.weight_isolation import WIDTH_TYPES

    graph = study.graph
    wide_ok = int(study.htp_arch or 75) >= MIN_ARCH_16BIT_WEIGHTS
    outputs = {w: _op_output(graph, w) for w in weights.index}
    activations = set(act_gain.index) | {t for t in outputs.values() if t}
    act_cost = promotion_costs(model, sorted(activations), study.htp_arch, graph=graph)
    act_cost = act_cost.fillna(act_cost.median() if act_cost.notna().any() else 0.0)
    cost_8 = weight_costs(model, {w: "int8" for w in weights.index}, study.htp_arch)
    cost_16 = weight_costs(model, {w: "int16" for w in weights.index}, study.htp_arch, "uint16")
    candidates = []  # (label, gain, cost, overrides)
    for t, gain in act_gain.items():
        candidates.append((t, float(gain), float(act_cost.get(t, 0.0)), {t: TensorOverride("uint16")}))
    for w in weights.index:
        if base_plan.overrides.get(w) is None or base_plan.overrides[w].type != "int4":
            continue
        candidates.append((f"{w}:{WIDTH_TYPES[8]}", float(noise[4][w] - noise[8][w]), float(cost_8.get(w, 0.0)),
                           {w: TensorOverride("int8", per_channel=True)}))
        out = outputs[w]
        if wide_ok and out:
            step = {w: TensorOverride("int16", per_channel=True), out: TensorOverride("uint16")}
            cost = float(np.nan_to_num(cost_8.get(w, 0.0)) + np.nan_to_num(cost_16.get(w, 0.0))
                         + act_cost.get(out, 0.0))
            # Ranked as the jump from int4 (it makes the int8 step redundant); its gain after an int8
            # step is the rest, as the prediction below counts it.
            candidates.append((f"{w}:{WIDTH_TYPES[16]}", float(noise[4][w] - noise[16][w]), cost, step))
    return candidates


def _greedy_steps(candidates: list[tuple], noise: dict, level: float):
    """The candidates by gain per cost, re-ranked as steps are taken, from a plan whose noise power is `level`:
    (labels, predicted output SNR of each prefix, each step's overrides)."""
    costs = np.array([c[2] for c in candidates], dtype=float)
    costs = np.nan_to_num(costs, nan=float(np.nanmedian(costs)) if np.isfinite(costs).any() else 1.0)
    positive = costs[costs > 0]
    floor = max(float(positive.min()) if positive.size else 1e-6, 1e-6)
    pending = {c[0]: [c[1], max(float(cost), floor), c[3]] for c, cost in zip(candidates, costs)}
    order, steps, predicted = [], [], []
    # Shares measured one at a time overstate what they remove from a plan whose outputs are already
    # swamped (int4 everywhere): the prediction scales them to remove at most the base's noise.
    total = sum(max(c[1], 0.0) for c in candidates)
    shrink = min(1.0, 0.99 * level / total) if total > 0 else 1.0
    # Greedy, re-ranked as steps are taken: after a weight's int8 step its int16 step only removes the
    # rest (int8 noise less int16 noise); an int16 step taken first makes the int8 step redundant.
    while pending:
        label = max(pending, key=lambda k: (pending[k][0] / pending[k][1], -len(order)))
        gain, _, overrides = pending.pop(label)
        if gain <= 0:
            break
        tensor, _, kind = label.partition(":")
        if kind == "int8" and f"{tensor}:int16" in pending:
            pending[f"{tensor}:int16"][0] = float(noise[8][tensor] - noise[16][tensor])
        elif kind == "int16":
            pending.pop(f"{tensor}:int8", None)
        order.append(label)
        steps.append(overrides)
        level = remaining_noise(level, shrink * gain, 1e-12)
        predicted.append(snr_db(level))
    return order, predicted, steps


def cached_weight_isolation(study: Study, samples: int, progress=None, cancel=None) -> pd.DataFrame:
    """`weight_isolation` on the first calibration samples, computed once per study and sample count."""
    from ..sensitivity.weight_isolation import weight_isolation

    n = max(1, min(8, samples))
    path = study.folder / "sensitivity" / f"weight-isolation-{n}.csv"
    if path.exists():
        return pd.read_csv(path).set_index("tensor")
    frame = weight_isolation(study.quantizer.float_path, study.graph, study.calibration.head(n),
                             progress=progress, cancel=cancel)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    frame.to_csv(tmp, index=False)
    tmp.replace(path)
    return frame.set_index("tensor")


def mixed_base(graph, htp_arch=None) -> PrecisionPlan:
    """The plan a mixed weight search starts from: 8-bit activations, int8 per-channel weights, and int4
    per-channel on every weight of a Conv, ConvTranspose, MatMul or Gemm."""
    from ..plan import TensorOverride
    from ..sensitivity.weight_isolation import matrix_weights

    base = PrecisionPlan.a8w8_pc()
    return base.with_overrides({w: TensorOverride("int4", per_channel=True) for w in matrix_weights(graph)},
                               name="a8w4-pc")


def apply_steps(base: PrecisionPlan, steps, name: str = "") -> PrecisionPlan:
    """`base` with the overrides of `steps` (a list of {tensor: TensorOverride}) applied in order; a tensor
    keeps the widest type any step gives it."""
    from ..qdq import INTEGER_TYPES

    bits = {n: b for n, b, _ in INTEGER_TYPES.values()}
    merged: dict = {}
    for step in steps:
        for tensor, override in step.items():
            old = merged.get(tensor)
            if old is None or bits.get(override.type, 0) >= bits.get(old.type, 0):
                merged[tensor] = override
    return base.with_overrides(merged, name=name)


def _op_output(graph, weight: str) -> str | None:
    """The activation to promote with a 16-bit `weight`: its op's output, or the Relu/Clip ORT folds into it."""
    info = graph.tensors.get(weight)
    if info is None or not info.consumers:
        return None
    node = graph.nodes[info.consumers[0]]
    out = graph.tensors.get(node.outputs[0]) if node.outputs else None
    if out is None:
        return None
    after = folded_activation(graph, out.name)
    if after is not None:
        if after.outputs and after.outputs[0] in graph.tensors:
            return after.outputs[0]
    return out.name if out.is_activation and out.quantizable else None
