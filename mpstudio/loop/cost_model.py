"""The cost model a study's latency estimates use: its HTP architecture, refitted to a device when the study has
been recalibrated (`recalibration`), with the nodes an allow_fallback study leaves to the CPU named in each
estimate."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from ..errors import MpstudioError
from ..sources import Latency
from .folder import atomic_write

CALIBRATION_FILE = "calibration.json"  # the cost model's scales refitted on a device


class CostModel:
    """The estimates of the study in `folder` for HTP `htp_arch`; `cpu_nodes` nodes of its HTP runs are on the CPU."""

    def __init__(self, folder: Path, htp_arch: str, cpu_nodes: int = 0):
        self.folder, self.htp_arch, self.cpu_nodes = folder, htp_arch, cpu_nodes
        self._arch = None

    @property
    def arch(self):
        """The HtpArch estimates use: the study's architecture, with the scales of `calibration.json` when the
        study has been recalibrated (its estimates then say "calibrated on <device>")."""
        from ..latency import htp_arch

        if self._arch is None:
            base = htp_arch(self.htp_arch)
            path = self.folder / CALIBRATION_FILE
            if path.exists():
                saved = json.loads(path.read_text())
                base = dataclasses.replace(base, scales=dict(saved["scales"]), calibrated_on=saved["calibrated_on"])
            self._arch = base
        return self._arch

    def estimate(self, path: Path) -> Latency | None:
        """The estimated latency of the QDQ model at `path`; None when the cost model cannot read it (the plan's
        accuracy still counts)."""
        from ..latency import estimate_latency

        try:
            latency = estimate_latency(path, htp_arch=self.arch).latency
        except MpstudioError:
            return None
        return latency.with_cpu_nodes(self.cpu_nodes) if self.cpu_nodes else latency

    def adopt(self, calibration, device: str) -> None:
        """Use `calibration` (a `latency.Calibration` fitted on `device`) from now on, here and in later processes."""
        atomic_write(self.folder / CALIBRATION_FILE, json.dumps(
            {"calibrated_on": calibration.arch.calibrated_on, "scales": dict(calibration.arch.scales),
             "device": device, "plans": calibration.plans}, indent=2) + "\n")
        self._arch = calibration.arch
