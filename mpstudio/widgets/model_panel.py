"""ModelPanel: open a model and a data folder, a study folder, or the demo; show the QNN support report."""

from __future__ import annotations

import html

import panel as pn
import param

from .base import View, laid_out_once, shows_errors
from .state import StudioState


class ModelPanel(View):
    """What the studio works on, and what preparing the model found."""

    state = param.ClassSelector(class_=StudioState)

    def __init__(self, **params):
        super().__init__(**params)
        state = self.state
        self._model = pn.widgets.TextInput.from_param(state.param.model_path, name="Model (.onnx)",
                                                      placeholder="path/to/model.onnx", sizing_mode="stretch_width")
        self._data = pn.widgets.TextInput.from_param(state.param.data_path, name="Data folder (.npz samples)",
                                                     placeholder="path/to/samples/", sizing_mode="stretch_width")
        self._shapes = pn.widgets.TextInput.from_param(state.param.input_shapes, name="Input shapes (if dynamic)",
                                                       placeholder="x=1,3,224,224", sizing_mode="stretch_width")
        self._fallback = pn.widgets.Checkbox.from_param(state.param.allow_fallback,
                                                        name="Allow CPU fallback (nodes HTP lacks run on CPU)")
        self._open_model = pn.widgets.Button(name="Open model", button_type="primary", sizing_mode="stretch_width")
        self._study = pn.widgets.TextInput.from_param(state.param.study_path, name="Study folder",
                                                      placeholder="path/to/study/", sizing_mode="stretch_width")
        self._open_study = pn.widgets.Button(name="Open study", sizing_mode="stretch_width")
        self._open_demo = pn.widgets.Button(name="Open the demo", button_type="light", sizing_mode="stretch_width")
        self._open_model.on_click(self._on_open_model)
        self._open_study.on_click(self._on_open_study)
        self._open_demo.on_click(self._on_open_demo)

    @laid_out_once
    def __panel__(self):
        return pn.Column(
            pn.pane.HTML("<b>Model and data</b>"), pn.pane.HTML(pn.bind(self._summary, self.state.param.study),
                                                                sizing_mode="stretch_width"),
            self._model, self._data, self._shapes, self._fallback, self._open_model, self._study, self._open_study, self._open_demo,
            pn.Card(pn.pane.HTML(pn.bind(self._report, self.state.param.study), sizing_mode="stretch_width"),
                    title="QNN support report", collapsed=True, sizing_mode="stretch_width"),
            sizing_mode="stretch_width",
        )

    @staticmethod
    def _summary(study) -> str:
        if study is None:
            return "<span style='color:#666;font-size:12px'>nothing open yet</span>"
        ready = ("<span style='color:#2a7d2a'>runs fully on QNN HTP</span>" if study.prepared.qnn_ready
                 else "<span style='color:#b00'>some nodes fall back to CPU</span>")
        return (f"<div style='font-size:12px'><b>{html.escape(study.name)}</b><br>{len(study.graph.nodes)} nodes, "
                f"{len(study.graph.activations())} activations; metric {html.escape(study.metric_name)}; "
                f"{len(study.evaluation_data)} evaluation samples; HTP v{study.htp_arch}; {ready}</div>")

    @staticmethod
    def _report(study) -> str:
        if study is None:
            return ""
        # Hashes and paths are long unbroken words: they break anywhere rather than run out of the card.
        return (f"<pre class='qnn-report' style='font-size:11px;white-space:pre-wrap;overflow-wrap:anywhere;"
                f"word-break:break-all'>"
                f"{html.escape(study.prepared.report())}</pre>")

    @shows_errors
    def _on_open_model(self, event):
        self.state.open_model()

    @shows_errors
    def _on_open_study(self, event):
        self.state.open_study()

    @shows_errors
    def _on_open_demo(self, event):
        self.state.open_demo()
