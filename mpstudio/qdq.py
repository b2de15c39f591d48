"""Reading a QDQ model once: every quantized tensor with its encoding and converts, and every float op with
the types it computes in. Sensitivity, export, latency and isolation all read QDQ models through here.

ORT names things predictably: the float op output keeps the tensor's name `T` (or `T_QuantizeLinear_Input`
for a graph output, whose name moves to the last DequantizeLinear output), the DequantizeLinear output that
feeds the consumers is `T_DequantizeLinear_Output`, and a quantized initializer `W` is stored as
`W_quantized`. A QuantizeLinear that reads a DequantizeLinear output of an activation is a *convert*: the
same tensor re-quantized for consumers of another type. Some float tensors have no counterpart (a Conv
output whose Relu ORT folded); they are absent, not guessed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from .errors import MpstudioError
from .graph import node_display_name, producers_and_consumers
from .model import load_model

# A graph output T is written by its op as T + GRAPH_OUTPUT_SUFFIX (the last DequantizeLinear writes T).
GRAPH_OUTPUT_SUFFIX = "_QuantizeLinear_Input"
# The value consumers read is T + DEQUANTIZED_SUFFIX.
DEQUANTIZED_SUFFIX = "_DequantizeLinear_Output"
# A quantized initializer W is stored as W + QUANTIZED_INITIALIZER_SUFFIX.
QUANTIZED_INITIALIZER_SUFFIX = "_quantized"

ACTIVATION, PARAM = "activation", "param"

# Integer element types of Q/DQ tensors: name, bit width, lowest code.
INTEGER_TYPES = {
    TensorProto.UINT8: ("uint8", 8, 0),
    TensorProto.INT8: ("int8", 8, -(2 ** 7)),
    TensorProto.UINT16: ("uint16", 16, 0),
    TensorProto.INT16: ("int16", 16, -(2 ** 15)),
    TensorProto.INT32: ("int32", 32, -(2 ** 31)),
    TensorProto.UINT4: ("uint4", 4, 0),
    TensorProto.INT4: ("int4", 4, -(2 ** 3)),
}
_BITS_AND_QMIN = {name: (bits, qmin) for name, bits, qmin in INTEGER_TYPES.values()}
FLOAT_TYPES = (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.DOUBLE, TensorProto.BFLOAT16)


# ---- encodings --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Encoding:
    """One quantizer: `x = (q - zero_point) * scale`, per tensor or per channel along `axis`."""

    dtype: str  # uint8 / int8 / uint16 / int16 / int32 / uint4 / int4
    scale: tuple[float, ...]
    zero_point: tuple[int, ...]
    axis: int | None = None  # None: per tensor

    @classmethod
    def per_tensor(cls, scale: float, zero_point: int, dtype: str) -> "Encoding":
        return cls(dtype, (float(scale),), (int(zero_point),))

    @property
    def bits(self) -> int:
        return _BITS_AND_QMIN[self.dtype][0]

    bitwidth = bits

    @property
    def qmin(self) -> int:
        return _BITS_AND_QMIN[self.dtype][1]

    @property
    def qmax(self) -> int:
        return self.qmin + 2 ** self.bits - 1

    @property
    def per_channel(self) -> bool:
        return self.axis is not None

    @property
    def step(self) -> float:
        """The scale of a per-tensor encoding (the quantization step)."""
        self._check_per_tensor()
        return self.scale[0]

    @property
    def zero(self) -> int:
        """The zero point of a per-tensor encoding."""
        self._check_per_tensor()
        return self.zero_point[0]

    @property
    def clip_range(self) -> tuple[float, float]:
        """The float interval a per-tensor encoding represents (values outside it saturate)."""
        return ((self.qmin - self.zero) * self.step, (self.qmax - self.zero) * self.step)

    @property
    def offsets(self) -> tuple[int, ...]:
        """QNN/AIMET offsets: `x = (u + offset) * scale` with `u` the code read as unsigned, so -zero_point there."""
        return tuple(self.qmin - zp for zp in self.zero_point)

    def to_qnn(self) -> list[dict[str, Any]]:
        """The AIMET/QNN encoding list: one dict per tensor, or one per channel."""
        levels = 2 ** self.bits - 1
        symmetric_offset = -(2 ** (self.bits - 1))
        out = []
        for scale, offset in zip(self.scale, self.offsets):
            low = offset * scale
            out.append({"bitwidth": self.bits, "dtype": "int", "is_symmetric": str(offset == symmetric_offset),
                        "max": low + levels * scale, "min": low, "offset": offset, "scale": scale})
        return out

    def _check_per_tensor(self) -> None:
        if self.axis is not None or len(self.scale) != 1:
            raise MpstudioError(f"a per-channel encoding ({len(self.scale)} channels) has no single scale")


def dequantize(codes, scale, zero_point, axis: int | None = None) -> np.ndarray:
    """The float32 values `codes` stand for, `(codes - zero_point) * scale`, computed as a DequantizeLinear
    computes them: the difference in integers, then one float32 product. Per tensor (`scale` and `zero_point`
    scalars or one-element arrays), or per channel along `axis` (one of each per channel)."""
    codes = np.asarray(codes).astype(np.int64)
    scale, zero = _along(scale, zero_point, codes.ndim, axis)
    return np.asarray((codes - zero).astype(np.float32) * scale, np.float32)


def quantize(values, scale, zero_point, qmin: int, qmax: int, axis: int | None = None) -> np.ndarray:
    """The int64 codes a QuantizeLinear computes for `values`, the inverse of `dequantize`: the float32 quotient by
    `scale` rounded half to even, plus `zero_point`, saturated to [`qmin`, `qmax`]. Per tensor, or per channel along
    `axis` (one scale and zero point per channel)."""
    values = np.asarray(values, np.float32)
    scale, zero = _along(scale, zero_point, values.ndim, axis)
    return np.clip(np.rint(values / scale).astype(np.int64) + zero, qmin, qmax)


def _along(scale, zero_point, ndim: int, axis: int | None) -> tuple[np.ndarray, np.ndarray]:
    """A quantizer's float32 scale and int64 zero point shaped to broadcast over an array of `ndim` axes: scalars
    per tensor (`axis` None), one per channel along `axis` otherwise."""
    scale, zero = np.asarray(scale, np.float32), np.asarray(zero_point).astype(np.int64)
    if axis is None:
        return scale.reshape(()), zero.reshape(())
    shape = [1] * ndim
    shape[axis % ndim] = -1
    return scale.reshape(shape), zero.reshape(shape)


# ---- what a QDQ model says ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class QuantizedTensor:
    """One float tensor as the QDQ model quantizes it.

    `name` is the float model's name; `encoding` is what its producer writes (for a weight or bias, what is
    stored); `converts` are the re-quantizations ORT inserts for consumers of another type (activations
    only). For an activation, `pre` is the tensor the QuantizeLinear reads and `post` the DequantizeLinear
    output its consumers read, both named as in the QDQ model.
    """

    name: str
    kind: str  # ACTIVATION (graph inputs and outputs too) or PARAM (weights, biases)
    encoding: Encoding
    converts: tuple[Encoding, ...] = ()
    pre: str = ""
    post: str = ""
    quantize_node: str = ""

    def __eq__(self, other) -> bool:  # what the model says of the tensor, not where its nodes are
        if not isinstance(other, QuantizedTensor):
            return NotImplemented
        return (self.name, self.kind, self.encoding, self.converts) == (other.name, other.kind, other.encoding,
                                                                          other.converts)

    def __hash__(self) -> int:
        return hash((self.name, self.kind, self.encoding, self.converts))


@dataclass(frozen=True)
class OpOperand:
    """One operand of a float op: `tensor` names the value as the op sees it (through any converts, the float
    model's tensor), `dtype` the type the op receives or writes it in ("float32" when not quantized), `role`
    is "activation", "weight" (a quantized or float initializer) or "index" (integer shapes, axes, indices),
    and `value` names the tensor in the QDQ model (for its shape)."""

    tensor: str
    dtype: str
    role: str
    value: str


@dataclass(frozen=True)
class QdqOp:
    """A float op of the QDQ model with the types of its operands."""

    index: int
    name: str
    op_type: str
    inputs: tuple[OpOperand, ...]
    outputs: tuple[OpOperand, ...]
    node: onnx.NodeProto

    @property
    def weights(self) -> tuple[OpOperand, ...]:
        return tuple(o for o in self.inputs if o.role == "weight")

    @property
    def activations(self) -> tuple[OpOperand, ...]:
        return tuple(o for o in self.inputs if o.role == "activation")


@dataclass(frozen=True)
class QdqConvert:
    """A re-quantization of `tensor` from `source` to `target` (ORT's convert at a precision boundary)."""

    name: str
    tensor: str
    source: str  # dtype
    target: str  # dtype
    value: str  # the tensor in the QDQ model whose shape the convert has


@dataclass(frozen=True)
class GraphIO:
    """A graph input's QuantizeLinear or a graph output's DequantizeLinear: ORT's QNN EP leaves them to the CPU."""

    name: str
    op_type: str  # QuantizeLinear / DequantizeLinear
    tensor: str  # the float model's tensor
    dtype: str  # the quantized type
    value: str  # the graph input or output


class QdqModel:
    """A QDQ model read once: `tensors` (QuantizedTensor by float name), `ops` (QdqOp, in graph order),
    `converts`, `graph_io`, and the graph's inputs and outputs."""

    def __init__(self, model: onnx.ModelProto):
        graph = model.graph
        if not len(graph.node):
            raise MpstudioError("the model has no nodes; give a QDQ model (or a float model)")
        self.model = model
        self.initializers: dict[str, onnx.TensorProto] = {i.name: i for i in graph.initializer}
        self.graph_inputs = tuple(i.name for i in graph.input if i.name not in self.initializers)
        self.graph_outputs = tuple(o.name for o in graph.output)
        self.producer, self.consumers = producers_and_consumers(graph)
        self._value_types = {vi.name: vi.type.tensor_type.elem_type
                             for vi in list(graph.input) + list(graph.output) + list(graph.value_info)}
        self.tensors: dict[str, QuantizedTensor] = {}
        self.converts: list[QdqConvert] = []
        self.graph_io: list[GraphIO] = []
        self.ops: list[QdqOp] = []
        self._root: dict[str, str] = {}  # QuantizeLinear output -> float tensor name
        self._read_quantizers()
        self._read_ops()

    @property
    def quantized(self) -> bool:
        """Whether the model has quantized activations (a float model has none)."""
        return any(t.kind == ACTIVATION for t in self.tensors.values())

    def activations(self) -> dict[str, QuantizedTensor]:
        return {n: t for n, t in self.tensors.items() if t.kind == ACTIVATION}

    def params(self) -> dict[str, QuantizedTensor]:
        return {n: t for n, t in self.tensors.items() if t.kind == PARAM}

    def dequantized_constant(self, name: str) -> np.ndarray | None:
        """The float value a per-tensor quantized initializer (float name) stands for, as the model computes it."""
        node = next((n for n in self.consumers.get(name + QUANTIZED_INITIALIZER_SUFFIX, ())
                     if n.op_type == "DequantizeLinear"), None)
        tensor = self.tensors.get(name)
        if node is None or tensor is None or tensor.encoding.per_channel:
            return None
        return dequantize(numpy_helper.to_array(self.initializers[node.input[0]]), tensor.encoding.step,
                          tensor.encoding.zero)

    # ---- quantizers ----
    def _read_quantizers(self) -> None:
        pending_converts = []
        for index, node in enumerate(self.model.graph.node):
            if node.op_type == "DequantizeLinear" and node.input[0] in self.initializers:
                stored = node.input[0]
                self._add(QuantizedTensor(stored.removesuffix(QUANTIZED_INITIALIZER_SUFFIX), PARAM,
                                          self._encoding(node, stored)))
            elif node.op_type == "QuantizeLinear":
                source = node.input[0]
                if _is_dq(self.producer.get(source)):
                    pending_converts.append(node)
                    continue
                self._read_quantize(node, source, index)
        for node in pending_converts:  # Q(DQ(Q(T))): follow the chain back to T, in graph order
            dq = self.producer[node.input[0]]
            root = self._root.get(dq.input[0])
            if root is None:
                raise MpstudioError(f"QuantizeLinear {node.name!r} re-quantizes a value whose source is not "
                                    "quantized in this model; is it a QDQ model made by ONNX Runtime's quantizer?")
            self._root[node.output[0]] = root
            tensor = self.tensors[root]
            encoding = self._encoding(node)
            if encoding not in tensor.converts:
                self.tensors[root] = _replace_converts(tensor, tensor.converts + (encoding,))
            self.converts.append(QdqConvert(node.name or node.output[0], root, _dtype(dq, self.initializers),
                                            encoding.dtype, node.input[0]))

    def _read_quantize(self, node: onnx.NodeProto, source: str, index: int) -> None:
        if source in self.initializers:  # a float initializer quantized at run time
            self._add(QuantizedTensor(source, PARAM, self._encoding(node, source)))
            self._root[node.output[0]] = source
            return
        stripped = source.removesuffix(GRAPH_OUTPUT_SUFFIX)
        name = stripped if stripped != source and stripped in self.graph_outputs else source
        dq = next((c for c in self.consumers.get(node.output[0], ()) if c.op_type == "DequantizeLinear"), None)
        self._add(QuantizedTensor(name, ACTIVATION, self._encoding(node), pre=source,
                                  post=dq.output[0] if dq is not None else "",
                                  quantize_node=node_display_name(node, index)))
        self._root[node.output[0]] = name
        if source in self.graph_inputs:
            self.graph_io.append(GraphIO(node.name or node.output[0], "QuantizeLinear", name,
                                         self.tensors[name].encoding.dtype, source))

    def _add(self, tensor: QuantizedTensor) -> None:
        seen = self.tensors.get(tensor.name)
        if seen is not None and seen.encoding != tensor.encoding:
            raise MpstudioError(f"tensor {tensor.name!r} is quantized twice with different parameters in this "
                                "model; mpstudio reads QDQ models made by ONNX Runtime's quantizer, which "
                                "quantizes a tensor once")
        if seen is None:
            self.tensors[tensor.name] = tensor

    def _encoding(self, node: onnx.NodeProto, data: str | None = None) -> Encoding:
        inits = self.initializers
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        if attrs.get("block_size"):
            raise MpstudioError(f"{node.op_type} {node.name!r} uses block quantization, which mpstudio does not "
                                "read")
        if len(node.input) < 2 or node.input[1] not in inits:
            raise MpstudioError(f"{node.op_type} {node.name!r} has no scale initializer; mpstudio reads QDQ "
                                "models made by ONNX Runtime's quantizer")
        scale = numpy_helper.to_array(inits[node.input[1]]).astype(np.float64).ravel()
        has_zero = len(node.input) > 2 and node.input[2]
        if has_zero and node.input[2] not in inits:
            raise MpstudioError(f"{node.op_type} {node.name!r} has no zero-point initializer")
        if has_zero:
            zero_init = inits[node.input[2]]
            elem_type = zero_init.data_type
            zero = numpy_helper.to_array(zero_init).astype(np.int64).ravel()
        else:  # no zero point: the output_dtype attribute, the stored data's type, or uint8
            elem_type = attrs.get("output_dtype") or (inits[data].data_type if data else TensorProto.UINT8)
            zero = np.zeros_like(scale, dtype=np.int64)
        if elem_type not in INTEGER_TYPES:
            raise MpstudioError(f"{node.op_type} {node.name!r} quantizes to "
                                f"{TensorProto.DataType.Name(elem_type)}, an element type mpstudio does not read "
                                "(integer types only)")
        axis = None
        scale_rank = len(inits[node.input[1]].dims)
        if scale.size > 1 or (scale_rank == 1 and "axis" in attrs):
            axis = int(attrs.get("axis", 1))  # ONNX's default axis for per-axis Q/DQ
            if data is not None and axis < 0:
                axis += len(inits[data].dims)
        return Encoding(INTEGER_TYPES[elem_type][0], tuple(float(s) for s in scale),
                        tuple(int(z) for z in zero), axis)

    def quantized_type(self, node: onnx.NodeProto) -> str:
        """The quantized type a QuantizeLinear of this model writes or a DequantizeLinear reads."""
        return _dtype(node, self.initializers)

    # ---- ops ----
    def origin(self, value: str) -> str:
        """The float model's tensor a (possibly converted) quantized value stands for."""
        return self._root.get(value, value)

    def _read_ops(self) -> None:
        for index, node in enumerate(self.model.graph.node):
            if node.op_type == "QuantizeLinear":
                continue
            if node.op_type == "DequantizeLinear":
                if node.output[0] in self.graph_outputs and node.input[0] not in self.initializers:
                    self.graph_io.append(GraphIO(node.name or node.output[0], "DequantizeLinear",
                                                 self.origin(node.input[0]), _dtype(node, self.initializers),
                                                 node.output[0]))
                continue
            inputs = tuple(o for o in (self._input(name) for name in node.input if name) if o is not None)
            outputs = tuple(self._output(name) for name in node.output if name)
            self.ops.append(QdqOp(index, node_display_name(node, index), node.op_type, inputs, outputs, node))

    def _input(self, name: str) -> OpOperand | None:
        src = self.producer.get(name)
        if _is_dq(src):
            q_in = src.input[0]
            if q_in in self.initializers:
                return OpOperand(self.origin(q_in.removesuffix(QUANTIZED_INITIALIZER_SUFFIX)),
                                 _dtype(src, self.initializers), "weight", name)
            return OpOperand(self.origin(q_in), _dtype(src, self.initializers), "activation", name)
        if name in self.initializers:
            init = self.initializers[name]
            if init.data_type in FLOAT_TYPES:
                return OpOperand(name, "float32", "weight", name)
            return OpOperand(name, _np_name(init.data_type), "index", name)
        if src is None and name not in self.graph_inputs:
            return None  # an optional input nothing writes
        elem = self._value_types.get(name, TensorProto.FLOAT)
        role = "activation" if elem in FLOAT_TYPES else "index"
        return OpOperand(name, _np_name(elem) if role == "index" else "float32", role, name)

    def _output(self, name: str) -> OpOperand:
        q = next((c for c in self.consumers.get(name, ()) if c.op_type == "QuantizeLinear"), None)
        dtype = _dtype(q, self.initializers) if q is not None else "float32"
        return OpOperand(name.removesuffix(GRAPH_OUTPUT_SUFFIX) if q is not None else name, dtype, "activation", name)


def _is_dq(node) -> bool:
    return node is not None and node.op_type == "DequantizeLinear"


def _replace_converts(tensor: QuantizedTensor, converts: tuple[Encoding, ...]) -> QuantizedTensor:
    return QuantizedTensor(tensor.name, tensor.kind, tensor.encoding, converts, tensor.pre, tensor.post,
                           tensor.quantize_node)


def _np_name(elem_type: int) -> str:
    try:
        return helper.tensor_dtype_to_np_dtype(elem_type).name
    except Exception:
        return "float32"


def _dtype(node: onnx.NodeProto, inits: Mapping[str, onnx.TensorProto]) -> str:
    """The quantized type a QuantizeLinear writes or a DequantizeLinear reads."""
    if len(node.input) > 2 and node.input[2] in inits:
        return _np_name(inits[node.input[2]].data_type)
    if node.op_type == "DequantizeLinear" and node.input[0] in inits:
        return _np_name(inits[node.input[0]].data_type)
    for attr in node.attribute:
        if attr.name == "output_dtype" and attr.i:
            return _np_name(attr.i)
    return "uint8"


# ---- loading ----------------------------------------------------------------------------------------------
def load(model) -> onnx.ModelProto:
    """A ModelProto from a path, bytes or a ModelProto (`model.load_model`: one loader, one set of messages)."""
    return load_model(model)


def read(model) -> QdqModel:
    """`model` (a path, a ModelProto or a QdqModel) read once."""
    return model if isinstance(model, QdqModel) else QdqModel(load(model))


def quantized_tensors(model) -> dict[str, QuantizedTensor]:
    """Every quantized tensor of a QDQ model made by ORT's quantizer, keyed by the float model's tensor name."""
    return read(model).tensors


def with_outputs(model, names) -> bytes:
    """`model` serialized with `names` as its only graph outputs (float values)."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model.model if isinstance(model, QdqModel) else load(model))
    del copy.graph.output[:]
    # The shape is left open: ORT infers it, and QDQ models rarely carry value_info.
    copy.graph.output.extend(helper.make_tensor_value_info(name, TensorProto.FLOAT, None)
                             for name in dict.fromkeys(names))
    return copy.SerializeToString()


__all__ = ["Encoding", "dequantize", "quantize", "QuantizedTensor", "QdqModel", "QdqOp", "OpOperand", "QdqConvert",
           "GraphIO", "read", "load", "quantized_tensors", "with_outputs", "ACTIVATION", "PARAM", "GRAPH_OUTPUT_SUFFIX",
           "DEQUANTIZED_SUFFIX", "QUANTIZED_INITIALIZER_SUFFIX", "INTEGER_TYPES"]
