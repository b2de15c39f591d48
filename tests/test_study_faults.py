"""Studies under faults: two processes creating one study, a deleted write-ahead log, a read while a search
runs elsewhere, and damaged study.json files. Real processes, real SQLite files."""

from __future__ import annotations

import json
from pathlib import Path
import os
import re
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time

import numpy as np
import onnx
import pytest

from conftest import chain_feeds, make_chain_model
from mpstudio.data import FeedList
from mpstudio.errors import MpstudioError
from mpstudio.plan import PrecisionPlan
from mpstudio.study import STUDY_FILE, Study

_CREATE = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, {tests!r})
    from conftest import chain_feeds
    from mpstudio.data import FeedList
    from mpstudio.plan import PrecisionPlan
    from mpstudio.study import Study
    start = float(sys.argv[1])
    while time.time() < start:
        time.sleep(0.005)
    study = Study.create({folder!r}, {model!r}, FeedList(chain_feeds(6)), FeedList(chain_feeds(4, seed=3)))
    print(study.evaluate(PrecisionPlan.a8w8()).value)
    study.close()
""")


def _model(tmp_path, **kwargs):
    path = tmp_path / "chain.onnx"
    onnx.save(make_chain_model(**kwargs), path)
    return path


def test_two_processes_creating_one_study_make_one_that_works(tmp_path):
    model, folder = _model(tmp_path), tmp_path / "study"
    code = _CREATE.format(tests=os.path.dirname(__file__), folder=str(folder), model=str(model))
    start = str(time.time() + 4)  # both start together, after their imports
    runs = [subprocess.Popen([sys.executable, "-c", code, start], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True) for _ in range(2)]
    outs = [run.communicate(timeout=300) for run in runs]
    # One creates it; the other either waits and opens it, or is told it exists. Neither breaks it.
    codes = [run.returncode for run in runs]
    assert 0 in codes, outs
    for run, (out, err) in zip(runs, outs):
        assert run.returncode == 0 or "already holds a study" in err, err
    with Study.open(folder) as study:
        assert (folder / "model.onnx").exists()
        assert study.evaluate(PrecisionPlan.a16w8()).value > 0
    assert not list(folder.glob(".creating*"))


def test_a_deleted_write_ahead_log_is_reported_not_hidden(tmp_path):
    folder = tmp_path / "study"
    study = Study.create(folder, _model(tmp_path), FeedList(chain_feeds(6)), FeedList(chain_feeds(4, seed=3)))
    study.evaluate(PrecisionPlan.a8w8())
    study.evaluate(PrecisionPlan.a16w8())
    # Another connection keeps the log from being folded in, as a search running elsewhere would.
    holder = sqlite3.connect(folder / "study.sqlite")
    holder.execute("BEGIN")
    holder.execute("SELECT COUNT(*) FROM plans").fetchone()
    wal = folder / "study.sqlite-wal"
    copy = {p.name: p.read_bytes() for p in folder.glob("study.sqlite*")}
    holder.rollback()
    holder.close()
    study.close()
    # What a user gets who copies the study without its -wal file (or deletes it) mid-search.
    for name, data in copy.items():
        (folder / name).write_bytes(data)
    assert wal.exists() and wal.stat().st_size  # the results live in the log until a checkpoint
    wal.unlink()
    for extra in folder.glob("study.sqlite-shm"):
        extra.unlink()
    with pytest.raises(MpstudioError, match=r"write-ahead log .*deleted"):
        Study.open(folder)


def test_results_are_checkpointed_into_the_database_file(tmp_path, monkeypatch):
    import mpstudio.store as store

    monkeypatch.setattr(store, "CHECKPOINT_EVERY_S", 0.0)
    folder = tmp_path / "study"
    study = Study.create(folder, _model(tmp_path), FeedList(chain_feeds(6)), FeedList(chain_feeds(4, seed=3)))
    study.evaluate(PrecisionPlan.a8w8())
    study.evaluate(PrecisionPlan.a16w8())
    # While the study is still open, the database file alone (no -wal) holds both results.
    copy = tmp_path / "copy.sqlite"
    copy.write_bytes((folder / "study.sqlite").read_bytes())
    with sqlite3.connect(copy) as db:
        assert db.execute("SELECT COUNT(*) FROM accuracy").fetchone()[0] == 2
    study.close()


_SLOW_SEARCH = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, {tests!r})
    from conftest import chain_feeds
    from mpstudio.data import FeedList
    from mpstudio.search import search
    from mpstudio.study import Study
    from pathlib import Path
    study = Study.create({folder!r}, {model!r}, FeedList(chain_feeds(8)), FeedList(chain_feeds(6, seed=3)))
    release = Path({release!r})

    def hold(*args):  # the walk waits here until the test lets it go on
        while not release.exists():
            time.sleep(0.05)

    search(study, "a16w8+2%", max_evaluations=14, weights="per-tensor", progress=hold)
    study.close()
""")


def _wait_for_a_running_search(folder, process) -> None:
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and process.poll() is None:
        db = folder / "study.sqlite"
        if db.exists():
            try:
                with sqlite3.connect(db, timeout=10) as conn:
                    if conn.execute("SELECT COUNT(*) FROM searches WHERE status = 'running'").fetchone()[0]:
                        return
            except sqlite3.OperationalError:
                pass  # the store is being created
        time.sleep(0.1)
    raise AssertionError(f"no search started: {process.stdout.read().decode() if process.poll() is not None else ''}")


def test_study_show_during_a_live_search_neither_crashes_nor_interrupts_it(tmp_path):
    folder = tmp_path / "study"
    release = tmp_path / "release"
    code = _SLOW_SEARCH.format(tests=os.path.dirname(__file__), folder=str(folder), model=str(_model(tmp_path)),
                               release=str(release))
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    search = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        _wait_for_a_running_search(folder, search)
        for _ in range(2):
            show = subprocess.run([sys.executable, "-m", "mpstudio", "study", "show", str(folder)], env=env,
                                  capture_output=True, text=True, timeout=120)
            assert show.returncode == 0 and "Traceback" not in show.stderr, show.stderr
        with Study.open(folder) as study:  # a reader in this process marks nothing
            assert study.searches()["status"].tolist() == ["running"]
        assert search.poll() is None, "the search stopped while it was being read"
        assert "running now in another process" in show.stdout
        release.touch()
        assert search.wait(timeout=300) == 0, search.stdout.read().decode()
    finally:
        if search.poll() is None:
            search.send_signal(signal.SIGKILL)
        search.wait()
    with Study.open(folder) as study:  # it went on to the end
        assert study.searches()["status"].tolist() == ["done"]


def test_a_killed_search_reads_as_interrupted(tmp_path):
    folder = tmp_path / "study"
    code = _SLOW_SEARCH.format(tests=os.path.dirname(__file__), folder=str(folder), model=str(_model(tmp_path)),
                               release=str(tmp_path / "never"))
    search = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    _wait_for_a_running_search(folder, search)
    search.send_signal(signal.SIGKILL)
    search.wait()
    with Study.open(folder) as study:
        assert study.searches()["status"].tolist() == ["interrupted"]


@pytest.mark.parametrize("text, message", [
    ("{not json", "not valid JSON"),
    ("[1, 2]", "JSON object"),
    ('{"format": 1}', "lacks or mistypes"),
    ('{"format": 1, "inputs": "x", "metric": {}}', "lacks or mistypes"),
    ('{"format": 1, "inputs": [3], "metric": {}}', "lacks or mistypes"),
    ('{"format": 99, "inputs": ["x"], "metric": {}}', "format 99"),
    (b"\xff\xfe\x00garbage", "not text"),
    ("", "not valid JSON"),
])
def test_damaged_study_json_gives_a_clean_error(tmp_path, text, message):
    folder = tmp_path / "study"
    Study.create(folder, _model(tmp_path), FeedList(chain_feeds(4)), FeedList(chain_feeds(2, seed=3))).close()
    path = folder / STUDY_FILE
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(MpstudioError, match=message):
        Study.open(folder)
    show = subprocess.run([sys.executable, "-m", "mpstudio", "study", "show", str(folder)], capture_output=True,
                          text=True, timeout=120)
    assert show.returncode == 2 and "Traceback" not in show.stderr and "mpstudio: error" in show.stderr


def test_a_study_without_its_model_says_so(tmp_path):
    folder = tmp_path / "study"
    Study.create(folder, _model(tmp_path), FeedList(chain_feeds(4)), FeedList(chain_feeds(2, seed=3))).close()
    (folder / "model.onnx").unlink()
    with pytest.raises(MpstudioError, match="no model.onnx"):
        Study.open(folder)


def test_searches_with_nan_results_read_back(tmp_path):
    folder = tmp_path / "study"
    study = Study.create(folder, _model(tmp_path), FeedList(chain_feeds(4)), FeedList(chain_feeds(2, seed=3)))
    done = study.start_search({"target": "x"})
    study.finish_search(done, "done", {"gap": float("nan"), "path": [1, 2]})
    study.start_search({"target": "y"})  # a running search with no result yet, beside a finished one
    frame = study.searches()
    assert frame["result"].iloc[0] == {"gap": None, "path": [1, 2]} and frame["result"].iloc[1] is None
    assert json.loads(json.dumps(frame["result"].tolist()))
    study.close()


# ------------------------------------------------------------------------------------------- liveness across hosts

_OTHER_HOST = textwrap.dedent("""
    import socket, sys, time
    real_time = time.time
    time.time = lambda: real_time() - 300.0  # this host's clock is five minutes behind
    socket.gethostname = lambda: "other-host"
    from mpstudio.store import StudyStore
    store = StudyStore({db!r})
    plan = store.add_plan("h" * 16, "a8w8", "user", {{}}, 0)
    search = store.start_search({{"target": "a16w8+2%"}})
    job = store.submit(plan, "cpu", search)
    assert store.claim_job() == job
    print("running", flush=True)
    sys.stdin.read()  # until the test lets go
""")


def test_a_live_search_on_a_host_whose_clock_is_behind_reads_as_running(tmp_path):
    from mpstudio.store import StudyStore

    db = tmp_path / "study.sqlite"
    other = subprocess.Popen([sys.executable, "-c", _OTHER_HOST.format(db=str(db))], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert other.stdout.readline().strip() == "running", other.stderr.read()
        store = StudyStore(db)
        try:
            assert store.searches()["status"].tolist() == ["running"]
            assert store.jobs()["status"].tolist() == ["running"]
            assert store.claim_job() is None  # its job is not run twice
            with pytest.raises(MpstudioError, match="running in another process"):
                store.start_search({"target": "a16w8+2%"})
        finally:
            store.close()
    finally:
        other.kill()
        other.wait(timeout=30)


def test_a_reused_pid_or_a_heartbeat_from_the_future_does_not_keep_a_search_running(tmp_path):
    import socket

    from mpstudio.store import StudyStore

    db = tmp_path / "study.sqlite"
    store = StudyStore(db)
    try:
        first = store.start_search({"target": "a"})
        second = store.start_search({"target": "b"})
        with sqlite3.connect(db) as conn:
            # A dead owner whose pid now belongs to a live process (this one) that started at another time.
            conn.execute("UPDATE searches SET owner = ? WHERE id = ?", (f"{socket.gethostname()}:{os.getpid()}:1",
                                                                         first))
            # A dead owner on another host whose clock ran a day ahead.
            conn.execute("UPDATE searches SET owner = 'other-host:4242', updated = ? WHERE id = ?",
                         (time.time() + 86400, second))
        assert store.searches()["status"].tolist() == ["interrupted", "interrupted"]
        assert store.start_search({"target": "b"}) == second  # taken over, not refused
    finally:
        store.close()


# ------------------------------------------------------------------------------------------- user data

@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_nan_or_inf_in_calibration_data_names_the_sample_and_input(tmp_path, bad):
    calibration = chain_feeds(6)
    calibration[3]["x"][0, 1, 2, 3] = bad
    study = Study.create(tmp_path / "study", _model(tmp_path), FeedList(calibration), FeedList(chain_feeds(4, seed=3)))
    try:
        with pytest.raises(MpstudioError) as refused:
            study.evaluate(PrecisionPlan.a8w8())
    finally:
        study.close()
    message = str(refused.value)
    assert "sample 3" in message and "'x'" in message and ("NaN" in message or "infinite" in message), message
    assert "[0, 1, 2, 3]" in message


def _model_over_2gb(folder, op: str = "Gather"):
    """A model whose one weight (all zeros, a sparse file) is a little over 2 GiB of external data."""
    from onnx import TensorProto, helper

    count = (2**31 + 2**24) // 4
    weight = TensorProto(name="W", data_type=TensorProto.FLOAT, dims=[count], data_location=TensorProto.EXTERNAL)
    for key, value in (("location", "weights.bin"), ("offset", "0"), ("length", str(count * 4))):
        entry = weight.external_data.add()
        entry.key, entry.value = key, value
    with open(folder / "weights.bin", "wb") as data:
        data.truncate(count * 4)
    graph = helper.make_graph([helper.make_node(op, ["W", "i"], ["y"], name="gather")], "big",
                              [helper.make_tensor_value_info("i", TensorProto.INT64, [4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])], [weight])
    path = folder / "big.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), path)
    return path


def test_a_valid_model_over_2gb_is_not_called_invalid(tmp_path):
    from mpstudio.model import prepare_model

    started = time.monotonic()
    with pytest.raises(MpstudioError) as refused:
        prepare_model(_model_over_2gb(tmp_path))
    assert "fails ONNX's checker" not in str(refused.value)
    assert "valid model" in str(refused.value) and "2 GB" in str(refused.value)
    assert time.monotonic() - started < 10  # told from the file, before 2 GB of weights are read
    (tmp_path / "bad").mkdir()
    with pytest.raises(MpstudioError, match="fails ONNX's checker"):
        prepare_model(_model_over_2gb(tmp_path / "bad", op="NoSuchOp"))


def _results_in_the_file_alone(folder, tmp_path) -> int:
    copy = tmp_path / "copy.sqlite"
    copy.write_bytes((folder / "study.sqlite").read_bytes())
    with sqlite3.connect(copy) as db:
        return db.execute("SELECT COUNT(*) FROM accuracy").fetchone()[0]


def test_the_last_results_of_a_burst_reach_the_database_file_without_another_write(tmp_path, monkeypatch):
    import mpstudio.store as store

    monkeypatch.setattr(store, "CHECKPOINT_EVERY_S", 1.0)
    folder = tmp_path / "study"
    study = Study.create(folder, _model(tmp_path), FeedList(chain_feeds(6)), FeedList(chain_feeds(4, seed=3)))
    try:
        study.evaluate(PrecisionPlan.a8w8())
        study.evaluate(PrecisionPlan.a16w8())
        time.sleep(2.0)  # nothing more is written
        assert _results_in_the_file_alone(folder, tmp_path) == 2
    finally:
        study.close()


_KILLED_WRITER = textwrap.dedent("""
    import os, signal, sys
    sys.path.insert(0, {tests!r})
    from conftest import chain_feeds
    from mpstudio.data import FeedList
    from mpstudio.plan import PrecisionPlan
    from mpstudio.study import Study
    study = Study.create({folder!r}, {model!r}, FeedList(chain_feeds(6)), FeedList(chain_feeds(4, seed=3)))
    study.evaluate(PrecisionPlan.a8w8())
    study.evaluate(PrecisionPlan.a16w8())
    os.kill(os.getpid(), signal.SIGKILL)
""")


def test_opening_a_study_folds_in_what_a_killed_writer_left_in_the_log(tmp_path):
    folder = tmp_path / "study"
    code = _KILLED_WRITER.format(tests=os.path.dirname(__file__), folder=str(folder), model=str(_model(tmp_path)))
    subprocess.run([sys.executable, "-c", code], timeout=300, check=False)
    assert (folder / "study.sqlite-wal").stat().st_size > 0
    with Study.open(folder) as study:
        assert len(study.evaluations()) == 2
        assert _results_in_the_file_alone(folder, tmp_path) == 2


def test_quantize_onto_an_existing_file_needs_force(tmp_path):
    model = _model(tmp_path)
    data = FeedList(chain_feeds(4)).save_npz(tmp_path / "calib")
    out = tmp_path / "out.onnx"
    out.write_bytes(b"keep me")

    def quantize(*extra):
        return subprocess.run([sys.executable, "-m", "mpstudio", "quantize", str(model), "--data", str(data), "--quiet",
                               *extra], capture_output=True, text=True, timeout=300)

    refused = quantize("-o", str(out))
    assert refused.returncode != 0 and "--force" in refused.stderr and "Traceback" not in refused.stderr
    assert out.read_bytes() == b"keep me"
    itself = quantize("-o", str(model), "--force")
    assert itself.returncode != 0 and "float model itself" in itself.stderr and "Traceback" not in itself.stderr
    folder = quantize("-o", str(tmp_path))
    assert folder.returncode != 0 and "is a folder" in folder.stderr and "Traceback" not in folder.stderr
    forced = quantize("-o", str(out), "--force")
    assert forced.returncode == 0, forced.stderr
    assert onnx.load(out).graph.node


# ------------------------------------------------------------------------------------------- files the study reads

@pytest.mark.parametrize("text, message", [
    ("{not json", "not readable JSON"),
    ("[]", "'scales' and 'calibrated_on'"),
    ('{"scales": {"hmx": 0}, "calibrated_on": "phone"}', "outside"),
    ('{"scales": {"hmx": 4.6e298}, "calibrated_on": "phone"}', "outside"),
    ('{"scales": {"hmx": NaN}, "calibrated_on": "phone"}', "outside"),
    ('{"scales": {"warp": 1.0}, "calibrated_on": "phone"}', "unknown cost class"),
])
def test_a_damaged_calibration_json_gives_a_clean_error(tmp_path, text, message):
    from mpstudio.loop.cost_model import CALIBRATION_FILE, CostModel

    (tmp_path / CALIBRATION_FILE).write_text(text)
    with pytest.raises(MpstudioError, match=message) as refused:
        CostModel(tmp_path, "75").arch
    assert "delete it" in str(refused.value)
    (tmp_path / CALIBRATION_FILE).write_text('{"scales": {"hmx": 1.5}, "calibrated_on": "phone"}')
    assert CostModel(tmp_path, "75").arch.scales == {"hmx": 1.5}


def _kept(tmp_path, device: str):
    from mpstudio.agent.protocol import OpCost, OpProfile
    from mpstudio.loop.recalibration import keep_profile
    from mpstudio.sources import Latency

    profile = OpProfile(ops=(OpCost(op="conv", node="conv", op_type="Conv", onnx_nodes=("conv",), cost=10.0,
                                    unit="cycles"),), unit="cycles",
                        source="emulator", device=device, backend="htp", runs=1)
    keep_profile(tmp_path, 1, Latency(ms=2.0, source="emulator", where=device), profile)


@pytest.mark.parametrize("device", [".", "..", "..."])
def test_device_names_of_dots_keep_their_profiles_inside_the_study(tmp_path, device):
    from mpstudio.loop.recalibration import read_profiles

    study = tmp_path / "study"
    study.mkdir()
    _kept(study, device)
    kept = read_profiles(study)
    assert kept["device"].tolist() == [device]
    assert all(study / "profiles" in Path(p).parents for p in kept["path"])
    assert list(tmp_path.glob("*.json")) == [] and list(study.glob("*.json")) == []


@pytest.mark.parametrize("edit, message", [
    (lambda saved: "{broken", "not readable JSON"),
    (lambda saved: {**saved, "total_ms": 0}, "total_ms"),
    (lambda saved: {**saved, "total_ms": 4.6e298 * 1e10}, "total_ms"),
    (lambda saved: {**saved, "plan_id": "one"}, "plan_id"),
    (lambda saved: {**saved, "profile": {"ops": [{"node": 1}]}}, "op profile"),
])
def test_a_damaged_kept_profile_gives_a_clean_error(tmp_path, edit, message):
    from mpstudio.loop.recalibration import read_profiles

    _kept(tmp_path, "phone")
    path = next((tmp_path / "profiles").glob("*/*.json"))
    edited = edit(json.loads(path.read_text()))
    path.write_text(edited if isinstance(edited, str) else json.dumps(edited))
    with pytest.raises(MpstudioError, match=message) as refused:
        read_profiles(tmp_path)
    assert str(path) in str(refused.value)


def test_a_read_only_study_is_shown_and_refuses_changes_without_advising_to_move_it(tmp_path):
    """Read-only media, made with the immutable attribute (which holds for root too)."""
    import shutil

    from mpstudio.store import StudyStore

    if shutil.which("chattr") is None:
        pytest.skip("chattr is not available")
    folder = tmp_path / "study"
    study = Study.create(folder, _model(tmp_path), FeedList(chain_feeds(6)), FeedList(chain_feeds(4, seed=3)))
    study.evaluate(PrecisionPlan.a8w8())
    study.close()
    if subprocess.run(["chattr", "-R", "+i", str(folder)], capture_output=True).returncode != 0:
        pytest.skip("cannot make files immutable here")
    try:
        show = subprocess.run([sys.executable, "-m", "mpstudio", "study", "show", str(folder)], capture_output=True,
                              text=True, timeout=120)
        assert show.returncode == 0 and "a8w8" in show.stdout, show.stderr
        assert "move it aside" not in show.stderr
        store = StudyStore(folder / "study.sqlite")
        try:
            assert store.read_only and len(store.plans()) == 1
            with pytest.raises(MpstudioError, match="read-only here"):
                store.start_search({"target": "a16w8+2%"})
        finally:
            store.close()
    finally:
        subprocess.run(["chattr", "-R", "-i", str(folder)], check=False)


# ---- damaged study folders: one MpstudioError (or the study opens), never a traceback ----------------------------
def _write(name: str, data: bytes):
    def damage(folder: Path) -> None:
        path = folder / name
        if path.is_dir():
            import shutil

            shutil.rmtree(path)
        path.write_bytes(data)
    return damage


def _folder(name: str):
    def damage(folder: Path) -> None:
        path = folder / name
        path.unlink(missing_ok=True)
        path.mkdir()
    return damage


def _sql(statement: str):
    def damage(folder: Path) -> None:
        with sqlite3.connect(folder / "study.sqlite") as connection:
            connection.executescript(statement)
        connection.close()
    return damage


def _truncated(name: str):
    def damage(folder: Path) -> None:
        data = (folder / name).read_bytes()
        (folder / name).write_bytes(data[:len(data) // 2])
    return damage


def _replaced_by_a_file(folder: Path) -> None:
    import shutil

    shutil.rmtree(folder)
    folder.write_text("not a folder")


DAMAGED_FOLDERS = {
    "study.json missing": lambda folder: (folder / STUDY_FILE).unlink(),
    "study.json empty": _write(STUDY_FILE, b""),
    "study.json not an object": _write(STUDY_FILE, b"[1, 2]"),
    "study.json wrong types": _write(STUDY_FILE, b'{"format": 1, "inputs": "x", "metric": []}'),
    "store missing": lambda folder: (folder / "study.sqlite").unlink(),
    "store zero bytes": _write("study.sqlite", b""),
    "store not SQLite": _write("study.sqlite", b"not a database " * 200),
    "store truncated": _truncated("study.sqlite"),
    "store a folder": _folder("study.sqlite"),
    "write-ahead log garbage": _write("study.sqlite-wal", b"garbage" * 1000),
    "jobs for a missing plan": _sql("INSERT INTO jobs (plan_id, backend, status, created, updated) "
                                    "VALUES (999, 'cpu', 'pending', 0, 0);"),
    "searches not JSON": _sql("INSERT INTO searches (spec, status, result, created, updated) "
                              "VALUES ('{bad', 'interrupted', '{bad', 0, 0);"),
    "search spec a list": _sql("INSERT INTO searches (spec, status, created, updated) VALUES ('[1]', 'done', 0, 0);"),
    "accuracy not a number": _sql("UPDATE accuracy SET value = 'abc';"),
    "results count a folder": _folder("results.count"),
    "results count not a number": _write("results.count", b"\xff\xfe"),
    "cache a file": _write("cache", b"x"),
    "cache of float models a file": _write("cache/float", b"x"),
    "reference a file": _write("reference", b"x"),
    "sensitivity a file": _write("sensitivity", b"x"),
    "calibration.json damaged": _write("calibration.json", b"{bad"),
    "model missing": lambda folder: (folder / "model.onnx").unlink(),
    "model truncated": _truncated("model.onnx"),
    "model zero bytes": _write("model.onnx", b""),
    "model a folder": _folder("model.onnx"),
    "data folder a file": _write("data/calibration", b"x"),
    "study folder a file": _replaced_by_a_file,
}


@pytest.fixture(scope="module")
def intact_study(tmp_path_factory):
    root = tmp_path_factory.mktemp("intact")
    study = Study.create(root / "study", _model(root), FeedList(chain_feeds(4)), FeedList(chain_feeds(2, seed=3)))
    study.evaluate(PrecisionPlan.a8w8())
    study.close()
    return root / "study"


@pytest.mark.parametrize("shape", list(DAMAGED_FOLDERS))
def test_a_damaged_study_folder_gives_one_clean_error(tmp_path, intact_study, capsys, shape):
    """`mpstudio study show`, `study resume`, `Study.open` and the studio's open of a damaged folder: each opens
    the study or says what is wrong in one MpstudioError; none raises anything else."""
    import shutil

    from mpstudio.cli import main
    from gui_support import wait_until
    from mpstudio.widgets import StudioState

    folder = tmp_path / "study"
    shutil.copytree(intact_study, folder)
    DAMAGED_FOLDERS[shape](folder)
    try:
        Study.open(folder).close()
        opened = ""
    except MpstudioError as exc:
        opened = str(exc)
    for command in ("show", "resume"):
        code = main(["study", command, str(folder)])  # anything but an MpstudioError would raise here
        err = capsys.readouterr().err
        assert code == 2 if opened else code in (0, 2), (command, err)
        assert code == 0 or err.strip().splitlines()[-1].startswith("mpstudio: error: "), (command, err)
        # A command's log keeps the traceback of its error: it must be an MpstudioError's, not a wrapped other.
        log = folder / "mpstudio.log" if folder.is_dir() else None
        raised = re.findall(r"^([\w.]+(?:Error|Exception)): ", log.read_text(), re.MULTILINE) \
            if log is not None and log.is_file() else []
        assert set(raised) <= {"mpstudio.errors.MpstudioError"}, (command, raised)
    state = StudioState(auto_analyze=False)
    try:
        job = state.open_study(folder)
        wait_until(lambda: not job.active, 120)
        if opened:
            assert job.error == opened, job.error  # the studio tells the same sentence, not an exception's name
        elif job.error:  # opened, then refused when the studio read on: by an MpstudioError's sentence
            assert not job.error.startswith(f"{job.title} failed:"), job.error
        else:
            assert state.study is not None
    finally:
        state.close()


def test_a_store_another_process_holds_locked_is_said_to_be_locked(tmp_path, intact_study):
    import shutil

    folder = tmp_path / "study"
    shutil.copytree(intact_study, folder)
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sqlite3, sys, time
        db = sqlite3.connect({str(folder / "study.sqlite")!r}, isolation_level=None)
        db.execute("BEGIN EXCLUSIVE")
        print("locked", flush=True)
        time.sleep(120)
    """)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(MpstudioError, match="locked by another process") as refused:
            Study.open(folder)
        assert "move it aside" not in str(refused.value)
    finally:
        holder.kill()
        holder.wait()
    Study.open(folder).close()
