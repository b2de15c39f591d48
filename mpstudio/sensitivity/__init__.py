"""The sensitivity engine: streamed per-tensor scores, weight scores, isolation scores, ranking, regions and
predictions, for one float model and its QDQ models."""

from .analysis import SensitivityReport, analyze, check_prediction
from .progressive import analyze_progressive
from .isolation import IsolationResult, OutputScorer, Region, SwitchableModel, isolation_scores, tensor_regions
from .ranking import (Prediction, PredictionCheck, namespace_regions, predict, qnn_region, rank_tensors,
                      selection_region)
from .scores import tensor_scores, weight_scores
from .weight_isolation import matrix_weights, weight_isolation
from ..metrics import ErrorAccumulator
from .stats import COSINE_THRESHOLD, SNR_THRESHOLD_DB

__all__ = [
    "COSINE_THRESHOLD", "SNR_THRESHOLD_DB", "ErrorAccumulator", "IsolationResult", "OutputScorer", "Prediction",
    "PredictionCheck", "Region", "SensitivityReport", "SwitchableModel", "analyze", "analyze_progressive",
    "check_prediction", "isolation_scores", "namespace_regions", "predict", "qnn_region",
    "rank_tensors", "selection_region", "tensor_regions", "tensor_scores", "weight_scores", "matrix_weights",
    "weight_isolation",
]
