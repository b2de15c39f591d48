"""mpstudio: a mixed-precision studio for ONNX models on Qualcomm NPUs (ONNX Runtime QNN EP, HTP)."""

from .errors import MpstudioError

__version__ = "0.1.0"

__all__ = ["MpstudioError", "__version__"]
