"""Import path kept for code written before `mpstudio.loop`: where a study's plans run now lives in
`mpstudio.loop.runners`."""

from .loop.runners import CPU_SOURCE, InProcess, OverAgent, Target, runner_for

__all__ = ["CPU_SOURCE", "InProcess", "OverAgent", "Target", "runner_for"]
