"""A study's sensitivity reports: each computed once (progressive or exhaustive) and kept in `sensitivity/`, the
last one read held for predictions."""

from __future__ import annotations

import threading
from pathlib import Path

from ..data import DataSource, Progress
from ..plan import PrecisionPlan
from ..quantize import Quantizer


class SensitivityCache:
    """The sensitivity reports of the study in `folder`, scored on its calibration data."""

    def __init__(self, folder: Path, quantizer: Quantizer, calibration: DataSource, htp_arch: str):
        self.folder, self.quantizer, self.calibration, self.htp_arch = folder, quantizer, calibration, htp_arch
        self._held = None  # (its folder, the report) of the last report asked for

    @property
    def latest(self):
        """The last report `report` returned in this process, or None."""
        return self._held[1] if self._held is not None else None

    def report(self, *, samples: int = 32, isolation_samples: int = 8, progress: Progress | None = None,
               cancel: threading.Event | None = None, exhaustive: bool = False, on_partial=None,
               workers: int | None = None, plan: PrecisionPlan | None = None):
        """See `Study.sensitivity`."""
        from ..sensitivity import SensitivityReport, analyze, analyze_progressive
        from ..sensitivity.progressive import ENGINE_VERSION

        base = "a8w8" if plan is None or plan.hash == PrecisionPlan.a8w8().hash else f"plan-{plan.hash[:12]}"
        name = f"{base}-{samples}-{isolation_samples}" + ("" if exhaustive else f"-p{ENGINE_VERSION}")
        folder = self.folder / "sensitivity" / name
        if self._held is not None and self._held[0] == folder:
            return self._held[1]
        if (folder / "ranking.csv").exists():
            report = SensitivityReport.load(folder)
        elif exhaustive:
            data = self.calibration.head(samples)
            report = analyze(self.quantizer, data, plan, isolation_samples=isolation_samples, progress=progress,
                             cancel=cancel)
            report.save(folder)
        else:
            report = analyze_progressive(self.quantizer, self.calibration.head(samples), plan,
                                         isolation_samples=isolation_samples, htp_arch=self.htp_arch,
                                         workers=workers, cache_dir=self.folder / "sensitivity" / "values",
                                         on_partial=on_partial, progress=progress, cancel=cancel)
            report.save(folder)
        self._held = (folder, report)
        return report
