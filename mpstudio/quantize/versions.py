"""The versions of the tools that make a QDQ model, and the generator version: the parts of every cache key
that say a cached calibration or model was made by the code and tools running now."""

from __future__ import annotations

import hashlib
import json

import onnx

# Names generated models in the cache with the plan hash: bump it whenever a plan generates differently.
# 3: activation ranges calibrated with the plan's weights quantized (see the package docstring).
# 4: imported encodings of an op's output before its Relu/Clip get their quantizer back (quantize.unfold).
GENERATOR_VERSION = 4


def toolchain() -> dict[str, str]:
    """The versions of the tools that make a QDQ model: a cache made by other versions is not reused."""
    import onnxruntime

    from importlib import metadata

    versions = {"onnxruntime": onnxruntime.__version__, "onnx": onnx.__version__}
    try:
        versions["onnxruntime-qnn"] = metadata.version("onnxruntime-qnn")
    except metadata.PackageNotFoundError:
        pass
    return versions


def toolchain_key() -> str:
    text = json.dumps(toolchain(), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:8]
