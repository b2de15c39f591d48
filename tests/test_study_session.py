"""What the tabs of one server share about a study (mpstudio.widgets.study_session), without a browser: real
states on a real study; a served session's sharing switched on by hand (a browser test covers `panel serve`)."""

from __future__ import annotations

import pytest

from gui_support import make_small_study
from mpstudio.widgets import StudioState

pytestmark = pytest.mark.filterwarnings("ignore::PendingDeprecationWarning")


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    return make_small_study(tmp_path_factory.mktemp("shared") / "study")


def shared_state(study) -> StudioState:
    """A state that shares, as a served tab's does."""
    state = StudioState(evaluate_on_edit=False, auto_analyze=False)
    state._membership.shared = True
    state.set_study(study)
    return state


def test_a_second_tab_opens_on_the_first_tabs_plan_target_and_selection(study):
    first = shared_state(study)
    tensors = first.tensors["tensor"].tolist()[3:6]
    first.select(tensors)
    first.promote_selected()
    first.target = "a16w8+5%"
    second = shared_state(study)
    try:
        assert second.plan.hash == first.plan.hash and second.plan.hash != "" and second.sixteen_bit() == tensors
        assert second.selection == tensors and second.target == "a16w8+5%"
        second.select(tensors[:1])  # and back: the first tab follows the second
        assert first.selection == tensors[:1]
    finally:
        first.close()
        second.close()


def test_a_tab_cannot_start_a_second_analysis_and_sees_the_first_tabs_jobs(study):
    first, second = shared_state(study), shared_state(study)
    try:
        gate = __import__("threading").Event()
        job = first.submit("search", "searching (held)", lambda progress, cancel: gate.wait(30))
        shown = next(j for j in second.jobs if j.title == "searching (held)")  # a mirror of the first tab's job
        assert shown.cancel_event is job.cancel_event and shown.status in ("queued", "running")
        again = second.submit("search", "searching for another target", lambda progress, cancel: None)
        assert again is job and "already running" in second.message
        gate.set()
        assert job.wait(30) and job.status == "done"
        assert shown.status == "done"  # the mirror follows
        assert second.submit("search", "a new search", lambda progress, cancel: None) is not job
    finally:
        first.close()
        second.close()


def test_closing_a_tab_leaves_its_jobs_running_for_the_next_tab(study):
    import threading

    first = shared_state(study)
    gate = threading.Event()
    job = first.submit("evaluate", "a long evaluation", lambda progress, cancel: gate.wait(30) and "done")
    first.close()
    assert not job.cancel_event.is_set()
    back = shared_state(study)
    try:
        shown = next(j for j in back.jobs if j.title == "a long evaluation")
        assert shown.active and shown.cancel_event is job.cancel_event
        gate.set()
        assert job.wait(30) and job.status == "done" and job.result == "done"
    finally:
        back.close()


def test_a_notebook_state_shares_nothing(study):
    first = StudioState(study, auto_analyze=False)
    second = StudioState(study, auto_analyze=False)
    try:
        first.select(first.tensors["tensor"].tolist()[:2])
        assert second.selection == []
    finally:
        first.close()
        second.close()


def test_closing_a_tab_cancels_nothing_another_tab_started(study):
    import threading

    first, second = shared_state(study), shared_state(study)
    gate = threading.Event()
    job = first.submit("evaluate", "an evaluation of the first tab", lambda progress, cancel: gate.wait(30))
    try:
        second.close()
        assert not job.cancel_event.is_set() and job.active
    finally:
        gate.set()
        job.wait(30)
        first.close()


def test_stopping_the_server_cancels_the_jobs_tabs_left_running(study):
    import threading

    from mpstudio.widgets.study_session import cancel_all

    first = shared_state(study)
    gate = threading.Event()
    job = first.submit("search", "a search left running", lambda progress, cancel: cancel.wait(30))
    first.close()
    assert not job.cancel_event.is_set()
    cancel_all()  # what the server's exit runs
    try:
        assert job.cancel_event.is_set() and job.wait(30)
    finally:
        gate.set()


def test_a_tab_that_opens_another_study_leaves_the_first_one_as_its_other_tabs_have_it(study, tmp_path):
    """A tab opening another model starts it on a8w8 with nothing selected: that is its own, not the plan and
    selection of the tabs still on the study it left (nor of the tabs to come), and their jobs run on."""
    import threading

    first, second = shared_state(study), shared_state(study)
    other = make_small_study(tmp_path / "other", analyzed=False, baselines=False)
    gate = threading.Event()
    tensors = first.tensors["tensor"].tolist()[2:4]
    first.select(tensors)
    plan = first.promote_selected()
    job = second.submit("search", "a search of the second tab", lambda progress, cancel: gate.wait(30))
    try:
        first.set_study(other)
        assert first.study is other and first.sixteen_bit() == [] and first.selection == []
        assert second.plan.hash == plan.hash and second.selection == tensors
        assert not job.cancel_event.is_set() and job.active
        third = shared_state(study)
        assert third.plan.hash == plan.hash and third.selection == tensors
        third.close()
    finally:
        gate.set()
        job.wait(30)
        first.close()
        second.close()


def test_reopening_a_study_names_its_folder_not_where_the_server_keeps_it(study):
    """A reload reopens the tab's study, which may lie in the server's cache: the job bar names the study's folder,
    never the server's path to it."""
    state = StudioState(evaluate_on_edit=False, auto_analyze=False)
    try:
        job = state.open_study(study.folder)
        assert job.wait(60) and job.status == "done", job.error
        assert study.folder.name in job.title and str(study.folder.parent) not in job.title
    finally:
        state.close()
