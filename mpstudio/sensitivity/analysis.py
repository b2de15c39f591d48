"""One sensitivity analysis of a model: scores, isolation, ranking; stored as CSV + JSON in a folder."""

from __future__ import annotations

import html
import json
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import pandas as pd

from ..blas_threads import with_one_blas_thread
from ..data import DataSource, Progress, TaskMetric
from ..errors import MpstudioError
from ..metrics import output_note
from ..runtime import available_cores
from ..plan import PrecisionPlan
from ..quantize import Quantizer
from .. import qdq
from ..value_text import value_text
from .isolation import (ISOLATION_COLUMNS, IsolationResult, OutputScorer, Region, SwitchableModel, float_references,
                        float_qdq_session, isolation_scores, own_params, tensor_regions, plan_ends)
from .ranking import PredictionCheck, Prediction, namespace_regions, predict, rank_tensors, selection_region
from .scores import tensor_scores, weight_scores
from .stats import COSINE_THRESHOLD, SNR_THRESHOLD_DB

REPORT_FORMAT = 1


@dataclass(frozen=True)
class SensitivityReport:
    """Everything one analysis found. Tables are DataFrames with the columns documented in `scores`,
    `isolation` and `ranking`; `meta` holds the baselines, sample counts, plan and model identity."""

    ranking: pd.DataFrame
    tensors: pd.DataFrame
    weights: pd.DataFrame
    isolation: IsolationResult | None
    meta: dict = field(default_factory=dict)

    def top(self, k: int = 20) -> pd.DataFrame:
        return self.ranking.head(k)

    @property
    def partial(self) -> bool:
        """True for a report handed out while the analysis still runs (`progressive.analyze_progressive`)."""
        return bool(self.meta.get("partial", False))

    def status(self) -> str:
        """How far the analysis behind this report got, in a few words ("" for a complete exhaustive one), and
        the calibration's warning when there is one."""
        notes = (self.meta.get("range_note") or "", self.meta.get("output_note") or "")
        return "; ".join(part for part in (self._progress(), *notes) if part)

    def _progress(self) -> str:
        meta = self.meta
        tensors = meta.get("tensors", "?")
        stage = meta.get("stage")
        if not self.partial:
            if meta.get("mode") == "progressive" and self.isolation is not None:
                isolated = int((self.isolation.scores["source"] == "tensor").sum())
                return (f"isolation of {isolated}/{tensors} tensors that can change a decision; the rest screened "
                        f"on {meta.get('screen_samples', '?')} of {self.isolation.samples} samples")
            return ""
        if stage == "scores":
            return f"cheap scores, {meta.get('scored_samples', 0)}/{meta.get('samples', '?')} samples"
        if stage == "screening":
            return f"cheap scores; screening {meta.get('screened', 0)}/{tensors}"
        if stage == "isolation":
            return f"cheap scores; isolation {meta.get('isolated', 0)}/{tensors}"
        return "partial"

    def predict(self, tensors: Sequence[str]) -> Prediction:
        if self.isolation is None:
            raise MpstudioError("this analysis has no isolation scores; run it with isolation enabled to predict")
        return predict(self.isolation, tensors)

    # ---- storage --------------------------------------------------------------------------------------------
    def save(self, folder: str | Path) -> Path:
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        self.ranking.to_csv(folder / "ranking.csv", index=False)
        self.tensors.to_csv(folder / "tensors.csv", index=False)
        self.weights.to_csv(folder / "weights.csv", index=False)
        meta = {"format": REPORT_FORMAT, **self.meta}
        if self.isolation is not None:
            self.isolation.scores.to_csv(folder / "isolation.csv", index=False)
            terms_path = folder / "isolation_terms.csv"  # optional: reports saved before have none
            if self.isolation.terms is not None:
                self.isolation.terms.to_csv(terms_path, index=False)
            elif terms_path.exists():
                terms_path.unlink()
            meta["isolation"] = {"metric": self.isolation.metric, "higher_is_better": self.isolation.higher_is_better,
                                 "all_8": self.isolation.all_8, "all_16": self.isolation.all_16,
                                 "samples": self.isolation.samples}
        (folder / "report.json").write_text(json.dumps(meta, indent=2, default=str) + "\n")
        (folder / "report.html").write_text(self.html())
        return folder

    @classmethod
    def load(cls, folder: str | Path) -> "SensitivityReport":
        folder = Path(folder)
        meta_path = folder / "report.json"
        if not meta_path.is_file():
            raise MpstudioError(f"no sensitivity report in {folder} (report.json is missing); run `mpstudio analyze`")
        meta = json.loads(meta_path.read_text())
        if meta.get("format") != REPORT_FORMAT:
            raise MpstudioError(f"sensitivity report format {meta.get('format')!r} is not supported; re-run the analysis")
        read = lambda name: pd.read_csv(folder / name, keep_default_na=True)  # noqa: E731
        isolation = None
        iso_meta = meta.pop("isolation", None)
        if iso_meta is not None:
            scores = read("isolation.csv").reindex(columns=ISOLATION_COLUMNS)
            scores["members"] = scores["members"].fillna("").astype(str)
            terms_path = folder / "isolation_terms.csv"
            terms = (pd.read_csv(terms_path, dtype={"region": str, "side": str}, keep_default_na=False)
                     if terms_path.is_file() else None)
            isolation = IsolationResult(scores, iso_meta["metric"], iso_meta["higher_is_better"], iso_meta["all_8"],
                                        iso_meta["all_16"], iso_meta["samples"], terms)
        meta.pop("format", None)
        ranking = read("ranking.csv")
        for column in ("op", "node", "namespace"):
            ranking[column] = ranking[column].fillna("").astype(str)
        return cls(ranking, read("tensors.csv"), read("weights.csv"), isolation, meta)

    # ---- presentation ---------------------------------------------------------------------------------------
    def summary(self, k: int = 15, *, notes: bool = True) -> str:
        """The analysis in a few lines and the top `k` of its ranking; with `notes`, then the calibration's warnings
        (activations under QNN's minimum range, which score near 0 dB; no float output left to score)."""
        lines = []
        iso = self.isolation
        if iso is not None:
            lines.append(f"{iso.metric} on {iso.samples} samples: all-8-bit {value_text(iso.all_8)}, "
                         f"all-16-bit {value_text(iso.all_16)}")
        scored = self.tensors[self.tensors["matched"].astype(bool)]
        lines.append(f"{int((~scored['passes_snr'].astype(bool)).sum())} of {len(scored)} matched activation "
                     f"tensors below {SNR_THRESHOLD_DB:.0f} dB accumulated SNR; "
                     f"{int((~scored['passes_cosine'].astype(bool)).sum())} below cosine {COSINE_THRESHOLD}; "
                     f"{len(self.tensors) - len(scored)} without a QDQ counterpart")
        if len(self.weights):
            worst = self.weights.sort_values("snr_pt_8").head(1).iloc[0]
            median_gain = float(self.weights["per_channel_gain_8"].median())
            lines.append(f"weights: lowest per-tensor 8-bit SNR {worst['snr_pt_8']:.1f} dB ({worst['tensor']}); "
                         f"per-channel int8 gains a median {median_gain:.1f} dB")
        columns = ["rank", "tensor", "op", "snr_db", "cosine", "local_snr_8", "local_snr_16", "isolation_gain"]
        lines.append(self.ranking.head(k)[columns].to_string(index=False, float_format=lambda v: f"{v:.3f}"))
        if notes:
            lines += [note for note in (self.meta.get("range_note"), self.meta.get("output_note")) if note]
        return "\n".join(lines)

    def html(self, k: int = 50) -> str:
        """A self-contained HTML report (no scripts, no external files)."""
        def table(frame: pd.DataFrame) -> str:
            return frame.to_html(index=False, float_format=lambda v: f"{v:.4g}", na_rep="", border=0, classes="t")

        meta_rows = "".join(f"<tr><th>{html.escape(str(k))}</th><td>{html.escape(str(v))}</td></tr>"
                            for k, v in self.meta.items())
        parts = [
            "<!doctype html><html><head><meta charset='utf-8'><title>mpstudio sensitivity report</title><style>",
            "body{font-family:sans-serif;margin:2em} table.t{border-collapse:collapse;font-size:12px}",
            "table.t td,table.t th{padding:2px 6px;border-bottom:1px solid #ddd;text-align:right}",
            "table.t td:nth-child(2){text-align:left}</style></head><body>",
            "<h1>Sensitivity report</h1>",
            f"<table>{meta_rows}</table>",
            f"<pre>{html.escape(self.summary(0, notes=False))}</pre>",
            f"<h2>Ranking (top {k})</h2>", table(self.ranking.head(k)),
        ]
        if self.isolation is not None:
            regions = self.isolation.scores[self.isolation.scores["source"] != "tensor"]
            if len(regions):
                parts += ["<h2>Regions</h2>", table(regions.drop(columns=["members"])
                                                    .sort_values("promoted_gain", ascending=False))]
        parts += ["<h2>Weights</h2>", table(self.weights.sort_values("snr_pt_8")), "</body></html>"]
        return "\n".join(parts)


@with_one_blas_thread
def analyze(
    quantizer: Quantizer,
    data: DataSource,
    plan: PrecisionPlan | None = None,
    *,
    isolation: bool = True,
    isolation_data: DataSource | None = None,
    isolation_samples: int = 8,
    metric: TaskMetric | None = None,
    namespaces: bool = True,
    selection: Sequence[str] = (),
    threads: int | None = None,
    progress: Progress | None = None,
    cancel: threading.Event | None = None,
) -> SensitivityReport:
    """Score every tensor of `quantizer`'s model for `plan` (default all 8 bits) and rank them.

    Accumulated and local errors stream over `data`. Isolation scores run on `isolation_data` (default the
    first `isolation_samples` of `data`) with `metric` (default output SNR against the float model; a task
    metric must match `isolation_data` sample for sample).
    """
    plan = plan or PrecisionPlan.a8w8()
    graph = quantizer.graph
    end_8, end_16 = plan_ends(plan)  # isolation switches between these, with the plan's weights
    model_8 = qdq.load(quantizer.generate(end_8, progress, cancel))  # read here and by isolation
    model_16 = quantizer.generate(end_16, progress, cancel)
    model_plan = quantizer.generate(plan, progress, cancel)
    params_8 = {t: q.encoding for t, q in qdq.read(model_8).activations().items()}
    params_16 = {t: q.encoding for t, q in qdq.read(model_16).activations().items()}
    tensors = tensor_scores(quantizer.float_path, model_plan, graph, data, params_8, params_16, progress, cancel,
                            local_model=quantizer.calibration_model(PrecisionPlan.a8w8()))
    weights = weight_scores(quantizer.prepared.model, graph, progress, cancel)
    result = None
    if isolation:
        iso_data = isolation_data if isolation_data is not None else data.head(isolation_samples)
        switchable = SwitchableModel(model_8, params_16, threads=threads or available_cores(),
                                     float_model=quantizer.prepared.model, graph=graph,
                                     own_params=own_params(quantizer, plan), qdq_model_16=model_16)
        references = float_references(quantizer.float_path, iso_data, switchable.output_names)
        scorer = OutputScorer(references, switchable.output_names, metric)
        regions: list[Region] = tensor_regions(switchable.tensors)
        if namespaces:
            regions += namespace_regions(graph, switchable.tensors)
        if selection:
            regions.append(selection_region(graph, list(selection)))
        result = isolation_scores(switchable, iso_data, regions, scorer, True, progress, cancel)
    ranking = rank_tensors(tensors, result)
    meta = {"model": quantizer.prepared.source, "model_sha256": quantizer.prepared.sha256, "plan": plan.summary(),
            "plan_hash": plan.hash, "samples": len(data), "data": data.name, "range_note": quantizer.range_note(plan),
            "output_note": output_note(quantizer.prepared.outputs)}
    return SensitivityReport(ranking, tensors, weights, result, meta)


def check_prediction(quantizer: Quantizer, report: SensitivityReport, tensors: Sequence[str],
                     isolation_data: DataSource, metric: TaskMetric | None = None,
                     progress: Progress | None = None, cancel: threading.Event | None = None) -> PredictionCheck:
    """Predict, then regenerate the real QDQ model promoting `tensors` and measure it on the same samples, with
    the isolation scores' numerics (`isolation.float_qdq_session`)."""
    prediction = report.predict(tensors)
    path = quantizer.generate(PrecisionPlan.a8w8().promote(tensors), progress, cancel)
    session = float_qdq_session(path)
    names = [o.name for o in session.get_outputs()]
    references = float_references(quantizer.float_path, isolation_data, names)
    scorer = OutputScorer(references, names, metric)
    outputs = [session.run(names, feed) for feed in isolation_data.feeds()]
    return PredictionCheck(prediction, scorer.score(outputs))

