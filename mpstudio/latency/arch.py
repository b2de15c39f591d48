"""The cost model's constants per Hexagon tensor processor generation: shared per-op-type costs, the fit's spread,
and each generation's rates (`HTP_ARCHS`, `htp_arch`). The fitted values are written here by
benchmarks/latency_fit.py; sources: docs/latency.md, "Constants".
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Mapping

from ..errors import MpstudioError


@dataclass(frozen=True)
class CostConstants:
    """Per-op-type costs shared by every HTP generation. Sources: docs/latency.md, "Constants".

    Fitted (benchmarks/latency_fit.py): rate_16x8, rate_fp16, hvx_16bit, hvx_fp16, transcendental,
    transcendental_16, transcendental_fp16, normalize, op_cycles, overlap, memory_efficiency, depthwise. The others
    are stated assumptions.
    """

    rate_16x8: float  # HMX time of 16-bit activations x 8-bit weights relative to 8x8
    rate_fp16: float  # HMX time of fp16 x fp16 relative to 8x8
    hvx_16bit: float  # HVX time of a 16-bit element-wise op relative to 8-bit (vectors hold half as many)
    hvx_fp16: float  # HVX time of an fp16 element-wise op relative to 8-bit
    transcendental: float  # HVX instructions per vector of Sigmoid, SiLU, Exp, Erf, GELU, Div at 8 bits (a LUT)
    transcendental_16: float  # extra factor for them at 16 bits (no LUT: polynomial evaluation)
    transcendental_fp16: float  # extra factor for them in fp16
    normalize: float  # HVX instructions per vector of Softmax / LayerNorm at 8 bits (x the factors above when wide)
    op_cycles: float  # fixed cycles per op (scheduling, synchronisation, DMA set-up)
    overlap: float  # fraction of an activation's HVX time hidden behind the matrix op that feeds it
    memory_efficiency: float  # achieved fraction of the SoC's LPDDR peak
    depthwise: float = 1.0  # HVX instructions per vector of a depthwise convolution's MACs at 8 bits
    rate_16x16_factor: float = 2.0  # assumption: 16x16 on HMX takes twice the time of 16x8
    hvx_vectors_per_cycle: float = 2.0  # assumption: two 128-byte vector instructions per cycle on one op
    vtcm_factor: float = 3.0  # assumption: activations that fit VTCM move at 3x the DDR rate
    convert_instr: float = 2.0  # assumption: scale and shift per vector for an 8<->16-bit convert
    graph_overhead_us: float = 20.0  # assumption: one call into the NPU and back
    cpu_io_gbs: float = 8.0  # assumption: ORT's vectorized (de)quantize of graph I/O on one phone CPU core


@dataclass(frozen=True)
class Spread:
    """Log-scale half-widths of the intervals, per quantity: each covers `coverage` of the published figures
    that leave-one-architecture-out cross-validation predicted (benchmarks/latency_fit.py measures and prints it).

    `absolute`: an all-8-bit model's ms; `wide16`: an all-16-bit model's ms; `fp16`: a float model's ms;
    `ratio16` / `ratio_fp`: a model's w8a16/w8a8 and float/w8a8 ratios.
    An estimate's interval is ms x exp(-s) .. ms x exp(s), s interpolated by the share of 16-bit (or fp16) time.
    """

    absolute: float
    wide16: float
    fp16: float
    ratio16: float = 0.0
    ratio_fp: float = 0.0
    coverage: float = 0.0  # share of the cross-validated rows each half-width covers (0: not cross-validated)

    def factor(self, share16: float = 0.0, share_fp16: float = 0.0) -> float:
        share8 = max(0.0, 1.0 - share16 - share_fp16)
        return math.exp(share8 * self.absolute + share16 * self.wide16 + share_fp16 * self.fp16)

    def ratio_factor(self, quantity: str = "r16") -> float:
        """The multiplicative half-width of an estimated w8a16/w8a8 ("r16") or float/w8a8 ("rfp") ratio."""
        return math.exp(self.ratio16 if quantity == "r16" else self.ratio_fp)


@dataclass(frozen=True)
class HtpArch:
    """Constants of one Hexagon tensor processor generation, as the cost model uses them.

    `hmx_gmacs` and `clock_ghz` are effective rates fitted to published latencies (real HTP clocks are not
    published); `ddr_gbs` and `vtcm_mb` are the reference SoC's. `scales` multiply the time of each cost class
    (see OP_CLASSES) after a calibration on a device (`calibrate`); `calibrated_on` names that device.
    """

    arch: str  # "75"
    reference_soc: str  # the phone SoC whose figures the constants follow
    hmx_gmacs: float  # effective 8x8 multiply-accumulates per second of the matrix unit (HMX), in G
    clock_ghz: float  # effective HTP clock: sets vector (HVX) throughput and the per-op fixed cost
    fp16_factor: float  # this generation's fp16 time (matrix and vector) relative to the shared costs
    ddr_gbs: float  # LPDDR peak of the SoC (GB/s)
    vtcm_mb: float  # on-chip tightly coupled memory
    fitted_on: tuple[str, ...]  # the devices whose published figures fitted hmx_gmacs / clock_ghz
    costs: CostConstants
    spread: Spread
    scales: Mapping[str, float] = field(default_factory=dict)
    calibrated_on: str = ""
    device: str = ""  # set for a device's own constants (DEVICE_ARCHS)

    @property
    def name(self) -> str:
        return f"v{self.arch}"

    @property
    def where(self) -> str:
        on = f" on {self.device}" if self.device else ""
        if self.calibrated_on:
            return f"HTP v{self.arch}{on} (cost model, calibrated on {self.calibrated_on})"
        return f"HTP v{self.arch}{on} (cost model)"

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["scales"] = dict(self.scales)
        return data


# BEGIN FITTED CONSTANTS (written by benchmarks/latency_fit.py --write; do not edit by hand)
FIT_SOURCE = "fitted 2026-11-28 by benchmarks/latency_fit.py on 2 published-latency file(s)"
_FITTED_COSTS = dict(rate_16x8=1.165, rate_fp16=3.107, hvx_16bit=2.863, hvx_fp16=2.71, transcendental=0.5612,
    transcendental_16=3.325, transcendental_fp16=5.443, normalize=4.567, op_cycles=2483.0, overlap=0.5555,
    memory_efficiency=0.999, depthwise=0.5855)
_FITTED_ARCHS = {"73": dict(hmx_gmacs=13230.0, clock_ghz=0.6398, fp16_factor=0.992), "75": dict(hmx_gmacs=20250.0,
    clock_ghz=1.0, fp16_factor=1.0), "79": dict(hmx_gmacs=27970.0, clock_ghz=1.717, fp16_factor=1.104)}
_FITTED_SPREAD = dict(absolute=0.1327, wide16=0.3032, fp16=0.2486, ratio16=0.1705, ratio_fp=0.1349, coverage=0.8)
_FITTED_DEVICES = {"Snapdragon X Elite CRD": dict(arch="73", hmx=1.003, clock=0.7722)}
# END FITTED CONSTANTS

COSTS = CostConstants(**_FITTED_COSTS)
SPREAD = Spread(**_FITTED_SPREAD)
# Generations without published figures in the fit data follow v73 by the ratios of their SoC's published
# AI Hub w8a8 ResNet50 (matrix rate) and MobileNet-v2 (vector rate, per-op cost) latencies (docs/latency.md).
_UNFITTED = {"68": (17.1 / 27.4, 0.40 / 0.70), "69": (20.6 / 27.4, 0.55 / 0.70)}
_SOCS = {  # reference SoC, LPDDR peak GB/s, VTCM MB, devices of the fit data
    "68": ("Snapdragon 888 (SM8350)", 51.2, 4, ()),
    "69": ("Snapdragon 8 Gen 1 (SM8450)", 51.2, 8, ()),
    "73": ("Snapdragon 8 Gen 2 (SM8550)", 67.0, 8, ("QCS8550 (Proxy)",)),
    "75": ("Snapdragon 8 Gen 3 (SM8650)", 76.8, 8, ("Samsung Galaxy S24",)),
    "79": ("Snapdragon 8 Elite (SM8750)", 84.8, 8, ("Samsung Galaxy S25",)),
}


def make_archs(costs: CostConstants, fitted: Mapping[str, Mapping[str, float]], spread: Spread) -> dict[str, HtpArch]:
    """Every generation's HtpArch from the shared costs and the fitted per-generation rates."""
    archs = {}
    for arch, (soc, ddr, vtcm, devices) in _SOCS.items():
        if arch in fitted:
            rates = dict(fitted[arch])
        else:
            hmx, clock = _UNFITTED[arch]
            rates = dict(hmx_gmacs=fitted["73"]["hmx_gmacs"] * hmx, clock_ghz=fitted["73"]["clock_ghz"] * clock,
                         fp16_factor=fitted["73"]["fp16_factor"])
        archs[arch] = HtpArch(arch=arch, reference_soc=soc, ddr_gbs=ddr, vtcm_mb=vtcm, fitted_on=devices,
                              costs=costs, spread=spread, **rates)
    return archs


HTP_ARCHS: dict[str, HtpArch] = make_archs(COSTS, _FITTED_ARCHS, SPREAD)


def device_variant(base: HtpArch, device: str, hmx: float, clock: float) -> HtpArch:
    """`base`'s constants on another device of the same generation: its matrix rate and clock scaled."""
    return replace(base, hmx_gmacs=base.hmx_gmacs * hmx, clock_ghz=base.clock_ghz * clock, fitted_on=(device,),
                   device=device)


# Devices whose published figures separate them from their generation's reference constants (the X Elite runs
# the v73 HTP at another clock and memory system than the QCS8550 the v73 constants follow).
DEVICE_ARCHS: dict[str, HtpArch] = {
    device: device_variant(HTP_ARCHS[spec["arch"]], device, spec["hmx"], spec["clock"])
    for device, spec in _FITTED_DEVICES.items()}


def htp_arch(arch: str | int | HtpArch = "75") -> HtpArch:
    """The constants of `arch` ("75", "v75", 75, an HtpArch, or a device of DEVICE_ARCHS such as
    "Snapdragon X Elite CRD")."""
    if isinstance(arch, HtpArch):
        return arch
    if str(arch) in DEVICE_ARCHS:
        return DEVICE_ARCHS[str(arch)]
    key = str(arch).strip().lower().removeprefix("v")
    if key not in HTP_ARCHS:
        raise MpstudioError(
            f"unknown HTP architecture {arch!r}; the cost model knows {', '.join('v' + a for a in HTP_ARCHS)} "
            f"(pass e.g. htp_arch=\"75\")"
        )
    return HTP_ARCHS[key]
