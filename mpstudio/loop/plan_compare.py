"""Two plans side by side: the activation tensors whose precision differs, the 8<->16-bit converts each runs and
their estimated cost, each plan's stored accuracy and latency with their sources, and, when both have per-sample
terms from one accuracy source, B minus A on the same samples with its paired interval."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from .uncertainty import PairedDifference

# Columns of `PlanComparison.tensors`: tensor, namespace, bits_a, bits_b (activation bits in each plan)
DIFF_COLUMNS = ["tensor", "namespace", "bits_a", "bits_b"]
PAIRED_ROW = "B \u2212 A accuracy (paired)"
# Rows of `PlanComparison.summary` (index) for columns "a" and "b"
SUMMARY_ROWS = ["plan", "sixteen-bit activations", "converts (8<->16)", "converts ms (estimate)", "estimate ms",
                "accuracy", "accuracy source", "latency ms", "latency source", PAIRED_ROW, "paired verdict"]


@dataclass(frozen=True)
class PlanComparison:
    tensors: pd.DataFrame
    summary: pd.DataFrame
    paired: PairedDifference | None = None  # B minus A on the same samples, when both have per-sample terms
    paired_source: str = ""  # the accuracy source `paired` is from


def paired_cells(paired: PairedDifference | None, source: str) -> tuple[str, str]:
    """The summary's two paired cells for column B: the difference with its interval, and the verdict with the
    samples and source it rests on (or why there is no paired difference)."""
    if paired is None:
        return "no paired value", "needs per-sample terms of both plans from one accuracy source"
    of = f"{paired.samples} samples" if paired.samples >= paired.total else f"{paired.samples} of {paired.total}"
    return (f"{paired.difference:+.4g} [{paired.low:+.4g}, {paired.high:+.4g}] ({paired.metric})",
            f"{paired.verdict} \u00b7 {of} \u00b7 {source}")


def compare_plans(graph, plan_a, plan_b, estimate_a, estimate_b, evaluation_a=None, evaluation_b=None,
                  metric: str = "", paired: tuple[str, PairedDifference] | None = None) -> PlanComparison:
    """Compare two `PrecisionPlan`s of one model from their `latency.LatencyEstimate`s and, when stored, their
    evaluations (rows of `loop.front`'s frame, or None); `paired`: (accuracy source, B minus A there) from
    `loop.comparison.paired_from_store`, or None."""
    sixteen_a, sixteen_b = set(plan_a.sixteen_bit_activations(graph)), set(plan_b.sixteen_bit_activations(graph))
    rows = [(t, graph.nodes[graph.tensors[t].producer].namespace if graph.tensors[t].producer else "",
             16 if t in sixteen_a else 8, 16 if t in sixteen_b else 8)
            for t in graph.activations() if (t in sixteen_a) != (t in sixteen_b)]
    diff = pd.DataFrame(rows, columns=DIFF_COLUMNS)

    def column(plan, sixteen, estimate, evaluation):
        measured = evaluation is not None
        return [plan.name or plan.summary(), len(sixteen), estimate.converts, round(estimate.convert_ms, 4),
                round(estimate.ms, 4), f"{evaluation['value']:.6g}" if measured else "not evaluated",
                evaluation["accuracy_source"] if measured else "", round(float(evaluation["latency_ms"]), 4)
                if measured else float("nan"), evaluation["latency_label"] if measured else ""]
    source, difference = paired if paired is not None else ("", None)
    summary = pd.DataFrame({"a": column(plan_a, sixteen_a, estimate_a, evaluation_a) + ["", ""],
                            "b": column(plan_b, sixteen_b, estimate_b, evaluation_b)
                            + list(paired_cells(difference, source))}, index=SUMMARY_ROWS)
    if metric:  # the metric named once, in the row's label: the cells keep their room for the values
        summary = summary.rename(index={"accuracy": f"accuracy ({metric})"})
    return PlanComparison(diff, summary, difference, source)
