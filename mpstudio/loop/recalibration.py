"""The per-op profiles a study keeps of its device runs, and the cost model refitted to them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import pandas as pd

from ..errors import MpstudioError
from ..store import StudyStore
from .cost_model import CostModel
from .folder import atomic_write, is_finite_number, read_saved_json

PROFILES_DIR = "profiles"  # per-op profiles of device runs, one folder per device


def keep_profile(folder: Path, plan_id: int, measured, profile) -> None:
    """Keep `profile` (an `agent.protocol.OpProfile`) of plan `plan_id`'s `measured` run in the study `folder`."""
    where = folder / PROFILES_DIR / _slug(measured.where)
    where.mkdir(parents=True, exist_ok=True)
    atomic_write(where / f"{plan_id}.json", json.dumps(
        {"plan_id": plan_id, "device": measured.where, "source": measured.source, "total_ms": measured.ms,
         "profile": profile.to_dict()}) + "\n")


def read_profiles(folder: Path) -> pd.DataFrame:
    """Per-op profiles kept in the study `folder`. Columns: plan_id, device, total_ms, path."""
    rows = []
    for path in sorted((folder / PROFILES_DIR).glob("*/*.json")):
        saved = read_kept_profile(path)
        rows.append({"plan_id": saved["plan_id"], "device": saved["device"], "total_ms": saved["total_ms"],
                     "path": path})
    return pd.DataFrame(rows, columns=["plan_id", "device", "total_ms", "path"])


def read_kept_profile(path: Path) -> dict:
    """One kept profile, checked: plan_id, device, total_ms (finite, positive) and profile (an `OpProfile`)."""
    from ..agent.protocol import OpProfile

    def damaged(what: str) -> MpstudioError:
        return MpstudioError(f"the kept profile {path} is damaged ({what}); delete it (the study loses only that "
                             "profile) and evaluate the plan on the device again to keep a new one")

    saved = read_saved_json(path, damaged)
    if not isinstance(saved, dict):
        raise damaged("not a JSON object")
    plan_id, device, total = saved.get("plan_id"), saved.get("device"), saved.get("total_ms")
    if not isinstance(plan_id, int) or isinstance(plan_id, bool) or not isinstance(device, str) or not device:
        raise damaged("plan_id or device missing or mistyped")
    if not is_finite_number(total) or total <= 0:
        raise damaged(f"total_ms is {total!r}, not a positive number of milliseconds")
    try:
        profile = OpProfile.from_dict(saved["profile"])
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise damaged(f"its op profile cannot be read: {type(exc).__name__}: {exc}") from None
    return {**saved, "profile": profile}


def recalibrate(folder: Path, cost_model: CostModel, store: StudyStore, model_of: Callable[[int], Path],
                device: str | None = None, *, allow_emulator: bool = False):
    """Refit `cost_model` to the profiles the study keeps of `device` (default: the device with the most), adopt
    it, and re-estimate every stored plan (`model_of(plan_id)`: its QDQ model). See `Study.recalibrate`."""
    from ..latency import calibrate, htp_arch

    kept = read_profiles(folder)
    if kept.empty:
        raise MpstudioError("this study keeps no per-op profiles yet: evaluate plans on a device's agent "
                            "(backend htp) first")
    device = device or kept["device"].value_counts().index[0]
    chosen = kept[kept["device"] == device]
    if chosen.empty:
        raise MpstudioError(f"no profiles of {device!r}; this study has profiles of: "
                            f"{', '.join(sorted(kept['device'].unique()))}")
    runs = [(model_of(int(row.plan_id)), read_kept_profile(Path(row.path))["profile"], float(row.total_ms))
            for row in chosen.itertuples()]
    calibration = calibrate(runs, htp_arch(cost_model.htp_arch), allow_emulator=allow_emulator)
    cost_model.adopt(calibration, device)
    for plan_id in store.plans()["plan_id"]:
        latency = cost_model.estimate(model_of(int(plan_id)))
        if latency is not None:
            store.record_latency(int(plan_id), latency)
    return calibration


def _slug(text: str) -> str:
    """A folder name for a device name: never empty, and never "." or ".." (which name other folders)."""
    slug = "".join(c if c.isalnum() or c in "-_." else "_" for c in text)[:80]
    if not slug.strip("."):
        slug = f"device{'_' * len(slug)}"
    return slug
