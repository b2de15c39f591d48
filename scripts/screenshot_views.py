"""The review set of screenshots of one study at one window size (scripts/screenshots.py --views): the opening
view, a promotion's paired first value, the search result card after a short search, where the time goes per
node, block totals and two plans compared. Also: a study of any ONNX model on random inputs (--model)."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import numpy as np

from gui_support import PanelServer, on_loop, source_column, wait_for_bokeh, wait_until

VIEWS = ("opening", "paired", "search", "latency", "blocks", "compare")


def random_feeds(model_path: Path, count: int, seed: int):
    """`count` random feeds for the model's inputs: token ids in [1000, 2000) for integer inputs (ones for an
    input named like a mask), standard normal values for float ones; a dynamic dimension is 1."""
    import onnx

    from mpstudio.data import FeedList

    model = onnx.load(str(model_path), load_external_data=False)
    initializers = {i.name for i in model.graph.initializer}
    inputs = [i for i in model.graph.input if i.name not in initializers]
    rng = np.random.default_rng(seed)
    feeds = []
    for _ in range(count):
        feed = {}
        for i in inputs:
            shape = [d.dim_value if d.dim_value > 0 else 1 for d in i.type.tensor_type.shape.dim]
            dtype = onnx.helper.tensor_dtype_to_np_dtype(i.type.tensor_type.elem_type)
            if np.issubdtype(dtype, np.integer):
                feed[i.name] = (np.ones(shape, dtype) if "mask" in i.name.lower() else
                                rng.integers(1000, 2000, shape).astype(dtype))
            else:
                feed[i.name] = rng.normal(0, 1, shape).astype(dtype)
        feeds.append(feed)
    return FeedList(feeds, name="random inputs")


def model_study(model_path: Path, folder: Path, samples: int, progress):
    """A study of `model_path` on random inputs, output cosine against the float model (reopened when it exists),
    analysed, with its baselines."""
    from mpstudio.metrics import metric_spec
    from mpstudio.study import STUDY_FILE, Study

    if (folder / STUDY_FILE).exists():
        study = Study.open(folder)
    else:
        study = Study.create(folder, model_path, random_feeds(model_path, samples, 1),
                             random_feeds(model_path, samples, 2), metric=metric_spec("cosine"),
                             name=model_path.stem, progress=progress)
    if study.sensitivity_reports.latest is None:
        study.sensitivity(samples=min(16, samples), isolation_samples=4, progress=progress)
    study.baselines(progress=progress)
    return study


class Shooter:
    """One served studio on `study`, photographed at one window size into `out` (<view>-<W>x<H>.png); `ranked`: the
    top-ranked tensors, three of which it promotes."""

    def __init__(self, study, out: Path, size: tuple[int, int], ranked: list[str], target: str | None,
                 search_budget: int):
        self.study, self.out, self.size = study, out, size
        self.promote, self.target, self.search_budget = ranked, target, search_budget
        self.states = []
        self.held = threading.Event()
        self.hold_hash = None  # the plan whose first value is held until photographed

    def path(self, view: str) -> Path:
        return self.out / f"{view}-{self.size[0]}x{self.size[1]}.png"

    def run(self, browser) -> list[Path]:
        from mpstudio.widgets import Studio, StudioState
        from mpstudio.widgets.study_session import forget

        def session():
            state = StudioState(self.study)
            if state.study is not self.study and not getattr(state.study.evaluate, "holds", False):
                state.study.evaluate = self._holding(state.study.evaluate)  # the session's own Study object
            self.states.append(state)
            return Studio(state).template()

        forget(self.study.folder)  # a first visitor: the studio as it opens, not a shared earlier session
        server = PanelServer(session)
        evaluate = self.study.evaluate
        self.study.evaluate = self._holding(evaluate)
        try:
            page = browser.new_page(viewport={"width": self.size[0], "height": self.size[1]}, device_scale_factor=1)
            cdn = []
            page.on("requestfailed", lambda request: cdn.append(request.url) if "cdn." in request.url else None)
            # A browser error (a document patch BokehJS could not apply) leaves the page behind the server: say so.
            page.on("console", lambda message: print(f"browser {message.type}: {message.text}", file=sys.stderr)
                    if message.type == "error" else None)
            page.on("pageerror", lambda error: print(f"browser error: {error}", file=sys.stderr))
            page.goto(server.url, timeout=600000)  # a loaded machine builds a session of a big model slowly
            wait_for_bokeh(page, 180000)
            if cdn:  # stylesheets named by CDN address, unreachable offline: the page is unstyled
                print(f"{len(cdn)} stylesheet(s) asked of a CDN ({cdn[0]}): reloading", file=sys.stderr)
                page.reload(timeout=600000)
                wait_for_bokeh(page, 180000)
            state = wait_until(lambda: self.states[-1] if self.states else None, 60)
            shots = []
            for view in VIEWS:
                try:
                    shots.append(getattr(self, f"_{view}")(page, state))
                except Exception as exc:  # the views after it are still worth a look
                    print(f"{view} at {self.size[0]}x{self.size[1]} failed: {exc}", file=sys.stderr)
                    page.screenshot(path=str(self.path(f"{view}-failed")))
            page.close()
            return shots
        finally:
            self.held.set()
            self.study.evaluate = evaluate
            for state in self.states:
                state.close()
            server.stop()

    def _holding(self, evaluate):
        """study.evaluate that, for the promotion photographed (`self.hold_hash`) when streamed, waits after its first
        partial value until it is photographed (a loaded server may otherwise send the whole evaluation to the page as
        one batch); every other evaluation (the baselines the studio runs in the background) runs through."""
        def held_evaluate(*args, partial=None, **kwargs):
            plan = args[0] if args else kwargs.get("plan")
            if partial is None or getattr(plan, "hash", None) != self.hold_hash:
                return evaluate(*args, partial=partial, **kwargs)

            def first(point):
                partial(point)
                print(f"first value on {point.samples} of {point.total} samples: held until photographed",
                      file=sys.stderr, flush=True)
                self.held.wait(300)
            return evaluate(*args, partial=first, **kwargs)
        held_evaluate.holds = True
        return held_evaluate

    def _settle(self, state, seconds: float = 2.0, timeout: float = 600):
        """Wait for the studio's jobs to end, but for a sensitivity analysis (minutes on a big model: the studio
        shows its partial rankings meanwhile, and the views are photographed as they are)."""
        wait_until(lambda: not any(job.active and job.kind != "analyze" for job in state.jobs), timeout, 0.2,
                   "the studio's jobs did not end")
        time.sleep(seconds)

    def _opening(self, page, state) -> Path:
        wait_until(lambda: state.report is not None, 600, message="the sensitivity report did not load")
        wait_until(lambda: len(source_column(page, "nodes", "id") or []) == len(state.layout), 120)
        page.locator(".tabulator-row").first.wait_for(state="visible", timeout=120000)
        self._settle(state)
        page.screenshot(path=str(self.path("opening")))
        return self.path("opening")

    def _paired(self, page, state) -> Path:
        self.held.clear()
        # Three top-ranked tensors whose promotion the study has not evaluated (a stored plan shows no partial value).
        groups = [self.promote[i:i + 3] for i in range(0, len(self.promote) - 2, 3)]
        tensors = next((g for g in groups if self.study.plan_id(state.plan.promote(g)) is None), groups[-1])
        self.hold_hash = state.plan.promote(tensors).hash
        on_loop(state, lambda: state.select(tensors))
        wait_until(lambda: state.selection == tensors, 30)
        page.get_by_role("button", name="Promote to 16-bit").click()
        # The partial value (paired, or saying why not) in the studio, then on the page above the plot.
        wait_until(lambda: (self.states[-1].provisional["kind"] == "partial").any(), 300, 0.1, "no partial value")
        try:
            page.locator(".mpstudio-paired").first.wait_for(state="visible", timeout=60000)
        except Exception as exc:
            print(f"the paired note did not show: {exc}", file=sys.stderr)
        time.sleep(2)  # the plot redraws
        page.screenshot(path=str(self.path("paired")))
        self.held.set()
        self._settle(state)
        return self.path("paired")

    def _search(self, page, state) -> Path:
        def start():
            state.confirm_search = False  # a short search on the CPU: the card's HTP table needs minutes per plan
            if self.target:
                state.target = self.target
            return state.start_search(max_evaluations=self.search_budget)
        job = on_loop(state, start)
        if not job.wait(1800) or job.status != "done":
            print(f"search: {job.status} {job.error}", file=sys.stderr)
        page.locator(".mpstudio-search-card").first.wait_for(state="visible", timeout=120000)
        self._settle(state)
        page.screenshot(path=str(self.path("search")))
        return self.path("search")

    def _tab(self, page, state, name: str):
        tab = page.locator(".bk-tab", has_text=name).first
        tab.click()
        time.sleep(1)
        self._settle(state)
        # The page scrolls so that the tab's header is at the top: its view in whole, as a reader scrolls to it
        # (the search card above the views takes a fifth of the window).
        tab.evaluate("(el) => el.scrollIntoView({block: 'start'})")
        time.sleep(0.5)

    def _latency(self, page, state) -> Path:
        self._tab(page, state, "Time per node")
        page.get_by_role("button", name="Colour the graph by latency share").click()
        self._settle(state)
        page.screenshot(path=str(self.path("latency")))
        return self.path("latency")

    def _blocks(self, page, state) -> Path:
        self._tab(page, state, "Blocks")
        page.screenshot(path=str(self.path("blocks")))
        return self.path("blocks")

    def _compare(self, page, state) -> Path:
        self._tab(page, state, "Compare plans")
        page.get_by_role("button", name="Compare", exact=True).click()
        page.get_by_text("activation tensor(s) differ").first.wait_for(state="visible", timeout=300000)
        self._settle(state)
        page.screenshot(path=str(self.path("compare")))
        return self.path("compare")
