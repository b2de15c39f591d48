"""Where a number comes from: the names of latency sources and the labelled latency value every part shares.

A latency is `measured` (a real device, named), `estimate` (the HTP cost model, with its architecture) or
`emulator` (host time of the x86_64 HTP emulator: a relative cost only, never device latency). Light on
purpose: the agent and its clients use it too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

from .errors import MpstudioError

MEASURED, ESTIMATE, EMULATOR = "measured", "estimate", "emulator"
LATENCY_SOURCES = (ESTIMATE, EMULATOR, MEASURED)
RUN_LATENCY_SOURCES = (MEASURED, EMULATOR)  # what timing a run on an agent can give


@dataclass(frozen=True)
class Latency:
    """A latency in milliseconds and where it comes from.

    `source` is "measured" (a real device; `where` names it), "estimate" (the HTP cost model; `where` names the
    architecture, e.g. "HTP v75 (cost model)") or "emulator" (host time of the x86_64 HTP emulator: a relative
    cost only, never device latency; `where` names the host).
    """

    ms: float
    source: str
    where: str
    detail: str = ""

    def __post_init__(self):
        if self.source not in LATENCY_SOURCES:
            raise MpstudioError(
                f"latency source must be one of {', '.join(LATENCY_SOURCES)}, not {self.source!r}"
            )
        try:
            ms = float(self.ms)
        except (TypeError, ValueError):
            raise MpstudioError(f"latency must be a number of milliseconds, not {self.ms!r}") from None
        if not math.isfinite(ms) or ms < 0:
            raise MpstudioError(f"latency must be a finite, non-negative number of milliseconds, not {self.ms!r}")
        object.__setattr__(self, "ms", ms)
        if not isinstance(self.where, str) or not self.where.strip():
            raise MpstudioError("a latency must say where it comes from (a device, a host or an HTP architecture)")

    @property
    def is_device_latency(self) -> bool:
        """True only for a measurement on a real device."""
        return self.source == "measured"

    @property
    def label(self) -> str:
        """What this number is, in words: always names the source."""
        if self.source == "measured":
            return f"measured on {self.where}"
        if self.source == "estimate":
            return "estimate, " + self.where.replace(" (cost model)", " cost model")
        return f"emulator host time on {self.where} (not device latency)"

    def __str__(self) -> str:
        return f"{self.ms:.3f} ms ({self.label})"

    @classmethod
    def from_stats(cls, stats) -> "Latency":
        """The median of an agent run's `LatencyStats`, keeping its source ("measured" or "emulator")."""
        return cls(
            ms=stats.median_ms,
            source=stats.source,
            where=stats.device,
            detail=f"median of {stats.n} timed runs, {stats.backend} backend",
        )

    def to_dict(self) -> dict[str, Any]:
        return {"ms": self.ms, "source": self.source, "where": self.where, "detail": self.detail}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Latency":
        if not isinstance(data, Mapping):
            raise MpstudioError(f"a latency must be an object with ms, source and where, not {data!r}")
        missing = {"ms", "source", "where"} - set(data)
        extra = set(data) - {"ms", "source", "where", "detail"}
        if missing or extra:
            raise MpstudioError(
                f"a latency needs the keys ms, source, where (and optionally detail); "
                f"missing {sorted(missing)}, unknown {sorted(extra)}"
            )
        return cls(ms=data["ms"], source=data["source"], where=data["where"], detail=str(data.get("detail", "")))
