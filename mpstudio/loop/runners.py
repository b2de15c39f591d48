"""Where a study's plans run: in this process (ORT's CPU EP or the local HTP backend) or over agents.

A runner produces a model's outputs on a data source, names the source of the accuracy it gives (so CPU
numerics, the HTP emulator and a device are never confused), and measures latency where it can.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from pathlib import Path

from ..data import Cancelled, DataSource, Feed, Progress
from ..runtime import DEFAULT_CPU_NUMERICS
from ..sources import CPU_NUMERICS_TAIL, Latency
from .inprocess import run_outputs

# Names the CPU numerics too, so results of another numerics (older studies) are never mixed with these.
# "HTP weights": since the CPU numerics compute with the weights the HTP really uses (runtime.htp_weight_grid),
# their results carry another name than the earlier ones, so one study never mixes the two on a front; the same
# for "input rounding", the graph inputs rounded to their codes as the HTP rounds them (runtime.htp_input_rounding),
# for "accumulators", 16-bit Convs and Gemms rounding their sums as the HTP does (runtime.htp_accumulator_rounding),
# and for "requantization", 8-bit Convs, Gemms and Adds requantized as the HTP does (htp_requantize).
CPU_SOURCE = f"ORT CPU QDQ ({DEFAULT_CPU_NUMERICS}, {CPU_NUMERICS_TAIL}"


class InProcess:
    """Runs models in this process: ORT's CPU EP, or the HTP backend of this machine's onnxruntime-qnn."""

    agent = None

    def source(self, backend: str) -> str:
        if backend == "cpu":
            return CPU_SOURCE
        from ..runtime import htp_is_emulated

        return f"{'HTP emulator' if htp_is_emulated() else 'HTP'} on {socket.gethostname()}"

    def outputs(self, path: Path, data: DataSource, backend: str, options: dict | None, progress: Progress | None,
                cancel, allow_cpu_fallback: bool = False) -> list[Feed]:
        return run_outputs(path, data, backend, options, progress, cancel, allow_cpu_fallback=allow_cpu_fallback)

    on_device = False

    def measure(self, path: Path, feed: Feed, options: dict, profile: bool = False, allow_cpu_fallback: bool = False):
        return None, None  # latency is measured on an agent, whose worker owns the session and the clock


class OverAgent:
    """Runs models on an AgentClient, or spreads samples over an AgentPool (anything with `run`, `info`)."""

    def __init__(self, agent):
        self.agent = agent

    def source(self, backend: str) -> str:
        if backend == "cpu":
            return CPU_SOURCE
        agents = getattr(self.agent, "agents", None)
        info = (agents[0] if agents else self.agent).info()
        return f"HTP emulator on {info.device}" if info.htp_emulated else f"HTP on {info.device}"

    def outputs(self, path: Path, data: DataSource, backend: str, options: dict | None, progress: Progress | None,
                cancel, allow_cpu_fallback: bool = False) -> list[Feed]:
        feeds = list(data.feeds())
        options = options or {}
        fallback = {"allow_cpu_fallback": True} if allow_cpu_fallback else {}
        if cancel is not None and cancel.is_set():
            raise Cancelled("cancelled before the run started")
        message = f"running {path.stem[:8]} on {backend} over the agent"
        if progress:
            progress(0, len(feeds), message)
        if hasattr(self.agent, "map"):
            results = self.agent.map(path, feeds, backend=backend, provider_options=options, **fallback)
        else:
            results = []
            for i, feed in enumerate(feeds):
                if cancel is not None and cancel.is_set():
                    raise Cancelled(f"cancelled after {i} of {len(feeds)} samples")
                results.append(self.agent.run(path, feed, backend=backend, provider_options=options, **fallback))
                if progress:
                    progress(i + 1, len(feeds), message)
        return [dict(r.outputs) for r in results]

    @property
    def on_device(self) -> bool:
        """Whether the agent's HTP is a real NPU (its timings are device latency), not the x86_64 emulator."""
        agents = getattr(self.agent, "agents", None)
        return not (agents[0] if agents else self.agent).info().htp_emulated

    def measure(self, path: Path, feed: Feed, options: dict, profile: bool = False, allow_cpu_fallback: bool = False):
        """(the median latency of one sample on the agent's HTP backend: measured on a device, emulator time on
        an x86_64 host; its per-op profile when `profile`), each None when the agent returned none."""
        result = self.agent.run(path, feed, backend="htp", provider_options=options, warmup=2, iterations=10,
                                outputs=False, profile=profile,
                                **({"allow_cpu_fallback": True} if allow_cpu_fallback else {}))
        latency = Latency.from_stats(result.latency) if result.latency is not None else None
        return latency, result.profile if profile else None


def runner_for(agent) -> InProcess | OverAgent:
    """The runner of `agent`: None for this process, an AgentClient or AgentPool for agents; a runner itself
    (anything with `source`, `outputs` and `measure`, e.g. `distributed.OverRay`) is returned as it is."""
    if isinstance(agent, (InProcess, OverAgent)) or all(hasattr(agent, a) for a in ("source", "outputs", "measure")):
        return agent
    return InProcess() if agent is None else OverAgent(agent)


@dataclass(frozen=True)
class Target:
    """Where one evaluation runs: the backend, its runner, and the accuracy source that pair gives (read once:
    an agent answers it over the network). `cpu_nodes`: the nodes a study's HTP runs leave to ORT's CPU EP
    (a study created with allow_fallback), 0 for most."""

    backend: str
    runner: InProcess | OverAgent
    source: str
    htp_arch: str
    cpu_nodes: int = 0

    @classmethod
    def of(cls, backend: str, runner: InProcess | OverAgent, htp_arch: str, cpu_nodes: int = 0) -> "Target":
        source = runner.source(backend)
        if backend == "htp" and cpu_nodes:
            source = f"{source} + {cpu_nodes} nodes on CPU"
        return cls(backend, runner, source, htp_arch, cpu_nodes)

    @property
    def fallback(self) -> bool:
        """Whether this run leaves nodes to the CPU (HTP runs of an allow_fallback study)."""
        return self.backend == "htp" and bool(self.cpu_nodes)

    def outputs(self, path: Path, data: DataSource, progress: Progress | None, cancel) -> list[Feed]:
        options = {"htp_arch": self.htp_arch} if self.backend == "htp" else None
        fallback = {"allow_cpu_fallback": True} if self.fallback else {}
        return self.runner.outputs(path, data, self.backend, options, progress, cancel, **fallback)

    def measure(self, path: Path, feed: Feed, profile: bool | None):
        """(latency of one sample on the agent's HTP, its per-op profile): `profile` None profiles on a device
        only. A run with nodes on the CPU says so in its latency."""
        profile = self.runner.on_device if profile is None else profile
        fallback = {"allow_cpu_fallback": True} if self.fallback else {}
        measured, profiled = self.runner.measure(path, feed, {"htp_arch": self.htp_arch}, profile, **fallback)
        if measured is not None and self.fallback:
            measured = measured.with_cpu_nodes(self.cpu_nodes)
        return measured, profiled


__all__ = ["InProcess", "OverAgent", "Target", "runner_for", "CPU_SOURCE"]
