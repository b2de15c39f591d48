"""A search run in a served studio (headless Chromium, a real study without baselines): every plan it stores
reaches the page's Pareto plot, the front drawn is the study's front, the ring sits on a drawn point of the
recommended plan, and the page logs no error on the way (BokehJS drops an update that names a model it was
never sent, and the plot then keeps an old front under a new ring)."""

from __future__ import annotations

import pytest

from gui_support import chromium_path, make_small_study, on_loop, open_studio, source_column, studio_server, wait_until

pytestmark = [pytest.mark.filterwarnings("ignore::PendingDeprecationWarning"),
              pytest.mark.skipif(chromium_path() is None, reason="no Chromium: run scripts/install-browser")]


@pytest.mark.slow
def test_a_search_leaves_every_stored_plan_on_the_page_plot(browser, tmp_path):
    study = make_small_study(tmp_path / "study", baselines=False)  # the search stores the baselines itself
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    page = context.new_page()
    page.set_default_timeout(60000)
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(f"page error: {error}"))
    page.on("console", lambda message: errors.append(f"console: {message.text}")
            if message.type == "error" and "net::ERR_" not in message.text else None)
    try:
        with studio_server(study) as studio:
            state = open_studio(page, studio)

            def start():  # as the Run panel's button does, on the session's event loop
                state.confirm_search = False
                return state.start_search("a16w8+10%", max_evaluations=6)
            job = on_loop(state, start)
            assert job.wait(600) and job.status == "done", (job.status, job.error)
            front = study.front("estimate")
            stored = sorted(front["plan_id"].astype(int))
            assert len(stored) >= 4  # a8w8, a16w8 and their per-channel forms at least

            def drawn():
                return sorted(int(p) for p in source_column(page, "points", "plan_id") or [])
            wait_until(lambda: drawn() == stored, 60,
                       message=f"the page draws plans {drawn()}, the study holds {stored}")
            on_front = front[front["pareto"].astype(bool)].sort_values("latency_ms")
            want = [round(float(x), 9) for x in on_front["latency_ms"]]
            wait_until(lambda: [round(float(x), 9) for x in source_column(page, "front", "x") or []] == want, 30,
                       message=f"the drawn front {source_column(page, 'front', 'x')} is not the study's {want}")
            # The ring: on the recommended plan's drawn point.
            wait_until(lambda: state.plan_id is not None, 30)
            row = [int(p) for p in source_column(page, "points", "plan_id")].index(state.plan_id)
            x = source_column(page, "points", "latency_ms")[row]
            wait_until(lambda: source_column(page, "current", "x") == [x], 30,
                       message=f"the ring {source_column(page, 'current', 'x')} is not on plan {state.plan_id}")
            page.wait_for_timeout(500)
            assert errors == [], errors[:5]
    finally:
        context.close()
        study.close()
