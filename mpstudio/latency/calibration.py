"""Recalibration on a device: the cost model's per-class costs refitted to measured per-op profiles
(`calibrate`), giving a calibrated HtpArch whose estimates say where they were calibrated (`Calibration`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Iterable

import numpy as np
import pandas as pd

from ..errors import MpstudioError
from ..sources import milliseconds
from .arch import SPREAD, HtpArch, Spread
from .arch import htp_arch as resolve_arch  # calibrate takes a parameter named htp_arch
from .estimate import LatencyEstimate, estimate_latency
from .ops import OP_CLASSES


@dataclass(frozen=True, eq=False)
class Calibration:
    """The cost model refitted to one device's per-op profiles.

    `arch` is the calibrated HtpArch (pass it as `htp_arch` to `estimate_latency` or `promotion_costs`; its
    estimates say "calibrated on <device>"). `classes` has one row per cost class: estimated_ms (before),
    measured_ms (the profiled ops' time, shared out by their estimated classes), scale, ops.
    `unmatched_share` is the part of the profiled time whose ops map to no op of the model (left out).
    """

    arch: HtpArch
    device: str
    plans: int
    classes: pd.DataFrame
    unmatched_share: float

    def describe(self) -> str:
        scales = ", ".join(f"{k} x{v:.2f}" for k, v in sorted(self.arch.scales.items()))
        return (f"{self.arch.where}: {self.plans} profiled plan(s), scales {scales}; "
                f"{self.unmatched_share:.1%} of the profiled time unmatched")


def calibrate(profiles: Iterable[tuple], htp_arch: str | int | HtpArch = "75", *,
              allow_emulator: bool = False, ridge: float = 0.05) -> Calibration:
    """Refit the per-class costs of `htp_arch` to measured per-op profiles of one device.

    `profiles`: (model, profile, total_ms) per profiled plan: the QDQ model (path or ModelProto) that ran, its
    `OpProfile` (`AgentClient.run(..., profile=True).profile`, ops mapped back to ONNX nodes) and the measured
    latency of one run in ms (the run's `LatencyStats.median_ms`, or a `Latency`). A profile in cycles is
    shared out over that latency less the estimated CPU graph I/O; one in microseconds is taken as is.
    Least squares: one scale per cost class (OP_CLASSES) so that each profiled op's estimated time, summed by
    class and scaled, matches its measured time; `ridge` pulls classes with little time in the profiles
    toward 1. Emulator profiles are host time, not device latency: refused unless `allow_emulator`, and then
    the label says so.
    """
    base = resolve_arch(htp_arch)
    base = dataclasses.replace(base, scales={}, calibrated_on="")
    rows, measured, plans, unmatched, total = [], [], 0, 0.0, 0.0
    device = None
    for model, profile, total_ms in profiles:
        device = _profile_device(profile, device, allow_emulator)
        estimate = estimate_latency(model, base)
        by_class, times, left = _profile_rows(estimate, profile, milliseconds(getattr(total_ms, "ms", total_ms),
                                                                                "a profiled latency"))
        rows += by_class
        measured += times
        unmatched += left
        total += sum(times) + left
        plans += 1
    if not plans:
        raise MpstudioError("calibrate needs at least one (model, profile, latency) of a device run")
    if not rows:
        raise MpstudioError("no profiled op maps to an op of the models: profile with ONNX source ops (the agent's "
                            "profile=True does) and pass the models that ran")
    frame = pd.DataFrame(rows).fillna(0.0)
    classes = [k for k in OP_CLASSES if k in frame.columns and frame[k].sum() > 0]
    scales, fitted = _class_scales(frame[classes].to_numpy(), np.array(measured), ridge)
    arch = dataclasses.replace(base, scales=dict(zip(classes, scales)), calibrated_on=device,
                               spread=_calibration_spread(fitted, np.array(measured)))
    table = pd.DataFrame({"op_class": classes, "estimated_ms": frame[classes].sum().to_numpy() / plans,
                          "measured_ms": [float(np.sum(np.array(measured) * frame[k] / frame[classes].sum(axis=1)
                                                       .clip(lower=1e-12))) / plans for k in classes],
                          "scale": scales, "ops": [int((frame[k] > 0).sum()) for k in classes]})
    return Calibration(arch, device, plans, table, unmatched / total if total else 0.0)


def _profile_device(profile, device: str | None, allow_emulator: bool) -> str:
    if profile is None:
        raise MpstudioError("a run without a profile cannot calibrate: run it with profile=True")
    if profile.source != "measured":
        if not allow_emulator:
            raise MpstudioError(
                f"the profile from {profile.device} is {profile.source} time, not device latency: calibrate on a "
                "device agent's profiles (or pass allow_emulator=True to calibrate on the emulator's costs)")
        name = f"{profile.device} (HTP emulator host time, not device latency)"
    else:
        name = profile.device
    if device is not None and name != device:
        raise MpstudioError(f"calibrate on one device at a time: got profiles from {device} and {name}")
    return name


def _profile_rows(estimate: LatencyEstimate, profile, total_ms: float) -> tuple[list[dict], list[float], float]:
    """Per profiled op: estimated ms by class (of the model's ops it maps to) and its measured ms."""
    ops = estimate.ops[estimate.ops["kind"].isin(["compute", "convert"]) & (estimate.ops["engine"] != "fused")]
    by_node = {node: group for node, group in ops.groupby("node")}
    costs = np.array([op.cost for op in profile.ops], dtype=float)
    if profile.unit == "us":
        to_ms = np.full(len(costs), 1e-3)
    else:  # cycles: shared out over the measured run, less what the CPU does around the graph
        htp_ms = max(total_ms - estimate.io_ms - estimate.arch.costs.graph_overhead_us / 1e3, 1e-9)
        to_ms = np.full(len(costs), htp_ms / max(costs.sum(), 1e-12))
    rows, measured, left = [], [], 0.0
    for op, ms in zip(profile.ops, costs * to_ms):
        groups = [by_node[n] for n in op.onnx_nodes if n in by_node]
        if not groups:
            left += ms
            continue
        both = pd.concat(groups).drop_duplicates("node")
        rows.append(both.groupby("op_class")["ms"].sum().to_dict())
        measured.append(float(ms))
    return rows, measured, left


def _class_scales(estimated: np.ndarray, measured: np.ndarray, ridge: float) -> tuple[np.ndarray, np.ndarray]:
    """Least squares for class scales s: estimated @ s ~ measured, with a ridge toward s = 1 in units of each
    class's estimated time; scales kept within 1/20..20."""
    weight = ridge * estimated.sum(axis=0)
    a = np.vstack([estimated, np.diag(weight)])
    b = np.concatenate([measured, weight])
    scales, *_ = np.linalg.lstsq(a, b, rcond=None)
    scales = np.clip(scales, 0.05, 20.0)
    return scales, estimated @ scales


def _calibration_spread(fitted: np.ndarray, measured: np.ndarray) -> Spread:
    """The interval of a calibrated estimate: 1.645 x the time-weighted RMS of the per-op log residuals."""
    ok = (fitted > 0) & (measured > 0)
    if not ok.any():
        return SPREAD
    log = np.log(fitted[ok] / measured[ok])
    s = 1.645 * float(np.sqrt(np.sum(measured[ok] * log**2) / np.sum(measured[ok])))
    return Spread(absolute=s, wide16=s, fp16=s)
