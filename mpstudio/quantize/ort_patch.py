"""ORT's quantizer, one run at a time in a process, sped up where its internals are known.

ORT's QDQ quantizer looks initializers up by a full list scan and rewires consumers by visiting every input of
every node, once per quantized tensor: quadratic in model size. `fast_ort_quantizer` swaps in replacements
that return the same results (tests compare generated models with ORT's own output, tensor by tensor): a name
index over the initializer list, kept valid by watching its length and dropped on every removal, and a
C-level membership test before touching a node's inputs. The swap is process-wide, so every use of ORT's
quantizer here takes its turn (`ort_quantizer_turn`): callers need no lock of their own.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading

from onnxruntime.quantization import base_quantizer as _ort_base_quantizer
from onnxruntime.quantization import onnx_model as _ort_onnx_model
from onnxruntime.quantization import qdq_quantizer as _ort_qdq_quantizer

# ONNX Runtime versions whose quantizer internals `fast_ort_quantizer` was checked against (patched and
# unpatched runs write the same model; tests/test_quantize.py checks it on the installed version). On any
# other version ORT's own code runs unpatched: slower on big models, never different.
PATCHED_ORT_VERSIONS = ("1.31", "1.32")

# ORT's quantizer is patched process-wide while it runs: one run of ORT's quantizer at a time. Reentrant,
# so a run may nest another (the patch counts its depth).
_turn = threading.RLock()


def ort_patch_applies(version: str | None = None) -> bool:
    """Whether the quantizer speed-up is used with this ORT version (`MPSTUDIO_ORT_PATCH=0` turns it off)."""
    import onnxruntime

    if os.environ.get("MPSTUDIO_ORT_PATCH", "1") == "0":
        return False
    major_minor = ".".join((version or onnxruntime.__version__).split(".")[:2])
    return major_minor in PATCHED_ORT_VERSIONS


@contextlib.contextmanager
def ort_quantizer_turn():
    """This thread's turn at ORT's quantizer, unpatched: no other thread runs it (patched or not) meanwhile."""
    with _turn:
        yield


class InitializerIndex:
    """Name -> initializer for one repeated field, extended as the quantizer appends to it."""

    def __init__(self):
        self.container = None
        self.length = 0
        self.by_name: dict = {}

    def lookup(self, name, container):
        if self.container is None or len(container) < self.length:
            self.container, self.length, self.by_name = container, 0, {}
        if len(container) > self.length:
            for index in range(self.length, len(container)):
                item = container[index]
                self.by_name.setdefault(item.name, item)
            self.length = len(container)
        item = self.by_name.get(name)
        if item is not None and item.name != name:  # renamed in place: rebuild once
            self.container = None
            return self.lookup(name, container)
        return item


_indexes = threading.local()  # per thread: id(container) -> InitializerIndex (holding the container)


def _index_for(container) -> InitializerIndex:
    table = _indexes.__dict__.setdefault("table", {})
    index = table.get(id(container))
    if index is None or index.container is not container:
        index = table[id(container)] = InitializerIndex()
    return index


def _forget_indexes() -> None:
    _indexes.__dict__["table"] = {}


def _find_by_name(item_name, item_list):
    if isinstance(item_list, (list, tuple)) or _patch_depth == 0:
        return next((item for item in item_list if item.name == item_name), None)
    return _index_for(item_list).lookup(item_name, item_list)


def _get_initializer(self, name):
    return _find_by_name(name, self.model.graph.initializer)


def _forget_index(method):
    def wrapper(*args, **kwargs):
        _forget_indexes()
        return method(*args, **kwargs)

    return wrapper


def _replace_input_of_all_nodes(self, old_input_name, new_input_name):
    for node in self.model.graph.node:
        if old_input_name in node.input:
            for j, name in enumerate(node.input):
                if name == old_input_name:
                    node.input[j] = new_input_name


_patch_depth = 0
_originals: dict = {}
_REMOVERS = ("remove_initializer", "remove_initializers", "clean_initializers", "remove_unused_constant")


def _patch() -> None:
    model_cls = _ort_onnx_model.ONNXModel
    _originals.update(
        qdq=_ort_qdq_quantizer.find_by_name,
        base=_ort_base_quantizer.find_by_name,
        model=_ort_onnx_model.find_by_name,
        replace=model_cls.replace_input_of_all_nodes,
        get_initializer=model_cls.get_initializer,
        removers={name: getattr(model_cls, name) for name in _REMOVERS if hasattr(model_cls, name)},
    )
    _ort_qdq_quantizer.find_by_name = _find_by_name
    _ort_base_quantizer.find_by_name = _find_by_name
    _ort_onnx_model.find_by_name = _find_by_name
    model_cls.replace_input_of_all_nodes = _replace_input_of_all_nodes
    model_cls.get_initializer = _get_initializer
    for name, method in _originals["removers"].items():
        setattr(model_cls, name, _forget_index(method))


def _unpatch() -> None:
    model_cls = _ort_onnx_model.ONNXModel
    _ort_qdq_quantizer.find_by_name = _originals["qdq"]
    _ort_base_quantizer.find_by_name = _originals["base"]
    _ort_onnx_model.find_by_name = _originals["model"]
    model_cls.replace_input_of_all_nodes = _originals["replace"]
    model_cls.get_initializer = _originals["get_initializer"]
    for name, method in _originals["removers"].items():
        setattr(model_cls, name, method)


@contextlib.contextmanager
def fast_ort_quantizer():
    """This thread's turn at ORT's quantizer (held for the whole run), with its name lookups indexed (it scans
    every initializer for each of them, which is quadratic on big models) on the ORT versions the patch is
    checked against; ORT's own code otherwise."""
    global _patch_depth
    with _turn:
        if not ort_patch_applies():
            yield
            return
        if _patch_depth == 0:
            _patch()
        _patch_depth += 1
        _forget_indexes()
        try:
            yield
        finally:
            _forget_indexes()
            _patch_depth -= 1
            if _patch_depth == 0:
                _unpatch()


@contextlib.contextmanager
def quiet_ort_logging():
    """ORT's quantization tools log advice at WARNING on the root logger; keep a user's terminal clean."""
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        yield
    finally:
        root.setLevel(level)
