"""The built-in demo (PP-OCRv4 recognizer) through a local agent on the HTP backend: a8w8 and a mixed plan.

Uses the session-wide `demo` and `demo_quantizer` fixtures of the test suite.
"""

from __future__ import annotations

import numpy as np
import pytest
from agent_fixtures import direct_run, needs_qnn

from mpstudio.agent import LocalAgent
from mpstudio.plan import PrecisionPlan

pytestmark = [pytest.mark.htp, needs_qnn]


@pytest.fixture(scope="module")
def agent():
    with LocalAgent(run_timeout=300) as local:
        yield local


@pytest.fixture(scope="module")
def sample(demo):
    return next(iter(demo.evaluation.feeds()))


def snr_db(reference: np.ndarray, test: np.ndarray) -> float:
    noise = np.sum((reference.astype(np.float64) - test) ** 2)
    return float(10 * np.log10(np.sum(reference.astype(np.float64) ** 2) / max(noise, 1e-30)))


def check_on_htp(agent, model_path, sample):
    result = agent.client.run(model_path, sample, backend="htp", placement=True)
    # The agent's worker and an in-process session run the same HTP kernels: identical numbers.
    expected = direct_run(model_path, "htp", sample)
    for name, value in expected.items():
        np.testing.assert_array_equal(result.outputs[name], value)
    assert result.placement.fully_on_htp, result.placement.on_cpu
    info = agent.client.info()
    assert result.latency.source == ("emulator" if info.htp_kind == "emulator" else "measured")
    # HTP numerics are close to ORT's CPU QDQ reference, not bit-identical: the recognizer picks the
    # same character at nearly every time step (its probabilities themselves are uint8-coarse).
    reference = agent.client.run(model_path, sample, backend="cpu").outputs
    name = next(iter(expected))
    agree = np.mean(reference[name].argmax(-1) == result.outputs[name].argmax(-1))
    print(f"HTP vs CPU QDQ: {snr_db(reference[name], result.outputs[name]):.1f} dB, argmax agreement {agree:.2f}")
    assert agree > 0.8
    return result


def test_demo_a8w8_on_htp(agent, demo_quantizer, sample):
    path = demo_quantizer.generate(PrecisionPlan.a8w8())
    result = check_on_htp(agent, path, sample)
    assert len(result.placement.on_htp) > 100


def test_demo_mixed_plan_on_htp(agent, demo_quantizer, sample):
    activations = demo_quantizer.graph.activations()
    plan = PrecisionPlan.a8w8().promote(activations[: len(activations) // 4], name="first quarter in 16-bit")
    path = demo_quantizer.generate(plan)
    result = check_on_htp(agent, path, sample)
    eight_bit = agent.client.run(demo_quantizer.generate(PrecisionPlan.a8w8()), sample, backend="htp")
    name = next(iter(result.outputs))
    assert not np.array_equal(result.outputs[name], eight_bit.outputs[name])  # the plan really changed the model
