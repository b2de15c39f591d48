"""Where a number comes from: the names of latency sources and the labelled latency value every part shares.

A latency is `measured` (a real device, named), `estimate` (the HTP cost model, with its architecture) or
`emulator` (host time of the x86_64 HTP emulator: a relative cost only, never device latency). Light on
purpose: the agent and its clients use it too.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass
from typing import Any, Mapping

from .errors import MpstudioError

MEASURED, ESTIMATE, EMULATOR = "measured", "estimate", "emulator"
LATENCY_SOURCES = (ESTIMATE, EMULATOR, MEASURED)
RUN_LATENCY_SOURCES = (MEASURED, EMULATOR)  # what timing a run on an agent can give

# How the CPU's accuracy source ends ("ORT CPU QDQ (<numerics>, " before it, `loop.runners.CPU_SOURCE`): it names
# what of the HTP's arithmetic the CPU numerics follow, so results of an earlier mpstudio's numerics carry another.
# (Before the HTP's 8-bit requantization was followed it ended "HTP weights, input rounding and accumulators)";
# before its 16-bit Add was, "HTP weights, input rounding, accumulators and requantization)".)
CPU_NUMERICS_TAIL = "HTP weights, input rounding, accumulators, requantization and 16-bit adds)"


def superseded_source(source: str) -> bool:
    """True for the CPU results of an earlier mpstudio's numerics (a study kept from before a rounding rule was
    followed): neither the current CPU numerics nor another backend."""
    return source.startswith("ORT CPU QDQ (") and not source.endswith(CPU_NUMERICS_TAIL)


# What a figure includes. The cost model prices the HTP's graph alone ("HTP only") or adds the graph-input
# quantize and output dequantize ORT's QNN EP leaves to the CPU; an agent times whole session runs.
HTP_ONLY = "HTP only"
WITH_CPU_IO = "HTP + CPU graph I/O"
SESSION_RUN = "whole session run"
LATENCY_SCOPES = (HTP_ONLY, WITH_CPU_IO, SESSION_RUN)
# A figure of a model whose unsupported nodes run on ORT's CPU EP (a study made with allow_fallback) says so
# after its scope: "whole session run, HTP + 3 nodes on CPU".
_CPU_NODES = re.compile(r"^(?:HTP \+ (?P<run>\d+) nodes on CPU|excluding the CPU time of (?P<est>\d+) nodes on CPU "
                        r"\(priced as HTP ops\))$")
_ESTIMATE_WHERE = re.compile(r"^HTP v(?P<arch>\w+) \(cost model(?:, calibrated on (?P<device>.+))?\)$")


@dataclass(frozen=True)
class Latency:
    """A latency in milliseconds, where it comes from and what it includes.

    `source` is "measured" (a real device; `where` names it), "estimate" (the HTP cost model; `where` names the
    architecture, e.g. "HTP v75 (cost model)" or "HTP v75 (cost model, calibrated on Galaxy S24)") or
    "emulator" (host time of the x86_64 HTP emulator: a relative cost only, never device latency).
    `includes` is one of LATENCY_SCOPES; left empty it is "HTP + CPU graph I/O" for an estimate (what
    `estimate_latency(...).latency` has always been) and "whole session run" otherwise, so stored rows from
    before it existed still load. `low_ms`/`high_ms` bound an estimate (the cost model's interval), or are None.
    """

    ms: float
    source: str
    where: str
    detail: str = ""
    includes: str = ""
    low_ms: float | None = None
    high_ms: float | None = None

    def __post_init__(self):
        if self.source not in LATENCY_SOURCES:
            raise MpstudioError(
                f"latency source must be one of {', '.join(LATENCY_SOURCES)}, not {self.source!r}"
            )
        object.__setattr__(self, "ms", milliseconds(self.ms, "latency"))
        if not isinstance(self.where, str) or not self.where.strip():
            raise MpstudioError("a latency must say where it comes from (a device, a host or an HTP architecture)")
        if not self.includes:
            object.__setattr__(self, "includes", WITH_CPU_IO if self.source == "estimate" else SESSION_RUN)
        scope, _, note = self.includes.partition(", ")
        if scope not in LATENCY_SCOPES or (note and not _CPU_NODES.match(note)):
            raise MpstudioError(f"a latency includes one of {', '.join(LATENCY_SCOPES)}, not {self.includes!r}")
        if (self.low_ms is None) != (self.high_ms is None):
            raise MpstudioError("give both ends of a latency interval (low_ms and high_ms) or neither")
        if self.low_ms is not None:
            low, high = milliseconds(self.low_ms, "low_ms"), milliseconds(self.high_ms, "high_ms")
            if not low <= self.ms <= high:
                raise MpstudioError(f"the interval {low:.4g}-{high:.4g} ms must contain the latency {self.ms:.4g} ms")
            object.__setattr__(self, "low_ms", low)
            object.__setattr__(self, "high_ms", high)

    @property
    def cpu_nodes(self) -> int:
        """How many nodes of the model ran (or would run) on ORT's CPU EP instead of the HTP; 0 for most."""
        match = _CPU_NODES.match(self.includes.partition(", ")[2])
        return int(match.group("run") or match.group("est")) if match else 0

    def with_cpu_nodes(self, nodes: int) -> "Latency":
        """This latency, labelled as coming from a model with `nodes` nodes on ORT's CPU EP (CPU fallback).

        A run's time includes them ("HTP + N nodes on CPU"); the cost model prices them as if the HTP ran them,
        so an estimate says it excludes their CPU time.
        """
        scope = self.includes.partition(", ")[0]
        if nodes <= 0:
            return dataclasses.replace(self, includes=scope)
        note = (f"excluding the CPU time of {nodes} nodes on CPU (priced as HTP ops)" if self.source == ESTIMATE
                else f"HTP + {nodes} nodes on CPU")
        return dataclasses.replace(self, includes=f"{scope}, {note}")

    @property
    def is_device_latency(self) -> bool:
        """True only for a measurement on a real device."""
        return self.source == "measured"

    @property
    def calibrated_on(self) -> str:
        """The device an estimate was calibrated on ("" for the published fit, or for other sources)."""
        match = _ESTIMATE_WHERE.match(self.where) if self.source == "estimate" else None
        return (match.group("device") or "") if match else ""

    @property
    def label(self) -> str:
        """What this number is, in words: always names the source and what the figure includes."""
        if self.source == "measured":
            return f"measured on {self.where}, {self.includes}"
        if self.source == "estimate":
            match = _ESTIMATE_WHERE.match(self.where)
            if match is None:
                return f"estimate, {self.where}, {self.includes}"
            calibrated = f"calibrated on {match.group('device')}, " if match.group("device") else ""
            return f"estimate, {calibrated}HTP v{match.group('arch')} cost model, {self.includes}"
        return f"emulator host time on {self.where} (not device latency), {self.includes}"

    @property
    def interval(self) -> str:
        """"0.210-0.330 ms", or "" without an interval."""
        return "" if self.low_ms is None else f"{self.low_ms:.3f}-{self.high_ms:.3f} ms"

    def __str__(self) -> str:
        within = f" [{self.interval}]" if self.low_ms is not None else ""
        return f"{self.ms:.3f} ms{within} ({self.label})"

    @classmethod
    def from_stats(cls, stats) -> "Latency":
        """The median of an agent run's `LatencyStats`, keeping its source ("measured" or "emulator")."""
        return cls(
            ms=stats.median_ms,
            source=stats.source,
            where=stats.device,
            detail=f"median of {stats.n} timed runs, {stats.backend} backend",
            includes=SESSION_RUN,
        )

    def to_dict(self) -> dict[str, Any]:
        return {"ms": self.ms, "source": self.source, "where": self.where, "detail": self.detail,
                "includes": self.includes, "low_ms": self.low_ms, "high_ms": self.high_ms}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Latency":
        if not isinstance(data, Mapping):
            raise MpstudioError(f"a latency must be an object with ms, source and where, not {data!r}")
        optional = {"detail", "includes", "low_ms", "high_ms"}
        missing = {"ms", "source", "where"} - set(data)
        extra = set(data) - {"ms", "source", "where"} - optional
        if missing or extra:
            raise MpstudioError(
                f"a latency needs the keys ms, source, where (and optionally {', '.join(sorted(optional))}); "
                f"missing {sorted(missing)}, unknown {sorted(extra)}"
            )
        return cls(ms=data["ms"], source=data["source"], where=data["where"], detail=str(data.get("detail", "")),
                   includes=str(data.get("includes") or ""), low_ms=data.get("low_ms"), high_ms=data.get("high_ms"))


def milliseconds(value, what: str) -> float:
    try:
        ms = float(value)
    except (TypeError, ValueError):
        raise MpstudioError(f"{what} must be a number of milliseconds, not {value!r}") from None
    if not math.isfinite(ms) or ms < 0:
        raise MpstudioError(f"{what} must be a finite, non-negative number of milliseconds, not {value!r}")
    return ms


