"""The `mpstudio` command line, run as a user runs it: a real subprocess."""

import json
import os
import subprocess
import sys

import onnx
import onnxruntime as ort

from conftest import conv_feeds, make_conv_model, make_loop_model
from mpstudio.data import FeedList


def run(*args, cwd=None, env_extra=None):
    env = {**os.environ, **(env_extra or {})}
    return subprocess.run([sys.executable, "-m", "mpstudio", *args], capture_output=True, text=True, cwd=cwd,
                          env=env, timeout=300)


def test_prepare_prints_the_report(tmp_path):
    path = tmp_path / "m.onnx"
    onnx.save(make_conv_model(), path)
    result = run("prepare", str(path), "-o", str(tmp_path / "prepared.onnx"))
    assert result.returncode == 0, result.stderr
    assert "QNN HTP support" in result.stdout and "folded constants" in result.stdout
    assert (tmp_path / "prepared.onnx").exists()


def test_prepare_refuses_a_dynamic_shape_then_fixes_it(tmp_path):
    path = tmp_path / "dyn.onnx"
    onnx.save(make_conv_model(dynamic_batch=True), path)
    refused = run("prepare", str(path))
    assert refused.returncode == 2 and "dynamic" in refused.stderr and "Traceback" not in refused.stderr
    fixed = run("prepare", str(path), "--shape", "x=1,3,16,16")
    assert fixed.returncode == 0 and "fixed input x" in fixed.stdout


def test_a_dynamic_model_given_data_but_no_shape_is_told_the_datas_shape(tmp_path):
    path = tmp_path / "dyn.onnx"
    onnx.save(make_conv_model(dynamic_batch=True), path)
    FeedList(conv_feeds(2)).save_npz(tmp_path / "data")
    for command in (("quantize", str(path), "--data", str(tmp_path / "data"), "-o", str(tmp_path / "q.onnx")),
                    ("search", str(path), "--data", str(tmp_path / "data"), "--study", str(tmp_path / "s"),
                     "--target", "30")):
        refused = run(*command, "--quiet")
        assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr
        assert "The first sample of" in refused.stderr and "has --shape x=1,3,16,16" in refused.stderr
    assert not (tmp_path / "s").exists()


def test_prepare_strict_fails_on_unsupported_ops(tmp_path):
    path = tmp_path / "loop.onnx"
    onnx.save(make_loop_model(), path)
    result = run("prepare", str(path), "--strict")
    assert result.returncode == 3 and "repeat_loop" in result.stdout


def test_corrupt_model_is_a_one_line_error(tmp_path):
    path = tmp_path / "bad.onnx"
    path.write_bytes(b"garbage" * 50)
    result = run("prepare", str(path))
    assert result.returncode == 2 and result.stderr.startswith("mpstudio: error:") and "Traceback" not in result.stderr


def test_quantize_writes_a_qdq_model(tmp_path):
    model = tmp_path / "m.onnx"
    onnx.save(make_conv_model(), model)
    FeedList(conv_feeds(6)).save_npz(tmp_path / "data")
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"overrides": {"relu1_out": {"type": "uint16"}}}))
    out = tmp_path / "out" / "q.onnx"
    result = run("quantize", str(model), "--data", str(tmp_path / "data"), "--plan", str(plan), "-o", str(out),
                 "--cache", str(tmp_path / "cache"))
    assert result.returncode == 0, result.stderr
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    assert session.run(None, conv_feeds(1)[0])[0].shape == (1, 4, 1, 1)
    assert "QuantizeLinear" in {n.op_type for n in onnx.load(str(out)).graph.node}


def test_quantize_reports_a_bad_plan(tmp_path):
    model = tmp_path / "m.onnx"
    onnx.save(make_conv_model(), model)
    FeedList(conv_feeds(2)).save_npz(tmp_path / "data")
    plan = tmp_path / "plan.json"
    plan.write_text('{"overrides": {"relu_out": {"type": "uint16"}}}')
    result = run("quantize", str(model), "--data", str(tmp_path / "data"), "--plan", str(plan), "-o",
                 str(tmp_path / "q.onnx"), "--cache", str(tmp_path / "cache"))
    assert result.returncode == 2 and "did you mean 'relu1_out'" in result.stderr
    plan.write_text("{oops")
    result = run("quantize", str(model), "--data", str(tmp_path / "data"), "--plan", str(plan), "-o",
                 str(tmp_path / "q.onnx"), "--cache", str(tmp_path / "cache"))
    assert result.returncode == 2 and "not valid JSON" in result.stderr


def test_demo_command(demo, demo_cache):
    result = run("demo", "--samples", "5", "--quiet", env_extra={"MPSTUDIO_CACHE_DIR": str(demo_cache) + "-cli"})
    assert result.returncode == 0, result.stderr
    assert "CER on 5 evaluation lines" in result.stdout and "a16w8" in result.stdout


def test_search_help_names_the_metric_and_target_forms():
    result = run("search", "--help")
    assert result.returncode == 0
    text = " ".join(result.stdout.split())
    for words in ("--metric NAME|MODULE:FUNCTION", "fn(outputs, reference, **args)", "recall@K", "--charset FILE",
                  "'float-1%'", "'a16w8-pc+5%'", "--isolation-samples", "--eval-samples"):
        assert words in text, words


def test_evaluate_scores_one_plan_of_a_study(tmp_path):
    """`mpstudio evaluate`: a baseline a search may skip (a16w8-pc), a hand-written plan file and a stored id,
    each with its value, latency and their sources; a bad plan is one clear error."""
    from mpstudio.plan import PrecisionPlan
    from mpstudio.study import Study

    model = tmp_path / "m.onnx"
    onnx.save(make_conv_model(), model)
    with Study.create(tmp_path / "s", model, FeedList(conv_feeds(4)), FeedList(conv_feeds(3, seed=7))) as study:
        pass
    pc = run("evaluate", str(tmp_path / "s"), "--plan", "a16w8-pc", "--quiet")
    assert pc.returncode == 0, pc.stderr
    assert "a16w8-pc" in pc.stdout and "ORT CPU" in pc.stdout and "estimate" in pc.stdout and "latency:" in pc.stdout
    PrecisionPlan.a8w8(name="mine").promote(["conv1_out"], name="mine").save(tmp_path / "plan.json")
    mine = run("evaluate", str(tmp_path / "s"), "--plan", str(tmp_path / "plan.json"), "--json", "--quiet")
    assert mine.returncode == 0, mine.stderr
    record = json.loads(mine.stdout)
    assert record["name"] == "mine" and record["latencies"][0]["source"] == "estimate" and not record["cached"]
    again = run("evaluate", str(tmp_path / "s"), "--plan", str(record["plan_id"]), "--quiet")
    assert again.returncode == 0 and "already in the study" in again.stdout and f"{record['value']:.4f}" in again.stdout
    with Study.open(tmp_path / "s") as study:
        assert set(study.evaluations()["name"]) == {"a16w8-pc", "mine"}
    bad = run("evaluate", str(tmp_path / "s"), "--plan", "nonesuch", "--quiet")
    assert bad.returncode == 2 and "unknown plan" in bad.stderr and "Traceback" not in bad.stderr



def test_export_takes_a_plan_by_the_name_study_show_lists(tmp_path):
    """`mpstudio export --plan` reads a plan as `evaluate --plan` does: a stored plan's name as well as its id."""
    from mpstudio.plan import PrecisionPlan
    from mpstudio.study import Study

    model = tmp_path / "m.onnx"
    onnx.save(make_conv_model(), model)
    with Study.create(tmp_path / "s", model, FeedList(conv_feeds(4))):
        pass
    PrecisionPlan.a8w8(name="mine").promote(["conv1_out"], name="mine").save(tmp_path / "plan.json")
    assert run("evaluate", str(tmp_path / "s"), "--plan", str(tmp_path / "plan.json"), "--quiet").returncode == 0
    by_name = run("export", str(tmp_path / "s"), "--plan", "mine", "--format", "ort")
    assert by_name.returncode == 0, by_name.stderr
    by_id = run("export", str(tmp_path / "s"), "--plan", "1", "--format", "ort", "-o", str(tmp_path / "by-id"))
    assert by_id.returncode == 0, by_id.stderr
    exported = sorted((tmp_path / "s" / "exports" / "plan-1").glob("*.overrides.json"))
    assert [p.name for p in exported] == [p.name for p in sorted((tmp_path / "by-id").glob("*.overrides.json"))]
    bad = run("export", str(tmp_path / "s"), "--plan", "nonesuch", "--format", "ort")
    assert bad.returncode == 2 and "mine" in bad.stderr and "Traceback" not in bad.stderr

def test_search_progress_is_a_few_lines_and_native_logs_go_to_the_study(tmp_path):
    """A search that evaluates several plans (and confirms one on the HTP emulator) prints one progress line per
    phase through a pipe, not one per sample; the study keeps the native log; an error is one line naming it."""
    from conftest import chain_feeds, make_chain_model

    model = tmp_path / "chain.onnx"
    onnx.save(make_chain_model(blocks=4, size=16), model)
    FeedList(chain_feeds(12, size=16)).save_npz(tmp_path / "data")
    study = tmp_path / "study"
    result = run("search", str(model), "--data", str(tmp_path / "data"), "--study", str(study), "--target",
                 "a16w8+2%", "--max-evaluations", "6", "--confirm-plans", "1")
    assert result.returncode in (0, 1), result.stderr
    lines = result.stderr.splitlines()
    assert 3 <= len(lines) < 40, result.stderr
    assert all(line.startswith("mpstudio: ") for line in lines), result.stderr
    assert not any("onnxruntime" in line or "[W:" in line or "[E:" in line for line in lines), result.stderr
    assert "evaluations along the way" in result.stdout
    assert (study / "mpstudio.log").exists()

    failed = run("search", "--study", str(study), "--target", "no such plan+2%")
    assert failed.returncode == 2 and "Traceback" not in failed.stderr
    assert failed.stderr.count("\n") == 1 and str(study / "mpstudio.log") in failed.stderr, failed.stderr


def test_native_log_lines_go_to_the_log_not_the_terminal(tmp_path):
    """ONNX Runtime's C++ logger writes to file descriptor 2; after `log_to`, its lines land in the log."""
    model = tmp_path / "m.onnx"
    onnx.save(make_conv_model(), model)
    code = (
        "import onnxruntime as ort, sys\n"
        "from mpstudio.cli.progress import progress_bar\n"
        f"with progress_bar() as progress:\n"
        f"    progress.log_to({str(tmp_path)!r})\n"
        "    so = ort.SessionOptions(); so.log_severity_level = 0\n"
        f"    ort.InferenceSession({str(model)!r}, so, providers=['CPUExecutionProvider'])\n"
        "    print('python stderr line', file=sys.stderr)\n"
        "    progress(1, 2, 'scoring tensors')\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    log = (tmp_path / "mpstudio.log").read_text()
    assert "onnxruntime" in log and "python stderr line" in log
    assert result.stderr.splitlines() == ["mpstudio: scoring tensors (1/2)"], result.stderr


def test_phase_bars_draw_one_bar_per_phase_a_few_times_a_second():
    """1,000 progress calls over three phases, some with a new plan in each message: three bars, few redraws."""
    import io

    from mpstudio.cli.progress import PhaseBars

    stream = io.StringIO()
    bars = PhaseBars(stream)
    for i in range(400):
        bars(i, 400, "scoring tensors")
    for i in range(300):
        bars(i % 30, 30, f"search: plan {i // 30} output SNR (dB) {i / 7:.2f}")
    for i in range(300):
        bars(i, 300, f"running g{i // 50}-abc.onnx on htp (2 workers)")
    bars.close()
    draws = [part for part in stream.getvalue().split("\r") if part.strip()]
    assert {part.split(":")[0].strip() for part in draws} == {"scoring tensors", "search", "running ... on htp"}
    assert len(draws) < 30, draws
