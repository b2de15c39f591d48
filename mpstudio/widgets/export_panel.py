"""ExportPanel: download the current plan as ORT TensorQuantOverrides JSON, QNN/AIMET encodings JSON, the QDQ
model, or every file an export writes in one zip."""

from __future__ import annotations

import zipfile

import param
import panel as pn

from .base import View, laid_out_once
from ..errors import MpstudioError
from ..export import export_name
from .state import StudioState

# format -> (button label, file suffix)
DOWNLOADS = {"ort": ("TensorQuantOverrides JSON", ".overrides.json"), "qnn": ("Encodings JSON", ".encodings.json"),
             "model": ("QDQ model (.onnx)", ".qdq.onnx"),
             "all": ("All files (.zip)", ".zip")}
DESCRIPTIONS = {"all": "The plan, both JSON files, the QDQ model, the prepared float model whose tensor names the JSON "
                       "files use, and a README saying what to pass to ORT or QNN for each"}
# The zip: the JSON files name the tensors of the prepared float model and leave the defaults to the plan, so other
# tools reproduce the plan only with those two beside them (and the README says what to pass for what).
ZIPPED_FORMATS = ("ort", "qnn", "model", "float")


class ExportPanel(View):
    """One download button per format; each writes the current plan's file when clicked."""

    state = param.ClassSelector(class_=StudioState)

    def __init__(self, **params):
        super().__init__(**params)
        self.downloads = {
            fmt: pn.widgets.FileDownload(callback=self._writer(fmt), label=label, filename=f"plan{suffix}",
                                         button_type="primary", button_style="outline", sizing_mode="stretch_width",
                                         name=f"download-{fmt}", description=DESCRIPTIONS.get(fmt))
            for fmt, (label, suffix) in DOWNLOADS.items()
        }
        self.state.param.watch(self._on_plan, "plan")
        self._on_plan()

    @laid_out_once
    def __panel__(self):
        return pn.Column(pn.pane.HTML("<b>Export the current plan</b>"), *self.downloads.values(),
                         sizing_mode="stretch_width")

    def _on_plan(self, *_):
        stem = export_name(self.state.plan)
        for fmt, (_, suffix) in DOWNLOADS.items():
            self.downloads[fmt].filename = stem + suffix

    def _writer(self, fmt: str):
        def write():
            try:
                result = self.state.export(ZIPPED_FORMATS if fmt == "all" else (fmt,))
            except MpstudioError as exc:
                self.state.show_error(f"export failed: {exc}")
                return None
            if fmt == "all":
                return str(zipped(result.paths(), result.directory / self.downloads[fmt].filename))
            return str({"ort": result.overrides, "qnn": result.encodings, "model": result.model}[fmt])
        return write


def zipped(paths, target):
    """`paths` in one zip file at `target`, by their names."""
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as archive:
        for path in paths:
            archive.write(path, path.name)
    return target
