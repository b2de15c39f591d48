"""Studio: every view over one StudioState, laid out for the browser (a template when served) or a notebook."""

from __future__ import annotations

import functools
import html

import panel as pn
import param

from .base import View, laid_out_once, save_inline
from .export_panel import ExportPanel
from .graph_view import GraphView
from .jobs import JobBar
from .lanes import session_document
from .model_panel import ModelPanel
from .blocks_view import BlocksView
from .compare_view import CompareView
from .latency_view import NodeLatencyView
from .opening_base import BaseHint
from .pareto import PLOT_MIN_HEIGHT, ParetoPlot
from .run_panel import RunPanel
from .search_card import SearchCard
from .state import StudioState
from .table import TABLE_MIN_HEIGHT, SensitivityTable

TITLE = "mpstudio: mixed precision for Qualcomm NPUs"
# The views' least height, a shorter window scrolls: the job bar and message line, the Pareto plot with its header
# and note, the ranking table with its caption and status.
MAIN_MIN_HEIGHT = 100 + (PLOT_MIN_HEIGHT + 110) + (TABLE_MIN_HEIGHT + 80)


class Studio(View):
    """The graph, the ranking, the Pareto plot and the panels that drive them."""

    state = param.ClassSelector(class_=StudioState)

    def __init__(self, state: StudioState | None = None, **params):
        super().__init__(state=state if state is not None else StudioState(), **params)
        self.graph = GraphView(state=self.state)
        self.table = SensitivityTable(state=self.state)
        self.pareto = ParetoPlot(state=self.state)
        self.run = RunPanel(state=self.state)
        self.export = ExportPanel(state=self.state)
        self.model = ModelPanel(state=self.state)
        self.job_bar = JobBar(state=self.state)
        self.search_card = SearchCard(state=self.state)
        self.base_hint = BaseHint(state=self.state)
        self.latency = NodeLatencyView(state=self.state)
        self.blocks = BlocksView(state=self.state, latency=self.latency)
        self.compare = CompareView(state=self.state)

    def status(self):
        """The last message on one line of fixed height, and the error (if any) as a dismissible toast that
        floats over the page: showing or hiding it never moves the views."""
        return pn.Column(self._message(), self._error_toast(), sizing_mode="stretch_width", height=24,
                         margin=0)

    def _message(self):
        return pn.pane.HTML(pn.bind(message_html, self.state.param.message), sizing_mode="stretch_width", height=22,
                            margin=(0, 10))

    def _error_toast(self):
        error = pn.pane.Alert(pn.bind(_text, self.state.param.error), alert_type="danger", sizing_mode="stretch_width",
                              css_classes=["mpstudio-error"], margin=(5, 5), min_height=40,
                              styles={"max-height": "66px", "overflow-y": "auto"})
        dismiss = pn.widgets.Button(name="\u2715", button_type="light", width=36, height=32, margin=(8, 5),
                                    description="Dismiss this message", css_classes=["mpstudio-dismiss"])
        dismiss.on_click(self._on_dismiss)
        # Over the job bar's right end and the message line, never lower: a long message scrolls in its box
        # rather than growing over the Pareto plot's header.
        return pn.Row(error, dismiss, visible=self.state.param.error.rx().rx.bool(), width=480,
                      css_classes=["mpstudio-toast"],
                      styles={"position": "fixed", "top": "64px", "right": "24px", "z-index": "1000",
                              "background": "white", "border-radius": "6px",
                              "box-shadow": "0 4px 14px rgba(0, 0, 0, 0.25)"})

    def _on_dismiss(self, event):
        self.state.dismiss_error()

    def save(self, filename, title: str = TITLE, resources="inline", **kwargs):
        """A static HTML page of the studio as it is now, rendering offline (scripts inlined)."""
        return save_inline(self, filename, title=title, resources=resources, **kwargs)

    def sidebar(self):
        return [self.model, pn.layout.Divider(), self.run, pn.layout.Divider(), self.export]

    def main(self):
        return pn.Column(
            self.job_bar,
            self.status(),
            self.base_hint,
            self.search_card,
            pn.Row(pn.Column(self.graph, sizing_mode="stretch_both", min_width=480),
                   pn.Column(self.pareto, self.tabs(), sizing_mode="stretch_both", min_width=420),
                   sizing_mode="stretch_both"),
            sizing_mode="stretch_both", min_height=MAIN_MIN_HEIGHT,
        )

    def tabs(self):
        """The ranking, and beside it where the time goes, block totals and two plans compared (a tab is rendered
        when shown: a Tabulator updated while hidden fails in the browser)."""
        return pn.Tabs(("Ranking", self.table), ("Time per node", self.latency), ("Blocks", self.blocks),
                       ("Compare plans", self.compare), sizing_mode="stretch_both", min_height=TABLE_MIN_HEIGHT + 80,
                       dynamic=True)

    @laid_out_once
    def __panel__(self):
        return pn.Row(pn.Column(*self.sidebar(), width=320), self.main(), sizing_mode="stretch_both",
                      min_height=MAIN_MIN_HEIGHT + 40)

    def servable(self, title: str = TITLE, **kwargs):
        """In `panel serve`: the studio in a template (and the session's jobs stopped when it closes)."""
        if served():
            pn.state.on_session_destroyed(lambda context: self.state.close())
            self.template(title).servable(title=title, **kwargs)
        return self

    def template(self, title: str = TITLE):
        """The studio as a page: panels in the sidebar, the views in the main area."""
        return pn.template.FastListTemplate(title=title, sidebar=self.sidebar(), main=[self.main()], sidebar_width=340,
                                            accent="#0b6e99", main_layout=None, raw_css=[TOOLTIP_CSS],
                                            design=_fast_without_web_font())


# A hover's tooltip (BokehJS places it on the side of its point with room, inside the window) is never wider than
# half the window, so one side always has room: long names and sources wrap instead of running off the page.
TOOLTIP_CSS = """.bk-Tooltip { max-width: min(560px, calc(50vw - 40px)); white-space: normal; overflow-wrap: anywhere; }"""


@functools.cache
def _fast_without_web_font():
    """Panel's Fast design without its web font: the template would have every page ask a font site for Open Sans
    (a request that fails offline and tells a third party who opens the studio); the system's sans-serif serves."""
    from panel.theme import Fast

    # Named as Panel's: the design's files are looked up by its class name.
    return type("Fast", (Fast,), {"_resources": {**Fast._resources, "font": {}}})


def served() -> bool:
    """True inside a `panel serve` session. (`pn.state.served` asks whether its caller's module is the served
    script, which a library's module never is; a session's document is what it stands for.)"""
    return session_document() is not None


def message_html(message: str) -> str:
    """The message line: one line of fixed height; a message longer than the window ends in an ellipsis and is
    whole in the line's tooltip (a cut that says so, never text that just stops at the edge)."""
    text = html.escape(message)
    return (f"<div class='mpstudio-message' title='{text}' style='font-size:12px;color:#333;white-space:nowrap;"
            f"overflow:hidden;text-overflow:ellipsis;max-width:100%'>{text}</div>")


def _text(message: str) -> str:
    """An error message as the alert's Markdown shows it: its text, never markup (messages quote paths, files and
    what agents answered)."""
    return html.escape(message)
