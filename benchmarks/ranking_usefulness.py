"""Sections (c) and (d) of benchmarks/sensitivity.py: what the ranking buys, measured where it is used.

The ranking is judged against the plan the search and the studio start from, not against all-8-bit with
per-tensor weights: per-channel int8 weights where they win (`mpstudio.search.weights.base_plan`, the decision
`--weights auto` makes, by the weights' scores and by measurement), the sensitivity analysis of that base
(`Study.sensitivity(plan=base)`, what the search computes) and the order the search walks
(`search.promotion_order`: the noise a promotion alone surely removes, a lower bound over the isolation
samples, per estimated latency cost; then the promotions that help on average only, the tensors seen only from
all-16-bit, and those the analysis did not isolate). Plan
top-k promotes the first k of that order on the base; random-k promotes k tensors drawn (seeded) from the same
tensors.

(c) The task metric of the study (ORT's CPU run of the real QDQ model over every evaluation sample, as
    `Study.evaluate` stores it) for top-k against the mean of `DRAWS` random draws per k.
    Targets: at no k is top-k worse than the random draws' mean beyond the samples' noise, and over every k
    together it is better beyond it (`gap_to_random`: a paired bootstrap over the evaluation samples, the gap
    averaged over the ks; beyond noise when its 95 % interval excludes zero and it is at least one step of a
    counted metric, a character of CER). A gap within noise at one k is printed as such: on 100 text lines one
    k's gap of a few characters cannot be told from the draws' own spread. A metric without per-sample terms:
    top-k better than the random mean at every k.
(d) The same plans (the base, its all-16-bit counterpart, top-k and random-k's draws) on the QNN HTP backend
    (emulated on x86_64) over the first `--htp-samples` evaluation samples: output SNR against the float model
    and the study's task metric (from its per-sample terms; recall@k has none on part of its samples) on the HTP
    and on ORT's CPU (the same QDQ model, the same samples).
    Targets: (c)'s, on the HTP, on the task metric (what the search confirms a plan on; the output SNR where the
    metric has no terms); the HTP orders alike at least 90 % of the
    plan pairs the CPU separates beyond its sampling noise (the pair's CPU difference, by a paired bootstrap over
    the samples, seeded, has a 95 % interval that excludes zero). Spearman over all the plans is printed beside it:
    plans the CPU cannot tell apart (random draws within a few tenths of a dB) are ordered by noise on either
    backend, and two CPU numerics that differ only in the rounding of the input order them no more alike.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np

DRAWS = 3
BOOTSTRAPS = 2000
SEPARATED_AGREEMENT = 0.9  # of the pairs the CPU separates, the share the HTP must order the same way


@dataclass
class _Baselines:
    """What `weights.base_plan` reads of a search's walk: the study, its baselines, and how it evaluates."""

    study: object
    cancel: object = None

    def __post_init__(self):
        from mpstudio.search import named_baselines

        self.hib = self.study.higher_is_better
        named = named_baselines()
        self.baselines = {name: self.study.evaluate(named[name], origin="baseline") for name in ("a8w8", "a16w8")}

    def evaluate(self, plans):
        return [self.study.evaluate(plan, origin="baseline") for plan in plans]


def base_of(study):
    """The base plan `--weights auto` starts from on this study, and why (in words)."""
    from mpstudio.search.weights import base_plan

    base, _, why = base_plan(_Baselines(study), "auto")
    return base, why


def base_and_order(study, samples: int = 32, isolation_samples: int = 8):
    """The base plan `--weights auto` starts from, why, its all-16-bit counterpart and the promotion order."""
    from mpstudio.plan import PrecisionPlan
    from mpstudio.search import promotion_order

    base, why = base_of(study)
    analysed = None if base.hash == PrecisionPlan.a8w8().hash else base
    report = study.sensitivity(samples=samples, isolation_samples=isolation_samples, plan=analysed)
    order, _ = promotion_order(study, report, base)
    top = PrecisionPlan(activation_type="uint16", weight_type=base.weight_type, per_channel=base.per_channel,
                        name="all-16-bit of the base")
    return base, why, top, order


def plans_for(base, order: list[str], ks: list[int]):
    pool = sorted(order)  # the draws do not depend on the order
    top = {k: base.promote(order[:k], name=f"top-{k}") for k in ks}
    drawn = {k: [base.promote(random.Random(100 + r).sample(pool, k), name=f"random-{k}.{r}") for r in range(DRAWS)]
             for k in ks}
    return top, drawn


def judge(study, label: str, ks: list[int], htp_samples: int, htp_agreement) -> list[str]:
    """Sections (c) and (d) on one study; returns the targets missed."""
    base, why, all_16, order = base_and_order(study)
    ks = [k for k in ks if k < len(order)]
    top, drawn = plans_for(base, order, ks)

    def evaluated(plan):
        return study.evaluate(plan, origin="benchmark")

    print(f"[{label}] base: {why}; {len(order)} tensors in the order; metric {study.metric_name} on "
          f"{len(study.evaluation_data)} samples: base {evaluated(base).value:.4f}, all-16-bit "
          f"{evaluated(all_16).value:.4f}")
    groups, compared = {}, {}
    for k in ks:
        results = {p.name: evaluated(p) for p in [top[k], *drawn[k]]}
        randoms = [results[p.name].value for p in drawn[k]]
        groups[k] = [study.terms(p, results[p.name].accuracy_source) for p in [top[k], *drawn[k]]]
        compared[k] = _compared(results[top[k].name].value, float(np.mean(randoms)), groups[k],
                                study.higher_is_better)
        print(f"    (c) k={k:<3} top-k {results[top[k].name].value:.4f}   random k: mean {np.mean(randoms):.4f} "
              f"({', '.join(f'{v:.4f}' for v in randoms)})   {_verdict_line(*compared[k])}")
    failures = _judged(groups, compared, study.higher_is_better, f"[{label}] (c)", study.metric_name, "    (c)")
    if htp_samples <= 0:
        return failures
    plans = [base, all_16] + [p for k in ks for p in [top[k], *drawn[k]]]
    names = [o.name for o in study.prepared.model.graph.output]
    agreement = htp_agreement(study.quantizer, plans, study.evaluation_data.head(htp_samples), names,
                              _task_terms(study))
    if agreement is None:
        return failures + [f"[{label}] (d) the QNN HTP backend is not available"]
    htp, cpu = dict(zip(agreement["plan"], agreement["htp"])), dict(zip(agreement["plan"], agreement["cpu"]))
    from scipy.stats import spearmanr

    rho = float(spearmanr([cpu[p.name] for p in plans], [htp[p.name] for p in plans]).statistic)
    pairs = separated_pairs(agreement.attrs["terms"], [p.name for p in plans])
    agreeing = [pair for pair in pairs if pair[4]]
    share = len(agreeing) / len(pairs) if pairs else float("nan")
    print(f"    (d) output SNR (dB) over {htp_samples} samples, {len(plans)} plans; the HTP orders alike "
          f"{len(agreeing)} of the {len(pairs)} plan pairs the CPU separates beyond its sampling noise ({share:.0%}, "
          f"target >= {SEPARATED_AGREEMENT:.0%}); Spearman over all {len(plans)} plans {rho:.3f} (near-ties included)")
    for a, b, cpu_gap, htp_gap, _ in (pair for pair in pairs if not pair[4]):
        print(f"        ordered otherwise: {a} - {b}: CPU {cpu_gap:+.3f} dB, HTP {htp_gap:+.3f} dB")
    print("\n".join("        " + line for line in
                     agreement.to_string(index=False, float_format=lambda v: f"{v:.4f}").splitlines()))
    failures += _htp_top_k(agreement, label, study, ks, drawn)
    if not (pairs and share >= SEPARATED_AGREEMENT):
        failures.append(f"[{label}] (d) CPU vs HTP order of the plans the CPU separates ({len(agreeing)} of "
                        f"{len(pairs)})")
    return failures


def _task_terms(study):
    """Outputs and the float model's outputs of the first evaluation samples -> the study's task metric terms on
    them (None where the metric has no per-sample terms on part of the samples, e.g. recall@k)."""
    from mpstudio.metric_terms import metric_terms

    def terms(outputs, references):
        return metric_terms(study.metric_spec, study.prepared, outputs, references, list(range(len(outputs))))
    return terms


def _htp_top_k(agreement, label: str, study, ks: list[int], drawn: dict) -> list[str]:
    """(d)'s top-k against random k on the HTP: judged on the study's task metric computed from the HTP's outputs
    (what the search confirms a plan on), on the output SNR where the metric has no per-sample terms."""
    from mpstudio.metric_terms import MetricTerms

    task = "htp_task" in agreement
    suffix, what = ("_task", study.metric_name) if task else ("", "output SNR, dB")
    better_up = study.higher_is_better or not task
    if task:
        terms = agreement.attrs["task_terms"]
    else:
        terms = {key: MetricTerms("snr", ("signal", "noise"), powers) for key, powers in agreement.attrs["terms"].items()}
    htp = dict(zip(agreement["plan"], agreement["htp" + suffix]))
    cpu = dict(zip(agreement["plan"], agreement["cpu" + suffix]))
    print(f"        top-k against random k on the HTP, judged on {what}{' (task columns)' if task else ''}:")
    groups, compared = {}, {}
    for k in ks:
        groups[k] = [terms[(name, "htp")] for name in [f"top-{k}"] + [p.name for p in drawn[k]]]
        randoms = float(np.mean([htp[p.name] for p in drawn[k]]))
        compared[k] = _compared(htp[f"top-{k}"], randoms, groups[k], better_up)
        print(f"        k={k:<3} HTP top-k {htp[f'top-{k}']:.4f}   random k: mean {randoms:.4f}   CPU top-k "
              f"{cpu[f'top-{k}']:.4f} random mean {np.mean([cpu[p.name] for p in drawn[k]]):.4f}   "
              f"{_verdict_line(*compared[k])}")
    return _judged(groups, compared, better_up, f"[{label}] (d)", f"{what} on the HTP", "       ")


def gap_to_random(groups: list[list], higher_is_better: bool, seed: int = 0) -> tuple[float, float, float, str]:
    """Top-k's value minus the mean of its random draws' values, averaged over `groups` (per k: [top-k's terms,
    each draw's terms], `metric_terms.MetricTerms` on the same samples), with a paired bootstrap's 95 % interval
    (the same resampled samples for every plan, `BOOTSTRAPS` times from `seed`) and the verdict the project gives
    any paired difference (`loop.uncertainty.difference_verdict`): "better" or "worse" when the interval
    excludes zero and the gap is at least one step of a counted metric (a character of CER), "within noise"
    otherwise."""
    from mpstudio.loop.uncertainty import difference_verdict

    count = groups[0][0].units
    rows = np.random.default_rng(seed).integers(0, count, size=(BOOTSTRAPS, count))

    def gap(chosen=None):
        def value(terms):
            return terms.combine((terms.columns if chosen is None else terms.columns[chosen]).sum(axis=-2))
        return np.mean([value(top) - np.mean([value(r) for r in randoms], axis=0) for top, *randoms in groups], axis=0)
    point = float(gap())
    low, high = (float(v) for v in np.percentile(gap(rows), [2.5, 97.5]))
    return point, low, high, difference_verdict(point, low, high, higher_is_better, groups[0][0].resolution)


def _compared(mine: float, random_mean: float, group: list, higher_is_better: bool) -> tuple[bool, tuple | None]:
    """One k: whether top-k's value is better than the draws' mean, and `gap_to_random` of its group (None when a
    plan has no per-sample terms)."""
    wins = mine != random_mean and (mine > random_mean) == higher_is_better
    return wins, None if any(t is None for t in group) else gap_to_random([group], higher_is_better)


def _verdict_line(wins: bool, gap: tuple | None) -> str:
    """The point comparison, and where the samples' terms allow, the paired interval of the gap."""
    if gap is None:
        return "top-k better" if wins else "TOP-K NOT BETTER"
    point, low, high, verdict = gap
    return (f"{'top-k better' if wins else 'top-k not better'}; gap {point:+.4f} [{low:+.4f}, {high:+.4f}]: "
            f"{verdict.upper() if verdict == 'worse' else verdict}")


def _judged(groups: dict, compared: dict, higher_is_better: bool, prefix: str, what: str, indent: str) -> list[str]:
    """The targets missed: a k where top-k is worse than the random draws' mean beyond the samples' noise, and the
    gap over every k together not better beyond noise. Without per-sample terms: a k where top-k is not better."""
    if any(gap is None for _, gap in compared.values()):
        return [f"{prefix} top-{k} vs random on {what}" for k, (wins, _) in compared.items() if not wins]
    failures = [f"{prefix} top-{k} vs random on {what}: worse beyond noise" for k, (_, gap) in compared.items()
                if gap[3] == "worse"]
    point, low, high, verdict = gap_to_random(list(groups.values()), higher_is_better)
    print(f"{indent} every k together: gap {point:+.4f} [{low:+.4f}, {high:+.4f}]: {verdict}")
    if verdict != "better":
        failures.append(f"{prefix} top-k vs random on {what}, every k together: {verdict}")
    return failures


def separated_pairs(terms: dict, names: list[str], seed: int = 0) -> list[tuple[str, str, float, float, bool]]:
    """The plan pairs whose CPU output SNR differs beyond its sampling noise: (a, b, CPU a - b, HTP a - b, whether
    the HTP orders them the same way). `terms[(plan, backend)]`: per-sample (signal, noise) powers; the difference
    of two plans is resampled over the same samples (paired), `BOOTSTRAPS` times from `seed`."""
    count = len(terms[(names[0], "cpu")])
    draws = np.random.default_rng(seed).integers(0, count, size=(BOOTSTRAPS, count))

    def snr(powers, rows=None):
        chosen = powers if rows is None else powers[rows]
        return 10.0 * np.log10(chosen[..., 0].sum(-1) / np.maximum(chosen[..., 1].sum(-1), 1e-30))
    resampled = {name: snr(terms[(name, "cpu")], draws) for name in names}
    pairs = []
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            low, high = np.percentile(resampled[a] - resampled[b], [2.5, 97.5])
            if low > 0 or high < 0:
                cpu_gap = float(snr(terms[(a, "cpu")]) - snr(terms[(b, "cpu")]))
                htp_gap = float(snr(terms[(a, "htp")]) - snr(terms[(b, "htp")]))
                pairs.append((a, b, cpu_gap, htp_gap, cpu_gap * htp_gap > 0))
    return pairs
