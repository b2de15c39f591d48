"""The search's answer on public models nobody here tuned for: does it pick the cheapest stored plan that
reaches the target, and never waste an evaluation?

    python benchmarks/outcome.py [--cases encoder,cnn,ocr] [--encoder FILE] [--max-evaluations 16]
                                 [--confirm-plans 2] [--no-confirm] [--budget-minutes 40] [--keep DIR]

Three models of different kinds, each a fresh study made through the public API as a user would (`Study.create`
with a built-in metric, `Study.evaluate` for the baselines, `mpstudio.search.search` for the answer):
- encoder: a BERT-family sentence encoder the size of MiniLM (6 layers, hidden 384, 12 heads, 64 tokens, exact
  GELU in the exporters' Erf form, random weights, seed 0), built with onnx.helper (benchmarks/latency_models.py
  `_bert`) so that the benchmark runs without torch; `--encoder FILE` takes a torch export instead (e.g. one
  made with `torch.onnx.export` of a transformers BertModel, inputs input_ids/attention_mask). Data: random
  token sequences of 16-64 tokens, padded to 64 and masked. Metric: cosine of its hidden states against the
  float model's (`--metric cosine`): an encoder with random weights has no meaning for a retrieval metric to
  measure (recall@1 over query/document pairs made by replacing tokens was either blind to quantization, at
  half the tokens replaced, or near chance for the float model too, at four fifths).
- cnn: MobileNet-v2 at 96x96 (latency_models.mobilenet_v2, random weights), random normal images. Metric: cosine of
  its logits against the float model's (`--metric cosine`); `--cnn-metric top1` takes top-1 agreement instead,
  whose resolution at 200 images (one image is 0.005, a plan's 95 % interval about +-0.045) cannot tell the
  all-8-bit plans from the all-16-bit ones (0.88 against 0.91), so no target between them is clearly reached by
  any plan, and one HTP-emulated image costs about 0.6 s, so more images do not fit the budget.
- ocr: the PP-OCRv4 text-line recognizer shipped by rapidocr_onnxruntime, on lines of its own (other sentences,
  another rendering seed than the demo's), scored by CER against the float model's decoded text (`--metric cer`
  with the model's own character list, no labels).
Every sample is drawn from a fixed seed: two runs print the same accuracy figures.

Targets are not tuned: from the baselines measured in the same run, the best all-8-bit value (a8w8, a8w8-pc) and
the best all-16-bit value (a16w8, a16w8-pc), two targets part of the way between them (`TARGET_SHARES`), so that
no all-8-bit plan reaches them and an all-16-bit one does. Each target is one search on the same study (the
second reuses what the first stored, as a user's second search would).

Gates (exit 1 when one fails), judged over the study's stored plans on the source that had the last word (the
HTP when the search confirmed there, else the CPU):
- a stored plan clearly reaches a target the search reports missed (a value within the metric's resolution of the
  target, or whose 95 % interval holds it, is within noise: it answers nothing, as in the search);
- the recommendation is dominated by a stored plan (at least as good a value at no more estimated latency; a
  better value priced within the cost model's resolution of it dominates it too: the search's own rule,
  `mpstudio.search.choice.dominates`, with latency ties from `mpstudio.latency.resolution`);
- the search evaluated a plan that a plan stored before it already made pointless: one at no more estimated
  latency (or within the cost model's resolution of it) that clearly reaches the target, or the all-16-bit
  baseline of the same weight form (a plan the HTP confirmation read short of the target no longer answers it:
  the walk may go on past it, `mpstudio.search.rewalk`);
- no target of a case is reached by a mixed plan only (the pick reaches it and no all-8-bit baseline does);
- the whole run takes longer than `--budget-minutes`.
Printed per search: evaluations (new ones), the estimated latency premium used (the pick's premium over a8w8 as a
share of a16w8's), wall time by phase (setup: study, float value and baselines; analysis: sensitivity; CPU walk;
HTP confirmation; phases are told apart by the search's progress messages), and the load average.
"""

from __future__ import annotations

import os

# One BLAS thread, set before numpy loads BLAS. The metrics and the per-tensor scores reduce arrays of tens of
# thousands of values with np.dot, one call per tensor and sample; on a machine with more runnable threads than
# cores, BLAS's own worker threads wait for each other on every call (a 24,576-value dot took 16.8 ms with the
# default threads at a load average of 25 on 2 cores, 0.02 ms with one). Nothing here is parallel in BLAS.
# mpstudio limits BLAS itself around the analysis, the evaluations and the search (`mpstudio.blas_threads`,
# when threadpoolctl is installed); this covers the rest, and environments without it.
for _name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_name, "1")

import argparse
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from mpstudio.data import FeedList  # noqa: E402
from mpstudio.latency.resolution import no_dearer  # noqa: E402
from mpstudio.loop.uncertainty import target_verdict  # noqa: E402
from mpstudio.metrics import metric_spec  # noqa: E402
from mpstudio.model import prepare_model  # noqa: E402
from mpstudio.quantize import weight_form  # noqa: E402
from mpstudio.search import LineProgress, meets, named_baselines, search  # noqa: E402
from mpstudio.search.choice import dominates  # noqa: E402
from mpstudio.search.recommend import estimate_ms  # noqa: E402
from mpstudio.study import Study  # noqa: E402

TARGET_SHARES = (0.25, 0.75)  # of the way from the best all-8-bit value to the best all-16-bit value
SEED = 26
OCR_MIN_CHARS = 12


@dataclass
class Case:
    """One model with its data and metric, as a user would bring it."""

    name: str
    what: str
    model: object  # a ModelProto or a path
    calibration: FeedList
    evaluation: FeedList
    metric: object  # a MetricSpec
    shapes: dict | None = None  # fixed input shapes, for a model exported with dynamic ones


# ---- the models and their data -----------------------------------------------------------------------------
def encoder_case(path: str | None, samples: int) -> Case:
    import onnx

    import latency_models

    if path:
        model, what = onnx.load(path), f"torch-exported BERT-family encoder {Path(path).name}"
    else:
        model = latency_models._bert("minilm", 0, 64, 6, width=384, heads=12)
        what = "MiniLM-size BERT encoder (onnx.helper, 6x384, 64 tokens, random weights)"
    types = {i.name: onnx.helper.tensor_dtype_to_np_dtype(i.type.tensor_type.elem_type) for i in model.graph.input}
    rng = np.random.default_rng(SEED)
    feeds = []
    for _ in range(samples + 32):
        length = int(rng.integers(16, 65))  # sentences of 16-64 tokens, the rest padding
        ids = np.zeros((1, 64), np.int64)
        ids[0, :length] = rng.integers(1000, 30000, length)
        mask = (np.arange(64) < length)[None].astype(np.int64)
        feeds.append({"input_ids": ids.astype(types["input_ids"]), "attention_mask": mask.astype(types["attention_mask"])})
    return Case("encoder", what, model, FeedList(feeds[samples:], name="calibration sentences"),
                FeedList(feeds[:samples], name="sentences"), metric_spec("cosine"))


def cnn_case(images: int, metric: str = "cosine", size: int = 160) -> Case:
    import latency_models

    model = latency_models.mobilenet_v2(size)
    feeds = latency_models.random_feeds(model, images + 32, seed=SEED)
    return Case("cnn", f"MobileNet-v2 {size}x{size} (onnx.helper, random weights)", model,
                FeedList(feeds[images:], name="calibration images"), FeedList(feeds[:images], name="images"),
                metric_spec(metric))


def ocr_case(lines: int) -> Case:
    from mpstudio.demos.ocr import demo_model_file, preprocess_line, render_line, sample_lines
    from mpstudio.ctc_text import ctc_charset

    path = demo_model_file()
    shapes = {"x": [1, 3, 48, 320]}
    charset = ctc_charset(prepare_model(path, shapes))
    # Lines of 12 characters and more (as long as a 320-pixel crop holds, about 18): every line costs one run of
    # the fixed 48x320 input, so longer lines give CER more characters, a finer resolution, for the same time.
    texts = sample_lines(lines + 32, SEED, set(charset[1:]), min_chars=OCR_MIN_CHARS)
    feeds = [{"x": preprocess_line(render_line(text, 1000 + SEED + i))} for i, text in enumerate(texts)]
    return Case("ocr", "PP-OCRv4 recognizer (rapidocr_onnxruntime) on lines of its own, CER against float",
                path, FeedList(feeds[lines:], name="calibration lines"), FeedList(feeds[:lines], name="lines"),
                metric_spec("cer", charset=charset[1:]), shapes)  # the charset lists the classes after the blank


# ---- timing the phases ---------------------------------------------------------------------------------------
@dataclass
class PhaseClock:
    """A search's progress callback that books the time up to each message to that message's phase."""

    seconds: dict = field(default_factory=lambda: {"analysis": 0.0, "CPU walk": 0.0, "HTP confirmation": 0.0})
    last: float = field(default_factory=time.perf_counter)
    messages: list = field(default_factory=list)
    echo: object = None  # a LineProgress to stderr, so that a long run shows where it is

    @staticmethod
    def phase(message: str) -> str:
        text = message.lower()
        if "on htp" in text or "confirmed" in text:
            return "HTP confirmation"
        if message.startswith("search:") or "on cpu" in text:
            return "CPU walk"
        return "analysis"

    def __call__(self, done: int, total: int, message: str) -> None:
        now = time.perf_counter()
        self.seconds[self.phase(message)] += now - self.last
        self.last = now
        if not self.messages or self.messages[-1] != message:
            self.messages.append(message)
        if self.echo is not None:
            self.echo(done, total, message)

    def close(self) -> None:
        self.seconds["CPU walk"] += time.perf_counter() - self.last  # the recommendation after the last message


# ---- the gates ---------------------------------------------------------------------------------------------
def stored(study: Study, source: str) -> list:
    """Every plan the study holds from `source`, one evaluation each."""
    frame = study.evaluations()
    ids = dict.fromkeys(int(i) for i in frame.loc[frame["accuracy_source"] == source, "plan_id"])
    return [e for e in (study.store.evaluation(i, source) for i in ids) if e is not None]


def dominated_by(pick, evaluations, higher: bool):
    """A stored plan that dominates `pick` by the search's own rule (`choice.dominates`: at least as good at no
    more estimated latency, a latency tie counting as no more, strictly better in one), or None."""
    return next((e for e in evaluations if e.plan_id != pick.plan_id and dominates(e, pick, higher)), None)


def clearly_reaches(threshold: float, higher: bool) -> Callable:
    """Whether an evaluation reaches `threshold` by more than its noise: the search's own rule (a value within the
    metric's resolution of the threshold, or whose 95 % interval holds it, is within noise and answers nothing;
    the search keeps looking for a plan that clearly reaches, as it should)."""
    def reaches(e) -> bool:
        return target_verdict(e.value, threshold, higher, _known(e.low), _known(e.high), _known(e.resolution)) == \
            "reaches"
    return reaches


def _known(value):
    return None if value is None or value != value else value  # NaN: a result stored without its interval


def pointless_evaluations(study: Study, before: list, path, threshold: float, higher: bool,
                          reaches: Callable | None = None, read_short: frozenset = frozenset()) -> list[str]:
    """The search's new evaluations that a plan stored before each of them already made pointless (priced no dearer
    than them, a latency tie counting as no dearer: `latency.resolution.no_dearer`). `reaches(e)`:
    whether a stored plan answers the target (default: its value meets the threshold); plans in `read_short`
    (ids the confirming backend read short of the target) answer nothing."""
    met = reaches or (lambda e: meets(e.value, threshold, higher))

    def reaches(e) -> bool:
        return e.plan_id not in read_short and met(e)
    known, found = list(before), []
    # The all-16-bit baselines, which promote nothing one by one: the top-down walk names its partial plans
    # after them ("a16w8-pc-251x8").
    ceilings = {weight_form(study.plan(e.plan_id)): e for e in before
                if e.name.startswith("a16w8") and not study.plan(e.plan_id).overrides}
    for e in path:
        if not e.cached:
            form = weight_form(study.plan(e.plan_id))
            for other in known:
                reason = ("reaches the target" if reaches(other) else
                          "is the all-16-bit plan of its weights" if ceilings.get(form) is other else None)
                if reason and other.plan_id != e.plan_id and no_dearer(estimate_ms(other), estimate_ms(e)):
                    found.append(f"{e.name} ({estimate_ms(e):.3f} ms) after {other.name} ({estimate_ms(other):.3f} "
                                 f"ms, {other.value:.4f}) {reason}")
                    break
        known.append(e)
    return found


@dataclass
class Outcome:
    """One search's answer and what the gates made of it."""

    target: float
    result: object
    clock: PhaseClock
    failures: list
    mixed_only: bool


def judge(study: Study, result, before: list, baselines: dict) -> tuple[list[str], bool]:
    """The gates of one search; returns the failures and whether a mixed plan only reaches its target."""
    higher, threshold, pick = study.higher_is_better, result.threshold, result.recommended
    final = stored(study, pick.accuracy_source)
    failures = []
    clearly = clearly_reaches(threshold, higher)
    reaching = [e for e in final if clearly(e)]
    if not result.reached and reaching:
        best = min(reaching, key=estimate_ms)
        failures.append(f"reported missed while stored {best.name} reaches it ({best.value:.4f} on "
                        f"{best.accuracy_source})")
    other = dominated_by(pick, final, higher)
    if other is not None:
        failures.append(f"the pick {pick.name} ({pick.value:.4f}, {estimate_ms(pick):.3f} ms) is dominated by "
                        f"{other.name} ({other.value:.4f}, {estimate_ms(other):.3f} ms)")
    cpu_before = [e for e in before if e.accuracy_source == result.baselines["a8w8"].accuracy_source]
    short = frozenset(c.walk.plan_id for c in result.confirmations if c.verdict != "reaches")
    failures += [f"evaluated {text}" for text in pointless_evaluations(study, cpu_before, result.path, threshold,
                                                                       higher, clearly, short)]
    eight_bit_reaches = any(meets(e.value, threshold, higher) for name, e in baselines.items()
                            if name.startswith("a8w8"))
    is_mixed = bool(study.plan(pick.plan_id).overrides)  # a baseline promotes nothing one by one
    return failures, bool(result.reached and is_mixed and not eight_bit_reaches)


# ---- one case ------------------------------------------------------------------------------------------------
def targets_of(baselines: dict, higher: bool) -> list[float]:
    """`TARGET_SHARES` of the way from the best all-8-bit value to the best all-16-bit value."""
    pick = max if higher else min
    low = pick(e.value for name, e in baselines.items() if name.startswith("a8w8"))
    high = pick(e.value for name, e in baselines.items() if name.startswith("a16w8"))
    return [round(low + share * (high - low), 4) for share in TARGET_SHARES]


def run_case(case: Case, folder: Path, args) -> tuple[list[Outcome], dict, list[str]]:
    started = time.perf_counter()
    if (folder / case.name / "study.json").exists():  # a kept study of an earlier run: its results are reused
        study = Study.open(folder / case.name)
    else:
        study = Study.create(folder / case.name, prepare_model(case.model, case.shapes), case.calibration, case.evaluation,
                             case.metric, name=f"outcome: {case.name}")
    float_value = study.float_value()
    baselines = {name: study.evaluate(plan, origin="baseline") for name, plan in named_baselines().items()}
    setup = time.perf_counter() - started
    higher = study.higher_is_better
    print(f"\n== {case.name}: {case.what}")
    print(f"   {len(case.calibration)} calibration and {len(case.evaluation)} evaluation samples; metric "
          f"{study.metric_name} ({'higher' if higher else 'lower'} is better); float {float_value:.4f}; setup "
          f"{setup:.1f} s")
    for name, e in baselines.items():
        print(f"   {name:<9} {e.value:.4f}  SNR {e.snr_db:6.2f} dB  est. {estimate_ms(e):.3f} ms")
    problems = []
    eight = [e.value for n, e in baselines.items() if n.startswith("a8w8")]
    sixteen = [e.value for n, e in baselines.items() if n.startswith("a16w8")]
    if not (max(sixteen) > max(eight) if higher else min(sixteen) < min(eight)):
        problems.append(f"{case.name}: no all-16-bit baseline beats the all-8-bit ones on this data: no target "
                        "between them")
        return [], {"setup": setup}, problems
    outcomes = []
    for target in targets_of(baselines, higher):
        before = stored(study, baselines["a8w8"].accuracy_source)
        before += stored(study, study.accuracy_source("htp")) if not args.no_confirm else []
        clock = PhaseClock(echo=LineProgress(interval=30.0))
        result = search(study, float(target), max_evaluations=args.max_evaluations, confirm_plans=args.confirm_plans,
                        confirm=None if args.no_confirm else "htp", progress=clock)
        clock.close()
        failures, mixed_only = judge(study, result, before, baselines)
        outcomes.append(Outcome(target, result, clock, failures, mixed_only))
        report(study, result, clock, baselines, failures, mixed_only)
    if not any(o.mixed_only for o in outcomes):
        problems.append(f"{case.name}: no target is reached by a mixed plan only")
    study.close()
    return outcomes, {"setup": setup}, problems


def report(study: Study, result, clock: PhaseClock, baselines: dict, failures: list, mixed_only: bool) -> None:
    pick = result.recommended
    a8, a16 = estimate_ms(baselines["a8w8"]), estimate_ms(baselines["a16w8"])
    share = (estimate_ms(pick) - a8) / (a16 - a8) if a16 > a8 else float("nan")
    # a pick within noise of the target neither reaches nor misses it (the search's own verdict)
    state = "reached" if result.reached else "within noise" if result.within_noise else "NOT reached"
    print(f"   target {study.metric_name} {result.target} (threshold {result.threshold:.4f}): {state}; pick "
          f"{pick.name} {pick.value:.4f} on {pick.accuracy_source}, est. {estimate_ms(pick):.3f} ms, premium "
          f"{share:.2f} of a16w8's; {'a mixed plan only reaches it' if mixed_only else 'not mixed-only'}")
    print(f"     evaluations {result.evaluations} ({result.new_evaluations} new); stop: {result.stop_reason}")
    print("     wall time: " + ", ".join(f"{phase} {seconds:.1f} s" for phase, seconds in clock.seconds.items()))
    if result.walk_pick is not None:
        print(f"     the HTP confirmation moved the pick from {result.walk_pick.name}")
    path = ", ".join(f"{e.name} {e.value:.4f}" for e in result.path if not e.cached)
    print(f"     evaluated: {path or 'nothing new'}")
    for text in failures:
        print(f"     FAILED: {text}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default="encoder,cnn,ocr")
    parser.add_argument("--encoder", help="a torch-exported BERT-family encoder (default: one built with onnx.helper)")
    parser.add_argument("--sentences", type=int, default=48, help="encoder: token sequences evaluated")
    parser.add_argument("--images", type=int, default=100, help="cnn: images evaluated")
    parser.add_argument("--cnn-size", type=int, default=160,
                        help="cnn: input size (at 96 the whole 16-bit premium, 0.053 ms, is the converts of about "
                             "seven promoted tensors: no mixed plan is worth its converts there)")
    parser.add_argument("--cnn-metric", default="cosine", choices=["cosine", "top1"],
                        help="cnn: the logits' cosine against float (default), or top-1 agreement, whose steps of one "
                             "image and interval of about +-0.045 over 200 images hide the gap between 8 and 16 bits")
    parser.add_argument("--lines", type=int, default=96, help="ocr: text lines evaluated")
    parser.add_argument("--max-evaluations", type=int, default=16)
    parser.add_argument("--confirm-plans", type=int, default=2)
    parser.add_argument("--no-confirm", action="store_true", help="no HTP confirmation (the CPU has the last word)")
    parser.add_argument("--budget-minutes", type=float, default=40.0)
    parser.add_argument("--keep", help="make the studies in this folder (default: a temporary one)")
    args = parser.parse_args(argv)
    builders: dict[str, Callable[[], Case]] = {
        "encoder": lambda: encoder_case(args.encoder, args.sentences), "cnn": lambda: cnn_case(args.images, args.cnn_metric, args.cnn_size),
        "ocr": lambda: ocr_case(args.lines)}
    started = time.perf_counter()
    print(f"load average at the start: {' '.join(f'{v:.2f}' for v in os.getloadavg())} ({os.cpu_count()} cores)")
    problems = []
    with tempfile.TemporaryDirectory(prefix="mpstudio-outcome-") as tmp:
        folder = Path(args.keep or tmp)
        for name in args.cases.split(","):
            outcomes, _, case_problems = run_case(builders[name](), folder, args)
            problems += case_problems + [f"{name}: {text}" for o in outcomes for text in o.failures]
    minutes = (time.perf_counter() - started) / 60
    print(f"\nwall time {minutes:.1f} min (budget {args.budget_minutes:g}); load average at the end: "
          f"{' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    if minutes > args.budget_minutes:
        problems.append(f"past the time budget ({minutes:.1f} > {args.budget_minutes:g} min)")
    for text in problems:
        print(f"FAILED: {text}")
    print("all cases pass" if not problems else f"{len(problems)} failure(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
