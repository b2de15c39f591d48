"""The ranking of activation tensors, regions from namespaces / selections / QNN rules, and predictions of
what promoting a set of tensors will give before anything is run."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np
import pandas as pd

from ..errors import MpstudioError
from ..graph import ModelGraph
from ..noise import is_output_snr, noise_power, remaining_noise, snr_db
from ..plan import PrecisionPlan
from ..quantize import qnn_config
from ..quantize import SIXTEEN_BIT
from ..value_text import value_text
from .isolation import IsolationResult, Region

# Columns of `rank_tensors` (one row per activation tensor, best candidate for promotion first):
#   rank (1 = promote first), tensor, kind, op, node, namespace, matched, snr_db, cosine, mse, max_abs,
#   local_snr_8, local_snr_16, isolation_gain (metric gain when only this tensor goes to 16 bits, positive =
#   better), isolation_loss (metric loss when only this tensor stays at 8 bits in the all-16-bit plan),
#   passes_snr (snr_db > 30 dB), passes_cosine (cosine > 0.995).
RANKING_COLUMNS = ["rank", "tensor", "kind", "op", "node", "namespace", "matched", "snr_db", "cosine", "mse",
                   "max_abs", "local_snr_8", "local_snr_16", "isolation_gain", "isolation_loss", "passes_snr",
                   "passes_cosine"]


def rank_tensors(tensor_scores: pd.DataFrame, isolation: IsolationResult | None = None,
                 priority: pd.Series | None = None) -> pd.DataFrame:
    """Order tensors by what promoting them buys: isolation gain first (it measures the output metric),
    then the loss of leaving them at 8 bits among 16-bit neighbours, then the local 8-bit SNR (lowest first).
    Tensors without an isolation score follow the isolated ones, by `priority` (tensor -> a cheaper estimate
    of the gain, highest first; e.g. the gain screened on fewer samples) when given."""
    frame = tensor_scores.copy()
    frame["isolation_gain"] = np.nan
    frame["isolation_loss"] = np.nan
    if isolation is not None:
        per_tensor = isolation.per_tensor()
        frame["isolation_gain"] = frame["tensor"].map(per_tensor["promoted_gain"])
        frame["isolation_loss"] = frame["tensor"].map(per_tensor["demoted_loss"])
    estimate = frame["tensor"].map(priority) if priority is not None else pd.Series(np.nan, index=frame.index)
    order = frame.assign(
        _scored=frame["isolation_gain"].notna(),
        _gain=frame["isolation_gain"].fillna(-np.inf),
        _loss=frame["isolation_loss"].fillna(-np.inf),
        _estimate=estimate.astype(float).fillna(-np.inf),
        _local=frame["local_snr_8"].fillna(np.inf),
    ).sort_values(["_scored", "_gain", "_loss", "_estimate", "_local"], ascending=[False, False, False, False, True],
                  kind="stable")
    order = order.drop(columns=["_scored", "_gain", "_loss", "_estimate", "_local"]).reset_index(drop=True)
    order["rank"] = np.arange(1, len(order) + 1)
    return order[RANKING_COLUMNS]


def namespace_regions(graph: ModelGraph, tensors: Iterable[str], min_tensors: int = 2) -> list[Region]:
    """One region per ONNX namespace: the activation tensors its nodes produce (among `tensors`)."""
    allowed = set(tensors)
    regions = []
    for namespace, nodes in sorted(graph.namespaces().items()):
        if not namespace:
            continue
        members = [o for n in nodes for o in graph.nodes[n].outputs if o in allowed]
        if len(members) >= min_tensors:
            regions.append(Region(namespace, tuple(dict.fromkeys(members)), "namespace"))
    return regions


def selection_region(graph: ModelGraph, tensors: Sequence[str], name: str = "selection") -> Region:
    """A user's selection; unknown names are an error with suggestions."""
    for t in tensors:
        graph.tensor(t)
    if not tensors:
        raise MpstudioError("the selection is empty; select at least one activation tensor")
    return Region(name, tuple(tensors), "selection")


def qnn_region(model, graph: ModelGraph, tensor: str) -> Region:
    """`tensor` plus every activation ORT's `get_qnn_qdq_config` makes 16-bit (or converts) with it."""
    plan = PrecisionPlan.a8w8().promote([tensor])
    overrides = qnn_config(model, graph, plan).extra_options.get("TensorQuantOverrides", {})
    members = [tensor]
    for name, entries in overrides.items():
        info = graph.tensors.get(name)
        if info is None or not info.is_activation or name == tensor:
            continue
        entry = entries[0] if entries else {}
        if entry.get("quant_type") in SIXTEEN_BIT or (entry.get("convert") or {}).get("quant_type") in SIXTEEN_BIT:
            members.append(name)
    return Region(f"qnn:{tensor}", tuple(members), "qnn")


@dataclass(frozen=True)
class Prediction:
    """What promoting `tensors` from the all-8-bit plan is expected to give, from isolation scores alone."""

    tensors: tuple[str, ...]
    metric: str
    higher_is_better: bool
    all_8: float
    all_16: float
    predicted: float
    method: str


def predict(isolation: IsolationResult, tensors: Sequence[str]) -> Prediction:
    """Predict the output metric of the all-8-bit plan with `tensors` at 16 bits.

    For output SNR, noise powers add: each tensor's isolation gain is turned into the noise power it
    removes, the removals are summed, and the result is floored at the all-16-bit noise (or the lowest
    single-promotion noise, when sampling made one of them lower). For a task metric,
    gains are summed and the result is bounded by the all-16-bit value (or the best single promotion).
    """
    per_tensor = isolation.per_tensor()
    missing = [t for t in tensors if t not in per_tensor.index]
    if missing:
        raise MpstudioError(
            f"no isolation score for {missing[:5]}{' ...' if len(missing) > 5 else ''}; score these tensors first "
            "(a progressive analysis isolates only the tensors that can change the top of the ranking: analyze "
            "with exhaustive=True, `mpstudio analyze --exhaustive`, to isolate every activation tensor)"
        )
    promoted = per_tensor.loc[list(tensors), "promoted"].astype(float).to_numpy()
    if is_output_snr(isolation.metric):
        noise_8 = noise_power(isolation.all_8)
        noise_promoted = noise_power(promoted)
        # The floor: all-16-bit noise, or less if one promotion alone measured lower (sampling noise).
        floor = min(noise_power(isolation.all_16), float(noise_promoted.min()) if len(promoted) else np.inf)
        removed = float(np.sum(noise_8 - noise_promoted))
        noise = remaining_noise(noise_8, removed, floor, 1e-30)
        value, method = snr_db(noise), "additive noise power"
    else:
        sign = 1.0 if isolation.higher_is_better else -1.0
        gains = sign * (promoted - isolation.all_8)
        value = isolation.all_8 + sign * float(np.sum(gains))
        candidates = [isolation.all_16, *promoted]
        bound = max(candidates) if isolation.higher_is_better else min(candidates)
        value = min(value, bound) if isolation.higher_is_better else max(value, bound)
        method = "additive metric gain"
    return Prediction(tuple(tensors), isolation.metric, isolation.higher_is_better, isolation.all_8,
                      isolation.all_16, value, method)


@dataclass(frozen=True)
class PredictionCheck:
    """A prediction next to the value measured on the regenerated QDQ model."""

    prediction: Prediction
    measured: float

    @property
    def error(self) -> float:
        return self.measured - self.prediction.predicted

    def describe(self) -> str:
        p = self.prediction
        return (f"{len(p.tensors)} tensors to 16 bits: predicted {p.metric} {value_text(p.predicted)}, measured "
                f"{value_text(self.measured)} (all-8-bit {value_text(p.all_8)}, all-16-bit {value_text(p.all_16)})")
