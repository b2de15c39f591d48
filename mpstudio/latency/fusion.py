"""The fusions QNN makes before the HTP runs a graph: SiLU, hard-swish and GELU (erf or tanh form) patterns become
one op, and the
activation after a matrix op fuses into it (no cost of its own) or overlaps with it on the vector unit."""

from __future__ import annotations

from collections import defaultdict

from .ops import HVX_CLASS, MECHANISMS, HtpOp

# Activations the HTP fuses into the matrix op before them, in every precision (QNN HTP guidelines).
_FUSABLE = {"Relu", "Clip", "LeakyRelu", "PRelu", "HardSwish"}
# Element-wise activations that run on HVX after a matrix op and can overlap with it.
# Clamps that fuse into the vector op before them (the op's output stage applies them).
_CLAMPS = {"Relu", "Clip"}
_OVERLAPPING = {"SiLU", "Gelu", "Sigmoid", "Tanh", "HardSigmoid", "Elu", "Add", "Mul"}
# Activations that overlap with the depthwise convolution before them (mechanism `silu_after_depthwise`).
_AFTER_DEPTHWISE = {"SiLU", "Gelu", "Sigmoid", "HardSwish"}


def fuse(ops: list[HtpOp]) -> None:
    """Rewrite `ops` as the HTP runs them: SiLU, hard-swish and GELU patterns become one op, activations after
    matrix ops fuse into them (or overlap with them)."""
    graph = _OpGraph(ops)
    for op in ops:
        if op.op_type == "Sigmoid":
            _fuse_gated(graph, op, "SiLU")
        elif op.op_type == "HardSigmoid":
            _fuse_gated(graph, op, "HardSwish")
        elif op.op_type == "Erf":
            _fuse_gelu(graph, op)
        elif op.op_type == "Tanh":
            _fuse_tanh_gelu(graph, op)
    _fuse_activations(ops, _OpGraph(ops))
    if MECHANISMS["batchnorm_before_conv"]:
        _fold_batchnorms_into_convs(ops, _OpGraph(ops))


def _fold_batchnorms_into_convs(ops: list[HtpOp], graph: _OpGraph) -> None:
    """Mechanism `batchnorm_before_conv`: an fp16 BatchNormalization that runs as a vector op of its own (DenseNet's
    after each join), with the clamp fused into it, whose every reader is a convolution, is applied as those
    convolutions stage their input for the matrix unit (a per-channel multiply-add and a clamp on the fp16 values
    the vector unit prepares): no pass over the joined tensor and no fixed cost of its own. A quantized one writes
    a tensor requantized to its readers' scale and still runs (latency.fusion.split_batchnorms)."""
    for i, op in enumerate(ops):
        if not _standalone_batchnorm(op, floating=True):
            continue
        written = {op.outputs[0][0]} | {n for o in ops if o.fused_into == i for n, _, _ in o.outputs}
        readers = [r for name in written for r in graph.readers.get(name, [])]
        if readers and all(ops[r].op_type == "Conv" and ops[r].engine == "hmx" for r in readers):
            op.engine, op.fused_into = "fused", readers[0]


def concat_requantizations(ops: list[HtpOp]) -> list[HtpOp]:
    """Mechanism `concat_requantize`: the requantization a quantized Concat makes of its inputs, each quantized with
    a scale of its own, to its output's scale: an HVX pass of its own over every input element before the data
    moves (QNN inserts it; the device's layer counts show more layers for DenseNet's quantized model than its
    float one). Empty unless the mechanism is on; a float (fp16) Concat needs none."""
    if not MECHANISMS["concat_requantize"]:
        return []
    out = []
    for op in ops:
        if (op.op_type != "Concat" or op.kind != "compute" or len(op.inputs) < 2 or not op.outputs
                or any(t.startswith("float") for _, t, _ in op.inputs + op.outputs)):
            continue
        name, dtype, _ = op.outputs[0]
        if MECHANISMS["concat_requantize_per_input"]:
            # One requantization per input (each has a scale of its own): an op, and a fixed cost, per input.
            out += [HtpOp(f"{op.node} requantize {i}", "Requantize", "hvx", [source],
                          [(f"{name} (requantized input {i})", dtype, source[2])], work=source[2], cls="convert")
                    for i, source in enumerate(op.inputs)]
            continue
        elements = sum(n for _, _, n in op.inputs)
        out.append(HtpOp(f"{op.node} requantize", "Requantize", "hvx", list(op.inputs),
                         [(f"{name} (requantized inputs)", dtype, elements)], work=elements, cls="convert"))
    return out


def split_batchnorms(ops: list[HtpOp]) -> None:
    """Mechanism `batchnorm_split`: a quantized BatchNormalization that runs as a vector op of its own (nothing
    before it folds it: DenseNet's after each join) is lowered to a multiply and an add, each a requantizing vector
    op: the add, inserted after it in `ops` (its readers read the add's output), is a second HVX pass with a fixed
    cost of its own (the device's layer counts show DenseNet's quantized model 125 layers above its float one: its
    58 joins' requantizations and one more op per standalone BatchNorm). An fp16 BatchNorm stays one multiply-add.
    Nothing unless the mechanism is on."""
    if not MECHANISMS["batchnorm_split"]:
        return
    for i in range(len(ops) - 1, -1, -1):
        op = ops[i]
        if not _standalone_batchnorm(op, floating=False):
            continue
        name, dtype, elements = op.outputs[0]
        shifted = f"{name} (shifted)"
        for reader in ops:
            reader.inputs = [(shifted if n == name else n, t, k) for n, t, k in reader.inputs]
        ops.insert(i + 1, HtpOp(f"{op.node} shift", "Add", "hvx", [(name, dtype, elements)],
                                [(shifted, dtype, elements)], work=elements, cls="arith"))


def _standalone_batchnorm(op: HtpOp, floating: bool) -> bool:
    """A BatchNormalization that runs as a vector op of its own (nothing before it folds it), in fp16 (`floating`)
    or quantized (every tensor it reads and writes of one kind)."""
    if op.op_type != "BatchNormalization" or op.kind != "compute" or op.engine != "hvx" or not op.outputs:
        return False
    kinds = [t.startswith("float") for _, t, _ in op.inputs + op.outputs]
    return all(kinds) if floating else not any(kinds)


class _OpGraph:
    """Who produces and who reads each activation of a list of ops."""

    def __init__(self, ops: list[HtpOp]):
        self.producer: dict[str, int] = {}
        self.readers: dict[str, list[int]] = defaultdict(list)
        self.index = {id(op): i for i, op in enumerate(ops)}
        self.ops = ops
        for i, op in enumerate(ops):
            if op.kind != "compute" or op.engine == "fused":
                continue
            for name, _, _ in op.outputs:
                self.producer[name] = i
            for name, _, _ in op.inputs:
                self.readers[name].append(i)

    def sole_reader(self, op: HtpOp) -> HtpOp | None:
        readers = self.readers.get(op.outputs[0][0], []) if op.outputs else []
        return self.ops[readers[0]] if len(readers) == 1 else None

    def source(self, op: HtpOp, skip: str) -> str | None:
        """The activation `op` reads other than `skip` (None when it reads two others or none)."""
        others = {name for name, _, _ in op.inputs if name != skip}
        return others.pop() if len(others) == 1 else None


def _fuse_gated(graph: _OpGraph, gate: HtpOp, fused: str) -> None:
    """x * Sigmoid(x) -> SiLU(x), x * HardSigmoid(x) -> HardSwish(x): one HVX op (QNN's op set has both)."""
    if len(gate.inputs) != 1:
        return
    x = gate.inputs[0][0]
    mul = graph.sole_reader(gate)
    if mul is None or mul.op_type != "Mul" or {name for name, _, _ in mul.inputs} != {x, gate.outputs[0][0]}:
        return
    gate.engine = "fused"
    mul.absorbed = [gate.outputs[0][0]]
    mul.op_type, mul.cls = fused, HVX_CLASS[fused]
    mul.inputs = [i for i in mul.inputs if i[0] == x][:1]


def _fuse_gelu(graph: _OpGraph, erf: HtpOp) -> None:
    """The exporters' GELU, x * 0.5 * (1 + erf(x / sqrt 2)) in any order of its Muls, -> one Gelu op."""
    pre = graph.ops[graph.producer[erf.inputs[0][0]]] if erf.inputs and erf.inputs[0][0] in graph.producer else None
    if pre is None or pre.op_type not in ("Div", "Mul") or len(pre.inputs) != 1:
        return
    x = pre.inputs[0][0]
    add = graph.sole_reader(erf)
    mul = graph.sole_reader(add) if add is not None and add.op_type == "Add" and len(add.inputs) == 1 else None
    if mul is None or mul.op_type != "Mul":
        return
    group = [pre, erf, add, mul]
    other = graph.source(mul, add.outputs[0][0])
    if other != x:  # x * 0.5 computed first: (x * 0.5) * (1 + erf)
        half = graph.ops[graph.producer[other]] if other in graph.producer else None
        if half is None or half.op_type != "Mul" or [i[0] for i in half.inputs] != [x]:
            return
        group.append(half)
    last = mul
    after = graph.sole_reader(mul)
    if after is not None and after.op_type == "Mul" and len(after.inputs) == 1 and other == x:
        last = after  # ... * 0.5 last
        group.append(after)
    for op in group:
        if op is not last:
            op.engine = "fused"
            last.absorbed += [name for name, _, _ in op.outputs]
    last.op_type, last.cls, last.engine = "Gelu", "transcendental", "hvx"
    last.inputs = [(x, pre.inputs[0][1], pre.inputs[0][2])]


def _producer(graph: _OpGraph, name: str, op_type: str, inputs: int) -> HtpOp | None:
    """The op that makes `name`, if it is an `op_type` reading `inputs` activations (constants not counted)."""
    op = graph.ops[graph.producer[name]] if name in graph.producer else None
    return op if op is not None and op.op_type == op_type and len(op.inputs) == inputs else None


def _fuse_tanh_gelu(graph: _OpGraph, tanh: HtpOp) -> None:
    """The tanh GELU written out (transformers' gelu_new): 0.5 x (1 + tanh(c (x + 0.044715 x^3))), seven or
    eight element-wise ops, -> one Gelu op (the device's layer counts show one)."""
    scale = _producer(graph, tanh.inputs[0][0], "Mul", 1) if tanh.inputs else None
    inner = _producer(graph, scale.inputs[0][0], "Add", 2) if scale is not None else None
    if inner is None:
        return
    group = [scale, inner, tanh]
    for x, cubed in ((inner.inputs[0], inner.inputs[1]), (inner.inputs[1], inner.inputs[0])):
        coeff = _producer(graph, cubed[0], "Mul", 1)
        cube = _producer(graph, coeff.inputs[0][0], "Pow", 1) if coeff is not None else None
        if cube is not None and cube.inputs[0][0] == x[0]:
            group += [coeff, cube]
            break
    else:
        return
    x = x[0]
    add = graph.sole_reader(tanh)
    mul = graph.sole_reader(add) if add is not None and add.op_type == "Add" and len(add.inputs) == 1 else None
    if mul is None or mul.op_type != "Mul":
        return
    group += [add, mul]
    other = graph.source(mul, add.outputs[0][0])
    last = mul
    if other == x:  # x (1 + tanh) first, then * 0.5
        after = graph.sole_reader(mul)
        if after is not None and after.op_type == "Mul" and len(after.inputs) == 1:
            last = after
            group.append(after)
    else:  # (0.5 x) (1 + tanh)
        half = _producer(graph, other, "Mul", 1) if other else None
        if half is None or half.inputs[0][0] != x:
            return
        group.append(half)
    received = next(i for i in inner.inputs if i[0] == x)
    for op in group:
        if op is not last:
            op.engine = "fused"
            last.absorbed += [name for name, _, _ in op.outputs]
    last.op_type, last.cls, last.engine = "Gelu", "transcendental", "hvx"
    last.inputs = [received]


def _fuse_activations(ops: list[HtpOp], graph: _OpGraph) -> None:
    """What follows a matrix op alone, in the same type: a bias Add or a Relu/Clip... fuses into it (no cost of
    its own); SiLU, GELU... run on HVX while the matrix unit works (`hidden_by`)."""
    producer = dict(graph.producer)
    for op in ops:
        if op.op_type == "Add" and len(op.inputs) == 2 and MECHANISMS["vector_add_folds"]:
            _fold_vector_add(ops, graph, producer, op)
        if op.engine == "fused" or len(op.inputs) != 1 or op.kind != "compute":
            continue
        name, received, _ = op.inputs[0]
        index = producer.get(name)
        src = ops[index] if index is not None else None
        # A metadata-only reshape between them (MatMul -> Gemm rewrites add them) moves no data: look through it.
        while (src is not None and src.engine == "none" and len(src.inputs) == 1
               and len(graph.readers[name]) == 1 and MECHANISMS["layout_look_through"]):
            name = src.inputs[0][0]
            index = producer.get(name)
            src = ops[index] if index is not None else None
        if (src is not None and src.engine == "hvx" and src.kind == "compute" and op.op_type in _CLAMPS
                and MECHANISMS["clamp_after_vector"] and len(graph.readers[name]) == 1
                and received == src.outputs[0][1]):
            # A clamp after a vector op in the same type (BatchNorm -> Relu) is applied as that op writes.
            op.engine, op.fused_into = "fused", index
            for out, _, _ in op.outputs:
                producer[out] = index
            continue
        if (src is not None and src.cls == "depthwise" and src.engine == "hvx" and op.op_type in _AFTER_DEPTHWISE
                and op.engine == "hvx" and MECHANISMS["silu_after_depthwise"] and len(graph.readers[name]) == 1
                and received == src.outputs[0][1]):
            op.hidden_by = index  # applied to the depthwise convolution's output vectors as they are made
            continue
        # A convert between the two (a precision boundary) keeps them apart.
        if src is None or src.engine != "hmx" or len(graph.readers[name]) != 1 or received != src.outputs[0][1]:
            continue
        # A bias, or a scale by a constant, folds into the matrix op's output requantization.
        folds = (op.op_type == "Add" and op.weight_bytes > 0 and src.op_type in ("MatMul", "Gemm")
                 and _one_per_column(op, src) or op.op_type in ("Mul", "Div") and 0 < op.weight_bytes <= 4)
        # PReLU (a per-channel slope) is a layer of its own on the device, run while the matrix unit works.
        own_op = op.op_type == "HardSwish" and MECHANISMS["hardswish_own_op"]  # overlapped like a SiLU, not fused
        if op.op_type == "PRelu" and MECHANISMS["prelu_overlaps"] and op.engine == "hvx":
            op.hidden_by = index
        elif op.op_type in _FUSABLE and not own_op or folds:
            op.engine, op.fused_into = "fused", index
            for out, _, _ in op.outputs:
                producer[out] = index
        elif (op.op_type in _OVERLAPPING or own_op) and op.engine == "hvx":
            op.hidden_by = index


def _one_per_column(add: HtpOp, src: HtpOp) -> bool:
    """Whether a constant Add after a matrix op is a bias, one value per output column (mechanism
    `bias_per_column`): the output stage adds a bias as it writes; a whole constant tensor (BEiT's relative position
    bias [1, 12, 197, 197] on the attention scores) is an element-wise Add of its own on HVX."""
    if not MECHANISMS["bias_per_column"] or not src.out_channels:
        return True
    return sum(n for _, _, n in add.weights) <= src.out_channels


def _fold_vector_add(ops: list[HtpOp], graph: _OpGraph, producer: dict, add: HtpOp) -> None:
    """Mechanism `vector_add_folds`: an Add of a Gemm's or MatMul's sole output (same type) and an activation of
    one value per output column, broadcast over the rows (an attention mask [1, 1, 1, S] after the query-key
    MatMul), is a bias: the matrix unit's output stage adds it as it writes, and no vector op runs."""
    if add.engine != "hvx" or add.kind != "compute":
        return
    for (name, received, _), (_, _, other) in ((add.inputs[0], add.inputs[1]), (add.inputs[1], add.inputs[0])):
        index = producer.get(name)
        src = ops[index] if index is not None else None
        if (src is not None and src.engine == "hmx" and src.out_channels and other == src.out_channels
                and len(graph.readers[name]) == 1 and received == src.outputs[0][1]):
            add.engine, add.fused_into = "fused", index
            for out, _, _ in add.outputs:
                producer[out] = index
            return
