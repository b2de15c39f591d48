"""A study's folder on disk: its description (`study.json`), its creation from a model and data, and the count of
committed results that tells a complete store from a damaged one."""

from __future__ import annotations

import json
import math
import os
import shutil
import time
import uuid
from pathlib import Path

from ..cache import exclusive
from ..data import DataSource, NpzFolder, Progress, TaskMetric, check_feeds
from ..errors import MpstudioError
from ..metrics import MetricSpec, check_top1_axis, metric_spec
from ..model import PreparedModel, prepare_model
from ..qnn_probe import UNMOVABLE
from ..qnn_support import FALLBACK
from ..store import DB_FILE, StudyStore

STUDY_FORMAT = 1
STUDY_FILE = "study.json"
# The number of accuracy results the store has committed, written beside it: a store that holds fewer was
# damaged (e.g. its write-ahead log was deleted before it was folded in).
RESULTS_FILE = "results.count"
_CONFIG_KEYS = {"format": int, "inputs": list, "metric": dict}
# The folders a study keeps its files in (those it can remake and those it cannot): a file in the place of one is
# damage, told when the study opens rather than met as a traceback when the folder is first written.
STUDY_FOLDERS = {"cache": "cache of calibrations and generated models", "reference": "float model's outputs",
                 "sensitivity": "sensitivity reports", "exports": "exports", "imported": "imported encodings",
                 "profiles": "kept device profiles", "data": "calibration and evaluation data",
                 "cache/float": "float models", "cache/calibration": "calibrated ranges",
                 "cache/models": "generated models"}


def atomic_write(path: Path, text: str) -> None:
    """Write `text` to `path` so that a reader sees the old file or the new one, never a part."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}")  # threads and processes write too
    tmp.write_text(text)
    os.replace(tmp, path)


def read_saved_json(path: Path, damaged):
    """What a study file written as JSON holds; `damaged(why)` is the error raised when it cannot be read."""
    try:
        return json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise damaged(f"not readable JSON: {exc}") from None


def is_finite_number(value) -> bool:
    """A JSON number (not a boolean) that is finite."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def metric_parts(metric) -> tuple[MetricSpec, TaskMetric | None]:
    """(what the study stores, the metric this process evaluates with) of a TaskMetric, MetricSpec, a metric's name
    as `--metric` takes it ("cosine", "top1", "module:function": `metrics.metric_spec`) or None."""
    if isinstance(metric, MetricSpec):
        return metric, None
    if metric is None:
        return MetricSpec(), None
    if isinstance(metric, str):
        return metric_spec(metric), None
    if not all(hasattr(metric, key) for key in ("name", "higher_is_better", "__call__")):
        raise MpstudioError(f"metric= takes a metric's name (such as 'cosine', 'top1' or 'mypkg.scores:accuracy'), "
                            f"a MetricSpec (mpstudio.metrics.metric_spec) or a TaskMetric, not {metric!r}")
    return getattr(metric, "spec", None) or MetricSpec("python", metric.name, metric.higher_is_better), metric


def study_data(prepared: PreparedModel, calibration: DataSource, evaluation: DataSource | None,
               calibration_samples: int | None, evaluation_samples: int | None) -> tuple[DataSource, DataSource]:
    """The calibration and evaluation data a new study keeps (`evaluation` defaults to `calibration`; each cut to
    its first N samples when asked), checked against the model's inputs."""
    evaluation = evaluation if evaluation is not None else calibration
    for what, count in (("calibration", calibration_samples), ("evaluation", evaluation_samples)):
        if count is not None and count < 1:
            raise MpstudioError(f"{what}_samples must be at least 1, not {count}")
    calibration = calibration.head(calibration_samples) if calibration_samples else calibration
    evaluation = evaluation.head(evaluation_samples) if evaluation_samples else evaluation
    for what, source in (("calibration", calibration), ("evaluation", evaluation)):
        if len(source) == 0:
            raise MpstudioError(f"the {what} data is empty; give at least one sample")
        check_feeds(source, prepared.inputs, limit=1)
    return calibration, evaluation


def study_config(prepared: PreparedModel, spec: MetricSpec, calibration: DataSource, evaluation: DataSource, *,
                 name: str | None, htp_arch: str, calibration_method: str, allow_fallback: bool) -> dict:
    """The description `study.json` keeps of a new study."""
    return {
        "format": STUDY_FORMAT,
        "name": name or Path(prepared.source).stem,
        "model_source": str(prepared.source),
        "model_sha256": prepared.sha256,
        "inputs": [spec_.name for spec_ in prepared.inputs],
        "metric": spec.to_json(),
        "htp_arch": str(htp_arch),
        "calibration_method": calibration_method,
        "samples": {"calibration": len(calibration), "evaluation": len(evaluation),
                    "total": len(calibration) + len(evaluation)},
        "created": time.time(),
        **({"allow_fallback": True, "cpu_fallback_nodes": list(prepared.fallback_nodes)}
           if allow_fallback and not prepared.qnn_ready else {}),
    }


def create_study(folder: Path, model, calibration: DataSource, evaluation: DataSource | None, metric, *,
                 input_shapes: dict | None, htp_arch: str, calibration_method: str, name: str | None,
                 calibration_samples: int | None, evaluation_samples: int | None, progress: Progress | None,
                 allow_fallback: bool) -> TaskMetric | None:
    """Make `folder` a study (see `Study.create`); returns the metric this process evaluates with (None: the one
    the study stores). Two processes creating the same study make one: the second waits for the first."""
    if (folder / STUDY_FILE).exists():
        raise MpstudioError(f"{folder} already holds a study; open it with Study.open (mpstudio study show)")
    spec, task_metric = metric_parts(metric)  # a metric that cannot be had fails before the model is prepared
    prepared = model if isinstance(model, PreparedModel) else prepare_model(model, input_shapes)
    check_top1_axis(spec, prepared.model)  # before the data is copied (the first evaluation would refuse it)
    if not prepared.qnn_ready and not allow_fallback:
        raise MpstudioError(prepared.fallback_refusal())
    stuck = [i for i in prepared.support_issues if i.severity == FALLBACK and UNMOVABLE in i.reason]
    if stuck and allow_fallback:
        raise MpstudioError(
            f"{len(stuck)} node(s) of {prepared.source} cannot be left to ORT's CPU EP, so no plan would build on the "
            "HTP even with --allow-fallback:\n" + "\n".join(f"  {i.node} [{i.op_type}]: {i.reason}" for i in stuck[:5])
            + "\nRe-export the model without these ops (or with them outside the model, run apart on the CPU).")
    calibration, evaluation = study_data(prepared, calibration, evaluation, calibration_samples, evaluation_samples)
    config = study_config(prepared, spec, calibration, evaluation, name=name, htp_arch=htp_arch,
                          calibration_method=calibration_method, allow_fallback=allow_fallback)
    folder.mkdir(parents=True, exist_ok=True)
    with exclusive(folder / ".create.lock"):
        if not (folder / STUDY_FILE).exists():  # else another process made it while this one waited
            _write_study(folder, prepared, calibration, evaluation, config, progress)
    return task_metric


def _write_study(folder: Path, prepared: PreparedModel, calibration: DataSource, evaluation: DataSource,
                 config: dict, progress: Progress | None) -> None:
    """Write a study's files into `folder`, `study.json` last (its presence marks a complete study)."""
    tmp = folder / f".creating-{uuid.uuid4().hex[:12]}"
    tmp.mkdir()
    try:
        prepared.save(tmp / "model.onnx")
        for i, (what, source) in enumerate((("calibration", calibration), ("evaluation", evaluation))):
            if progress:
                progress(i, 2, f"copying {what} data")
            source.save_npz(tmp / "data" / what)
        for item in tmp.iterdir():
            target = folder / item.name
            if target.is_dir():  # left by a creation that was killed before study.json was written
                shutil.rmtree(target)
            os.replace(item, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    for stale in folder.glob(".creating*"):  # other killed creations
        shutil.rmtree(stale, ignore_errors=True)
    atomic_write(folder / STUDY_FILE, json.dumps(config, indent=2) + "\n")
    if progress:
        progress(2, 2, "study created")


def read_config(folder: Path) -> dict:
    """`study.json` of `folder`, checked enough that a damaged one gives a message, not a traceback."""
    path = folder / STUDY_FILE
    if not path.exists():
        raise MpstudioError(f"{folder} is not a study folder (no {STUDY_FILE}); create one with "
                            "`mpstudio search MODEL --data DIR --study DIR` or Study.create")
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise MpstudioError(f"{path} is not text; the study's description is damaged") from None
    except json.JSONDecodeError as exc:
        raise MpstudioError(f"{path} is not valid JSON ({exc.msg}); the study's description is damaged") from exc
    if not isinstance(config, dict):
        raise MpstudioError(f"{path} must hold a JSON object; the study's description is damaged")
    if config.get("format") != STUDY_FORMAT:
        raise MpstudioError(f"{path} has format {config.get('format')!r}; this mpstudio reads format {STUDY_FORMAT}")
    wrong = [f"{key} ({kind.__name__})" for key, kind in _CONFIG_KEYS.items() if not isinstance(config.get(key), kind)]
    if wrong or not all(isinstance(name, str) for name in config["inputs"]):
        raise MpstudioError(f"{path} lacks or mistypes {', '.join(wrong) or 'inputs (names)'}; the study's "
                            "description is damaged")
    if not (folder / "model.onnx").exists():
        raise MpstudioError(f"{folder} has no model.onnx; the study is incomplete")
    check_layout(folder)
    return config


def check_layout(folder: Path) -> None:
    """Refuse a study folder where a file stands in the place of one of the study's own folders."""
    for name, what in STUDY_FOLDERS.items():
        path = folder / name
        if path.exists() and not path.is_dir():
            raise MpstudioError(f"{path} is a file where the study keeps its folder of {what}; the study folder "
                                "is damaged: move that file out of it, then open the study again")


def open_study(folder: Path, metric: TaskMetric | None):
    """(config, prepared model, calibration data, evaluation data, metric) of the study in `folder`; `metric` is
    built from the stored spec unless given or stored by reference (see `Study.open`)."""
    config = read_config(folder)
    prepared = prepare_model(folder / "model.onnx", optimize=False, rewrite=False)
    inputs = config["inputs"]
    calibration = NpzFolder(folder / "data" / "calibration", inputs)
    evaluation = NpzFolder(folder / "data" / "evaluation", inputs)
    # A metric stored by reference is imported when a plan is evaluated, so a study whose metric module is
    # not on this process's path still opens and shows its results.
    spec = MetricSpec.from_json(config["metric"])
    if metric is None and spec.kind not in ("python", "reference"):
        metric = spec.build(prepared)
    return config, prepared, calibration, evaluation, metric


class ResultCount:
    """The number of results the store has committed, kept in `results.count` beside it."""

    def __init__(self, folder: Path, store: StudyStore):
        self.folder, self.store = folder, store

    def write(self) -> None:
        atomic_write(self.folder / RESULTS_FILE, f"{self.store.result_count()}\n")

    def check(self) -> None:
        """Refuse a store that holds fewer results than were committed to it."""
        path = self.folder / RESULTS_FILE
        try:
            expected = int(path.read_text().strip()) if path.exists() else 0
        except ValueError:
            return  # a damaged count says nothing; the store itself is the truth
        except OSError as exc:  # a folder in its place, or a file this user cannot read
            raise MpstudioError(f"{path} cannot be read ({exc.strerror or exc}): it should be a small file with the "
                                f"number of results committed to the study store. Remove it (the store keeps its "
                                f"results) and open the study again") from None
        have = self.store.result_count()
        if have < expected:
            raise MpstudioError(
                f"the study store {self.folder / DB_FILE} holds {have} of the {expected} results committed to it: its "
                f"write-ahead log ({DB_FILE}-wal) was probably deleted or not copied with it. Restore that file beside "
                f"it, or delete {RESULTS_FILE} to accept the results that remain")
