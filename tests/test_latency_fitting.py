"""The cost model's fit and its leave-one-architecture-out cross-validation run on numpy alone, and recover
constants from figures the model itself generated."""

import subprocess
import sys
import textwrap

import numpy as np
import pandas as pd
import pytest

from mpstudio.errors import MpstudioError
from mpstudio.latency import HTP_ARCHS, OpFeatures
from mpstudio.latency import fitting


def _features(macs: float, work: float, act_type: str) -> OpFeatures:
    """A conv on HMX, a sigmoid and an add on HVX, and the per-call graph cost."""
    n = 4
    return OpFeatures(
        kind=np.array([0, 0, 0, 3]), engine=np.array(["hmx", "hvx", "hvx", "graph"], dtype=object),
        cls=np.array(["hmx", "transcendental", "arith", ""], dtype=object),
        act_type=np.array([act_type] * n, dtype=object), wide_weights=np.zeros(n, bool),
        hmx_macs=np.array([macs, 0, 0, 0]), work=np.array([0, work, work, 0]),
        act_bytes=np.array([work, work, 2 * work, 0.0]), weight_bytes=np.array([1e5, 0, 0, 0]),
        hidden_by=np.array([-1, 0, -1, -1]))


def synthetic_table():
    feats, rows = {}, []
    rng = np.random.default_rng(0)
    for i in range(4):
        macs, work = 10 ** rng.uniform(8, 9.5), 10 ** rng.uniform(5.5, 7)
        for precision, act in (("w8a8", "uint8"), ("w8a16", "uint16"), ("float", "float16")):
            feats[f"m{i}", precision] = _features(macs, work, act)
    priced = fitting.Priced(feats)
    for (model, precision) in feats:
        for device, arch in (("S24", "75"), ("S25", "79"), ("QCS8550", "73")):
            rows.append({"model": model, "device": device, "precision": precision, "arch": arch})
    rows = pd.DataFrame(rows)
    # The figures of the nominal constants (where the fit's pull points), so the fit can reach them exactly.
    truth = fitting.estimates(fitting.archs_from(fitting.bounds_and_nominal()[2], HTP_ARCHS["75"].spread),
                              priced, rows)
    return priced, rows.assign(latency_ms=truth)


def test_cross_validation_recovers_figures_the_model_made():
    priced, rows = synthetic_table()
    cv = fitting.cross_validate(priced, rows, HTP_ARCHS, iterations=15)
    assert np.isfinite(cv).all()
    errors = fitting.log_errors(rows, cv)
    assert set(errors["quantity"]) == {"w8a8", "w8a16", "float", "r16", "rfp"}
    start = fitting.log_errors(rows, fitting.estimates(HTP_ARCHS, priced, rows))
    # Fitted without a model, the constants still predict it: held-out errors far below the start's.
    assert errors["log_err"].abs().median() < start["log_err"].abs().median() / 3
    spread = fitting.cv_spread(errors)
    assert all(c >= 0.8 for c in spread.coverage.values())
    assert spread.spread.coverage == 0.8


def test_the_fitter_moves_constants_toward_the_data():
    priced, rows = synthetic_table()
    slower = rows.assign(latency_ms=rows["latency_ms"] * 1.5)
    before = np.abs(np.log(fitting.estimates(HTP_ARCHS, priced, slower) / slower["latency_ms"])).mean()
    archs = fitting.fit_constants(priced, slower, HTP_ARCHS, HTP_ARCHS["75"].spread, iterations=10)
    after = np.abs(np.log(fitting.estimates(archs, priced, slower) / slower["latency_ms"])).mean()
    assert after < before / 3


def test_fit_without_rows_is_a_clear_error():
    priced, rows = synthetic_table()
    with pytest.raises(MpstudioError, match="no published rows"):
        fitting.fit_constants(priced, rows.iloc[:0], HTP_ARCHS, HTP_ARCHS["75"].spread)


def test_cross_validation_runs_without_scipy(tmp_path):
    code = textwrap.dedent("""
        import sys
        sys.modules["scipy"] = None  # any import of scipy now fails
        sys.path.insert(0, %r)
        import test_latency_fitting as t
        t.test_cross_validation_recovers_figures_the_model_made()
        assert "scipy.optimize" not in sys.modules
        print("ok")
    """ % str(__import__("pathlib").Path(__file__).parent))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().endswith("ok")


def test_left_out_fits_can_start_where_no_published_row_shaped_them():
    stored = {**HTP_ARCHS, **_device_start()}
    start = fitting.nominal_archs(HTP_ARCHS["75"].spread, stored)
    nominal = dict((name, value) for name, value, *_ in fitting.SHARED)
    assert start["75"].costs.op_cycles == pytest.approx(nominal["op_cycles"])
    assert start["73"].clock_ghz == pytest.approx(1.0) and start["79"].hmx_gmacs == pytest.approx(10000.0)
    held = fitting.nominal_archs(HTP_ARCHS["75"].spread, stored, fixed=("depthwise",))
    assert held["75"].costs.depthwise == pytest.approx(stored["75"].costs.depthwise)
    assert held["75"].costs.overlap == pytest.approx(nominal["overlap"])


def _device_start():
    from mpstudio.latency.arch import DEVICE_ARCHS, device_variant

    out = dict(DEVICE_ARCHS)
    for device, generation in fitting.FIT_DEVICES.items():
        out.setdefault(device, device_variant(HTP_ARCHS[generation], device, 1.0, 1.0))
    return out


def test_constants_the_data_cannot_identify_stay_held():
    # v75's clock and fp16 factor trade exactly or nearly with other constants; every fit keeps them at their
    # stated values, and the other generations' move.
    priced, rows = synthetic_table()
    slower = rows.assign(latency_ms=rows["latency_ms"] * 1.5)
    archs = fitting.fit_constants(priced, slower, HTP_ARCHS, HTP_ARCHS["75"].spread, iterations=10)
    for (generation, name), value in fitting.HELD.items():
        assert getattr(archs[generation], name) == pytest.approx(value)
    assert archs["73"].clock_ghz != pytest.approx(HTP_ARCHS["73"].clock_ghz, rel=1e-3)
    lower, upper, nominal = fitting.bounds_and_nominal()
    held = fitting.theta_from(archs)
    fixed = np.isclose(lower, upper)
    assert fixed.sum() == len(fitting.HELD) and np.allclose(held[fixed], lower[fixed])
    assert {g for g, _ in fitting.HELD} <= set(fitting.FIT_ARCHS)
