"""Studio: every view over one StudioState, laid out for the browser (a template when served) or a notebook."""

from __future__ import annotations

import html

import panel as pn
import param

from .base import laid_out_once
from .export_panel import ExportPanel
from .graph_view import GraphView
from .model_panel import ModelPanel
from .pareto import ParetoPlot
from .run_panel import RunPanel
from .state import StudioState, session_document
from .table import SensitivityTable

TITLE = "mpstudio: mixed precision for Qualcomm NPUs"


class Studio(pn.viewable.Viewer):
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

    def status(self):
        """The error (if any) and the last message."""
        error = pn.pane.Alert(pn.bind(_text, self.state.param.error), alert_type="danger",
                              visible=self.state.param.error.rx().rx.bool(), sizing_mode="stretch_width",
                              css_classes=["mpstudio-error"], margin=(0, 10))
        message = pn.pane.HTML(pn.bind(lambda m: f"<span class='mpstudio-message' style='font-size:12px;color:#333'>"
                                                 f"{html.escape(m)}</span>", self.state.param.message),
                               sizing_mode="stretch_width", margin=(0, 10))
        return pn.Column(error, message, sizing_mode="stretch_width")

    def sidebar(self):
        return [self.model, pn.layout.Divider(), self.run, pn.layout.Divider(), self.export]

    def main(self):
        return pn.Column(
            self.status(),
            pn.Row(pn.Column(self.graph, sizing_mode="stretch_both", min_width=480),
                   pn.Column(self.pareto, self.table, sizing_mode="stretch_both", min_width=420),
                   sizing_mode="stretch_both"),
            sizing_mode="stretch_both", min_height=760,
        )

    @laid_out_once
    def __panel__(self):
        return pn.Row(pn.Column(*self.sidebar(), width=320), self.main(), sizing_mode="stretch_both",
                      min_height=800)

    def servable(self, title: str = TITLE, **kwargs):
        """In `panel serve`: the studio in a template (and the session's jobs stopped when it closes)."""
        if served():
            pn.state.on_session_destroyed(lambda context: self.state.close())
            self.template(title).servable(title=title, **kwargs)
        return self

    def template(self, title: str = TITLE):
        """The studio as a page: panels in the sidebar, the views in the main area."""
        return pn.template.FastListTemplate(title=title, sidebar=self.sidebar(), main=[self.main()], sidebar_width=340,
                                            accent="#0b6e99", main_layout=None)


def served() -> bool:
    """True inside a `panel serve` session. (`pn.state.served` asks whether its caller's module is the served
    script, which a library's module never is; a session's document is what it stands for.)"""
    return session_document() is not None


def _text(message: str) -> str:
    return message
