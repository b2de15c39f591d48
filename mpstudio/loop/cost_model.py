"""The cost model a study's latency estimates use: its HTP architecture, refitted to a device when the study has
been recalibrated (`recalibration`), with the nodes an allow_fallback study leaves to the CPU named in each
estimate."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from ..errors import MpstudioError
from ..sources import Latency
from .folder import atomic_write, is_finite_number, read_saved_json

CALIBRATION_FILE = "calibration.json"  # the cost model's scales refitted on a device
# A fitted scale outside this range is no device's: the file was damaged or edited by hand.
SCALE_RANGE = (1e-3, 1e3)


def read_calibration(path: Path) -> tuple[dict[str, float], str]:
    """The (scales, device) of a study's calibration.json, checked: known cost classes, finite scales in
    SCALE_RANGE, a device name."""
    from ..latency.ops import OP_CLASSES

    def damaged(what: str) -> MpstudioError:
        return MpstudioError(f"{path} is damaged ({what}); delete it to go back to the uncalibrated cost model, "
                             "then recalibrate the study (Study.recalibrate) to fit it again")

    saved = read_saved_json(path, damaged)
    if not isinstance(saved, dict) or not isinstance(saved.get("scales"), dict) \
            or not isinstance(saved.get("calibrated_on"), str) or not saved["calibrated_on"]:
        raise damaged("it needs an object with 'scales' and 'calibrated_on'")
    scales = {}
    low, high = SCALE_RANGE
    for name, value in saved["scales"].items():
        if name not in OP_CLASSES:
            raise damaged(f"unknown cost class {name!r}; known: {', '.join(OP_CLASSES)}")
        if not is_finite_number(value) or not low <= value <= high:
            raise damaged(f"the scale of {name!r} is {value!r}, outside {low:g}..{high:g}")
        scales[name] = float(value)
    return scales, saved["calibrated_on"]


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
                scales, device = read_calibration(path)
                base = dataclasses.replace(base, scales=scales, calibrated_on=device)
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
