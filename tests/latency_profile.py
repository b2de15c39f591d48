"""A recorded per-op HTP profile for the cost model's recalibration test, and the model it was recorded on.

`python tests/latency_profile.py` re-records tests/data/latency_profile.json: it builds the model below,
quantizes it (a8w8, mpstudio's Quantizer), runs it on a local agent's HTP backend with profile=True and
writes the agent's OpProfile and median latency. On an x86_64 host the HTP backend is the emulator, so the
profile's source is "emulator" (host time, not device latency); the file says so.
"""

from __future__ import annotations

import hashlib
import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

IR = 10
PROFILE = Path(__file__).resolve().parent / "data" / "latency_profile.json"
SHAPE = (1, 16, 32, 32)


def silu_net() -> onnx.ModelProto:
    """x -> 3x3 Conv+SiLU -> 3x3 Conv+SiLU -> depthwise 3x3 + Relu -> 1x1 Conv -> Softmax over channels -> y."""
    rng = np.random.default_rng(0)
    nodes, inits = [], []

    def conv(x, cin, cout, k, group=1, name=""):
        w = rng.normal(0, (2 / (k * k * cin / group)) ** 0.5, (cout, cin // group, k, k)).astype(np.float32)
        inits.extend([numpy_helper.from_array(w, name + ".w"),
                      numpy_helper.from_array(np.zeros(cout, np.float32), name + ".b")])
        nodes.append(helper.make_node("Conv", [x, name + ".w", name + ".b"], [name], name=name, pads=[k // 2] * 4,
                                      group=group, kernel_shape=[k, k]))
        return name

    def silu(x):
        nodes.append(helper.make_node("Sigmoid", [x], [x + "_sig"], name=x + "_sigmoid"))
        nodes.append(helper.make_node("Mul", [x, x + "_sig"], [x + "_silu"], name=x + "_mul"))
        return x + "_silu"

    y = silu(conv("x", 16, 32, 3, name="conv1"))
    y = silu(conv(y, 32, 32, 3, name="conv2"))
    y = conv(y, 32, 32, 3, group=32, name="dw")
    nodes.append(helper.make_node("Relu", [y], ["dw_relu"], name="dw_relu"))
    y = conv("dw_relu", 32, 64, 1, name="conv3")
    nodes.append(helper.make_node("Softmax", [y], ["y"], name="softmax", axis=1))
    graph = helper.make_graph(nodes, "silu_net", [helper.make_tensor_value_info("x", TensorProto.FLOAT, SHAPE)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64, 32, 32])],
                              initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=IR)


def feeds(count: int = 2) -> list[dict]:
    rng = np.random.default_rng(1)
    return [{"x": rng.normal(0, 1, SHAPE).astype(np.float32)} for _ in range(count)]


def quantized(cache: Path) -> Path:
    """The a8w8 QDQ model the profile was recorded on."""
    from mpstudio.data import FeedList
    from mpstudio.model import prepare_model
    from mpstudio.plan import PrecisionPlan
    from mpstudio.quantize import Quantizer

    return Quantizer(prepare_model(silu_net()), FeedList(feeds()), cache).generate(PrecisionPlan.a8w8())


def node_names(model_path: Path) -> list[str]:
    return [n.name for n in onnx.load(str(model_path)).graph.node]


def fingerprint(model_path: Path) -> str:
    """What the recorded profile depends on: the QDQ model's nodes (names, types, inputs)."""
    model = onnx.load(str(model_path))
    text = "|".join(f"{n.name}:{n.op_type}:{','.join(n.input)}" for n in model.graph.node)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def record() -> None:
    from mpstudio.agent import LocalAgent

    with tempfile.TemporaryDirectory() as tmp:
        path = quantized(Path(tmp))
        with LocalAgent(device_name="x86_64 host") as agent:
            result = agent.client.run(path, feeds(1)[0], backend="htp", provider_options={"htp_arch": "75"},
                                      warmup=2, iterations=10, outputs=False, profile=True, profile_runs=5)
        PROFILE.parent.mkdir(exist_ok=True)
        PROFILE.write_text(json.dumps({
            "model": fingerprint(path), "source": result.profile.source, "median_ms": result.latency.median_ms,
            "note": "per-op profile of tests/latency_profile.py's silu_net (a8w8) on a local agent's HTP backend; "
                    "source 'emulator' means host time of the x86_64 HTP emulator, not device latency",
            "profile": result.profile.to_dict()}, indent=1) + "\n")
    print(f"recorded {PROFILE}: {len(result.profile.ops)} ops, {result.profile.source}, "
          f"{result.latency.median_ms:.3f} ms")


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    record()
