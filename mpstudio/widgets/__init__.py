"""The studio's views (Panel and Bokeh): the only GUI code of mpstudio.

`Studio(StudioState(study))` in a notebook (after `pn.extension("tabulator")`) or `panel serve app.py`; each
view (GraphView, SensitivityTable, ParetoPlot, RunPanel, ExportPanel, ModelPanel) also displays on its own over
the same state.
"""

from .export_panel import ExportPanel
from .graph_view import GraphView
from .jobs import JobsView
from .lanes import Job
from .model_panel import ModelPanel
from .pareto import ParetoPlot
from .run_panel import RunPanel
from .state import StudioState
from .studio import Studio
from .table import SensitivityTable
from .tensor_frame import SCORES

__all__ = ["ExportPanel", "GraphView", "Job", "JobsView", "ModelPanel", "ParetoPlot", "RunPanel", "SCORES",
           "SensitivityTable", "Studio", "StudioState"]
