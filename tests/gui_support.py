"""What the studio's tests share: a small prepared study, a Chromium to drive, a Panel server on a free port,
and BokehJS look-ups from the page (screen positions of data points, data of a named renderer's source)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import onnx

from gui_models import make_residual_model

SMALL_NODES = 60
SMALL_SIZE = 8


def chromium_path() -> str | None:
    """Debian's chromium (what scripts/install-browser installs), or MPSTUDIO_CHROMIUM."""
    override = os.environ.get("MPSTUDIO_CHROMIUM")
    if override and Path(override).is_file():
        return override
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


def small_feeds(n: int = 12, seed: int = 0):
    from mpstudio.data import FeedList

    rng = np.random.default_rng(seed)
    return FeedList([{"x": rng.normal(0, 1, (1, 3, SMALL_SIZE, SMALL_SIZE)).astype(np.float32)} for _ in range(n)],
                    name="random")


def make_small_study(folder: Path, analyzed: bool = True, baselines: bool = True, nodes: int = SMALL_NODES,
                     name: str = "small residual net"):
    """A study (called `name`) of a 60-node (or `nodes`) residual model on 12 random samples (output SNR metric):
    seconds to analyse."""
    from mpstudio.study import Study

    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    model = folder.parent / f"{folder.name}.onnx"
    onnx.save(make_residual_model(nodes, size=SMALL_SIZE), model)
    study = Study.create(folder, model, small_feeds(), name=name)
    if analyzed:
        study.sensitivity()
    if baselines:
        study.baselines()
    return study


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def accepts_connections(port: int) -> bool:
    """A server listens on `port` of loopback (checked without opening a session, which would start a studio)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def stop_process(process, timeout: float = 20.0) -> None:
    """Stop a served studio (or any child process): terminated, killed if it does not end within `timeout` s."""
    process.terminate()
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()


def wait_until(condition, timeout: float = 30.0, interval: float = 0.05, message: str = ""):
    """Poll `condition` until it returns something truthy; its value, or AssertionError after `timeout` s.

    The pause between polls grows from `interval` to half a second: a condition that reads the page runs in the
    browser's main thread, and polled every 50 ms on a loaded machine it starves the page of the time it needs to
    apply the server's updates (the update waited for then never shows)."""
    deadline = time.monotonic() + timeout
    pause = interval
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(message or f"condition not met within {timeout} s")
        time.sleep(pause)
        pause = min(max(interval, 0.5), pause * 1.5)


def page_log(page) -> list[str]:
    """The page's console errors and warnings and its uncaught exceptions, from now on (a list that grows): what a
    failing browser test says besides what it waited for."""
    lines: list[str] = []
    page.on("console", lambda m: lines.append(f"{m.type}: {m.text[:300]}") if m.type in ("error", "warning")
            and "could not set initial ranges" not in m.text else None)
    page.on("pageerror", lambda error: lines.append(f"uncaught: {str(error)[:300]}"))
    return lines


class PanelServer:
    """`pn.serve` of `factory` (called once per session) in a thread, on a free port of 127.0.0.1."""

    def __init__(self, factory, path: str = "studio", **server_options):
        import panel as pn

        self.port = free_port()
        self.path = path
        self.thread = pn.serve({path: factory}, port=self.port, address="127.0.0.1", threaded=True, show=False,
                               verbose=False, websocket_origin=[f"127.0.0.1:{self.port}", f"localhost:{self.port}"],
                               **server_options)
        wait_until(self._alive, 30, message="the Panel server did not start")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/{self.path}"

    def _alive(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                return True
        except OSError:
            return False

    def stop(self) -> None:
        self.thread.stop()


@contextmanager
def studio_server(study, closes_states: bool = False, **server_options):
    """A Panel server whose every session is a studio on `study`; its `.states` holds the sessions' states.
    `closes_states`: a session that ends closes its state, as `panel serve app.py` does (else they are closed when
    the server stops); `server_options`: Bokeh's, such as unused_session_lifetime_milliseconds (how soon the
    session of a closed tab ends)."""
    import panel as pn

    from mpstudio.widgets import Studio, StudioState

    states = []

    def session():
        state = StudioState(study)
        states.append(state)
        if closes_states:
            pn.state.on_session_destroyed(lambda context: state.close())
        return Studio(state).template()

    server = PanelServer(session, **server_options)
    server.states = states
    server.folder = getattr(study, "folder", study)
    try:
        yield server
    finally:
        for state in states:
            state.close()
        server.stop()


def open_studio(page, studio):
    """Load the studio of `studio_server` as a first visitor (the server's shared record of the study, which a
    reload or a second tab would take over, is dropped first) and wait until its graph and ranking are shown; its
    session's state."""
    if getattr(studio, "folder", None) is not None:
        from mpstudio.widgets.study_session import forget

        forget(studio.folder)
    page.goto(studio.url)
    wait_for_bokeh(page)
    state = wait_until(lambda: studio.states[-1] if studio.states else None)
    wait_until(lambda: state.report is not None, 120, message="the sensitivity report did not load")
    wait_until(lambda: len(source_column(page, "nodes", "id") or []) == len(state.layout), 60)
    page.locator(".tabulator-row").first.wait_for(state="visible")
    wait_centred(page, state)
    return state


def on_loop(state, fn, timeout: float = 60):
    """fn() run where the session's Bokeh models may be touched (its event loop), as a user's click would be; its
    result. A change made from this thread instead races the server's own writes to the page: BokehJS then meets
    references to models it was never sent ("reference p1599 isn't known") and drops the updates that name them.
    (The state's own verbs do this themselves: `Lanes.call`.)"""
    return state._lanes.call(fn, timeout)


def wait_for_bokeh(page, timeout_ms: int = 60000) -> None:
    """Wait until the page's Bokeh document exists and has rendered (its idle signal fired)."""
    page.wait_for_function("() => window.Bokeh !== undefined && Bokeh.documents.length > 0 && "
                           "Bokeh.documents[0].is_idle", timeout=timeout_ms)


# ---- BokehJS look-ups --------------------------------------------------------------------------------------
SCREEN_POINTS = """
([figure, xs, ys]) => {
  const model = Bokeh.documents[0].get_model_by_name(figure);
  const view = model == null ? null : Bokeh.index.find_one(model);
  if (view == null) return null;
  const rect = view.canvas_view.el.getBoundingClientRect();
  const sx = view.frame.x_scale, sy = view.frame.y_scale;
  return xs.map((x, i) => [rect.left + sx.compute(x), rect.top + sy.compute(ys[i])]);
}
"""

SOURCE_DATA = """
([renderer, column]) => {
  const doc = Bokeh.documents[0];
  const model = doc.get_model_by_name(renderer);
  if (model == null) return null;
  const data = model.data_source.data;
  const value = data instanceof Map ? data.get(column) : data[column];
  return value == null ? null : Array.from(value);
}
"""

SELECTED = """
(renderer) => {
  const model = Bokeh.documents[0].get_model_by_name(renderer);
  return model == null ? null : Array.from(model.data_source.selected.indices);
}
"""


def screen_points(page, figure: str, xs, ys):
    return page.evaluate(SCREEN_POINTS, [figure, list(map(float, xs)), list(map(float, ys))])


def source_column(page, renderer: str, column: str):
    return page.evaluate(SOURCE_DATA, [renderer, column])


def selected_rows(page, renderer: str):
    return page.evaluate(SELECTED, renderer)

TABLE_SELECTION = """
() => {
  for (const model of Bokeh.documents[0].all_models) {
    if (model.type === "DataTabulator" || model.constructor.__name__ === "DataTabulator") {
      const names = model.source.data instanceof Map ? model.source.data.get("tensor") : model.source.data.tensor;
      return Array.from(model.source.selected.indices).map((i) => names[i]);
    }
  }
  return null;
}
"""


def table_selection(page):
    """The tensors selected in the page's Tabulator (its Bokeh model, so rows scrolled out of view count)."""
    return page.evaluate(TABLE_SELECTION)

FIGURE_BOX = """
(name) => {
  const model = Bokeh.documents[0].get_model_by_name(name);
  const view = model == null ? null : Bokeh.index.find_one(model);
  if (view == null) return null;
  const r = view.el.getBoundingClientRect();
  return {x: r.left, y: r.top, width: r.width, height: r.height};
}
"""


def figure_box(page, name: str):
    """The page rectangle of the figure called `name` (its toolbar and colour bar included)."""
    return page.evaluate(FIGURE_BOX, name)


FRAME_BOX = """
(name) => {
  const model = Bokeh.documents[0].get_model_by_name(name);
  const view = model == null ? null : Bokeh.index.find_one(model);
  if (view == null) return null;
  const r = view.canvas_view.el.getBoundingClientRect(), f = view.frame.bbox;
  return {x: r.left + f.left, y: r.top + f.top, width: f.width, height: f.height};
}
"""


def frame_box(page, name: str):
    """The page rectangle of the plotting area of the figure called `name`: where its glyphs are drawn and
    hovered (a point outside it is clipped; the toolbar above it takes the pointer)."""
    return page.evaluate(FRAME_BOX, name)


def drag_box(page, points, rows, pad: float = 6.0):
    """Drag a box-select around the screen `points` of `rows`; the rows whose points fall inside the box."""
    box = [points[i] for i in rows]
    x0, x1 = min(p[0] for p in box) - pad, max(p[0] for p in box) + pad
    y0, y1 = min(p[1] for p in box) - pad, max(p[1] for p in box) + pad
    inside = [i for i, (x, y) in enumerate(points) if x0 <= x <= x1 and y0 <= y <= y1]
    page.mouse.move(x0, y0)
    page.mouse.down()
    page.mouse.move((x0 + x1) / 2, (y0 + y1) / 2, steps=5)
    page.mouse.move(x1, y1, steps=5)
    page.mouse.up()
    return inside


def visible_rows(page, figure: str, points, count: int, margin: float = 15.0):
    """`count` consecutive source rows whose screen points lie well inside the figure's plotting area (the graph
    opens on the most sensitive region, so which rows are in view depends on the ranking)."""
    frame = frame_box(page, figure)
    inside = [frame["x"] + margin <= x <= frame["x"] + frame["width"] - margin
              and frame["y"] + margin <= y <= frame["y"] + frame["height"] - margin for x, y in points]
    for start in range(len(points) - count + 1):
        if all(inside[start:start + count]):
            return list(range(start, start + count))
    raise AssertionError(f"no {count} consecutive nodes in view")


Y_RANGE = """
(name) => {
  const model = Bokeh.documents[0].get_model_by_name(name);
  return model == null ? null : [model.y_range.start, model.y_range.end];
}
"""


def y_range(page, figure: str):
    return page.evaluate(Y_RANGE, figure)


def top_ranked_row(page, state):
    """The graph's source row drawing the top-ranked tensor, and that tensor; None while nothing is ranked (the
    opening replaces the ranking with its base plan's)."""
    ranked = state.tensors.dropna(subset=["rank"])
    if ranked.empty:
        return None
    tensor = ranked.loc[ranked["rank"].idxmin(), "tensor"]
    node = state.tensors.set_index("tensor").loc[tensor, "node"] or f"input:{tensor}"
    return source_column(page, "nodes", "id").index(node), tensor


def wait_centred(page, state, timeout: float = 60.0):
    """Wait until the graph's window shows the top-ranked tensor's node (it opens on the most sensitive region);
    the ranking is read at each look, since it may change its head while the studio opens."""
    seen = {}

    def shown():
        top = top_ranked_row(page, state)
        if top is None:
            return False
        row, tensor = top
        y = source_column(page, "nodes", "y")[row]
        span = y_range(page, "graph")
        seen.update(tensor=tensor, y=y, window=span, focus=state.focus)
        return span is not None and span[0] + 0.5 <= y <= span[1] - 0.5
    try:
        wait_until(shown, timeout)
    except AssertionError:
        raise AssertionError(f"the graph did not open on the top-ranked tensor: {seen}") from None
