"""What the worker reads from a model file itself: its nodes, and its dynamic inputs."""

from __future__ import annotations

import functools


@functools.lru_cache(maxsize=8)
def model_nodes(model_path: str) -> tuple[tuple[str, str], ...]:
    """(name, op_type) of the model's top-level nodes, in order. Model files are named by their sha256, so a
    path always holds the same model."""
    import onnx

    model = onnx.load(model_path, load_external_data=False)
    return tuple((n.name, n.op_type) for n in model.graph.node)


def dynamic_shape_hint(model_path: str) -> str:
    """The sentence an HTP refusal adds when the model has dynamic input shapes ('' when it has none)."""
    import onnx

    model = onnx.load(model_path, load_external_data=False)
    dynamic = []
    for value in model.graph.input:
        dims = value.type.tensor_type.shape.dim
        if any(not d.HasField("dim_value") for d in dims):
            shape = [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in dims]
            dynamic.append(f"{value.name} {shape}")
    if not dynamic:
        return ""
    return (f" The model has dynamic input shapes ({', '.join(dynamic)}), which QNN does not support: fix them "
            "to static sizes (python -m onnxruntime.tools.make_dynamic_shape_fixed).")
