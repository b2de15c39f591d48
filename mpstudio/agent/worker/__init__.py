"""The agent's worker: a spawned process that owns every ONNX Runtime / QNN session, and the agent's handle on it.

`handle` is the parent side; `engine` the process's loop and runs; `sessions` its session cache;
`placement`, `ort_log`, `profiles` and `model_file` what it reads of placements, logs, profiles and models.
"""

from .engine import Engine, worker_main
from .handle import STARTUP_TIMEOUT_S, WorkerHandle
from .ort_log import parse_placement, parse_refusals
from .profiles import parse_cpu_profile, parse_qnn_profile

__all__ = [
    "STARTUP_TIMEOUT_S",
    "Engine",
    "WorkerHandle",
    "parse_cpu_profile",
    "parse_placement",
    "parse_qnn_profile",
    "parse_refusals",
    "worker_main",
]
