"""Import path kept for code written before `mpstudio.loop`: running a model over a data source in this process
now lives in `mpstudio.loop.inprocess`."""

from .loop.inprocess import WORKERS_ENV, evaluate, htp_workers, run_outputs, shutdown_workers

__all__ = ["WORKERS_ENV", "evaluate", "htp_workers", "run_outputs", "shutdown_workers"]
