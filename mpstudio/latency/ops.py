"""The HTP's op vocabulary: `HtpOp` (one op as the HTP runs it), the cost classes ONNX op types fall in, and the
width of each tensor type."""

from __future__ import annotations

from dataclasses import dataclass, field

# Matrix ops run on HMX; a depthwise convolution runs on HVX (HMX needs depth).
MATRIX_OPS = {"Conv", "ConvTranspose", "Gemm", "MatMul"}
# Metadata only on HTP: no data moves.
LAYOUT_OPS = {"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Dropout"}
# Data movers: cost is the bytes they read and write.
MOVER_OPS = {"Transpose", "Concat", "Slice", "Split", "Gather", "GatherElements", "GatherND", "Pad", "Tile",
             "Expand", "DepthToSpace", "SpaceToDepth", "Cast", "ScatterND", "ScatterElements"}
# HVX cost classes of element-wise ops (instructions per 128-byte vector: docs/latency.md).
HVX_CLASS = {
    **dict.fromkeys(("Relu", "Clip", "Max", "Min", "Abs", "Neg", "LeakyRelu", "Floor", "Ceil", "Round",
                     "Sign", "Not", "And", "Or", "Xor", "Equal", "Greater", "Less", "GreaterOrEqual",
                     "LessOrEqual", "Where"), "simple"),
    **dict.fromkeys(("Add", "Sub", "Mul", "Sum", "PRelu", "BatchNormalization", "Mean", "HardSigmoid",
                     "HardSwish"), "arith"),
    **dict.fromkeys(("Sigmoid", "Tanh", "Exp", "Log", "Sqrt", "Reciprocal", "Erf", "Gelu", "SiLU", "Elu",
                     "Selu", "Softplus", "Softsign", "Mish", "Sin", "Cos", "Div", "Pow"), "transcendental"),
    **dict.fromkeys(("Softmax", "LogSoftmax", "LayerNormalization", "InstanceNormalization",
                     "GroupNormalization", "LpNormalization"), "normalize"),
    **dict.fromkeys(("Resize", "Upsample"), "resize"),
}
DEFAULT_CLASS = "arith"
# Normalizations over a row (mechanism `layernorm_plain`: class "layernorm", priced as `normalize` instructions per
# vector in every type, without the transcendental factors of 16 bits and fp16).
LAYER_NORMS = {"LayerNormalization", "InstanceNormalization", "GroupNormalization", "LpNormalization"}
# Reductions and global pools: one instruction per input vector.
REDUCE_OPS = {"ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
              "ReduceSumSquare", "ReduceLogSumExp", "GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool",
              "ArgMax", "ArgMin"}
# Windowed pools: one instruction per output vector and kernel tap.
POOL_OPS = {"AveragePool", "MaxPool", "LpPool"}
# Every cost class an op can fall in (calibration scales these): "hmx", "depthwise", HVX element-wise classes,
# "reduce", "pool", "dma" (data movers), "layout" (metadata only), "convert".
OP_CLASSES = ("hmx", "depthwise", "simple", "arith", "transcendental", "normalize", "layernorm", "resize", "reduce",
              "pool", "dma", "layout", "convert")

# Mechanisms of the cost formulas that can be switched, to measure what each moves
# (benchmarks/latency_fit.py --with / --without NAME; docs/latency.md, "Mechanisms"):
#   layout_look_through: an activation after a metadata-only reshape of a matrix op's output still fuses into or
#     overlaps with that matrix op;
#   clamp_after_vector: a Relu/Clip after a vector op in the same type fuses into it (BatchNorm -> Relu);
#   channels_last_transpose: a 4-D Transpose that only moves channels to or from the last axis is free (the HTP
#     keeps activations channels-last; but it also frees a transformer's key transpose [B,S,H,D] -> [B,H,D,S],
#     which moves data: it needs the tensor's axis format, not its rank);
#   prelu_overlaps: a PReLU after a matrix op runs as an op of its own on HVX, overlapped with that matrix op (the
#     device's layer counts show one layer per PReLU), instead of fusing into it.
#   concat_in_place: a float (fp16) Concat moves no data: its producers write into the joined buffer (no
#     requantization to a common scale, as a quantized Concat of inputs with their own scales needs);
#   silu_after_depthwise: a SiLU/Sigmoid/GELU reading a depthwise convolution's sole output in the same type
#     overlaps with it, as it does with a matrix op;
#   depthwise_tap_groups: a depthwise convolution's HVX work is its output x (ceil(taps / 4) + 1) x 4 (a
#     multiply-reduce instruction takes four taps, and each output vector is loaded and stored once), not its
#     MACs: a 5x5 or 7x7 kernel costs less per tap than a 3x3;
#   concat_requantize: a quantized Concat first requantizes its inputs (each with a scale of its own) to its
#     output's scale, an HVX pass of its own over every input element (latency.fusion.concat_requantizations);
#   channel_blocks: an image-like activation takes its channels padded to blocks of 32 in memory (latency.depth):
#     a low-depth, high-resolution map moves up to 32x its elements' bytes; channel_block_lanes: with it, the
#     vector unit processes the padded elements too;
#   vtcm_partial_spill: the part of an op's working set the usable VTCM (half of it) holds moves at the VTCM rate
#     and only the rest at the DDR rate (tiling), instead of all of it at DDR once the working set exceeds it;
#   shallow_input: a graph-input image of at most four channels enters its first convolution packed in 8 bits (taps
#     and channels share the matrix unit's depth) and converted to channel blocks of 32 in 16 bits and fp16
#     (latency.shallow); shallow_input_packing: with it, the 8-bit packing (without it, only the 16-bit/fp16 part);
#   tiny_ops: an op whose operands fit one 64 KB tile pays a quarter of the fixed per-op cost (latency.features);
#   overhead_overlaps: an op's fixed cost (setting it up) runs while the op before it works: an op costs the longer
#     of its work and its fixed cost, not their sum;
#   layernorm_plain: a LayerNorm (Instance/Group/LpNorm) costs `normalize` instructions per vector in every type
#     (multiply-adds over the row and one reciprocal square root per row: nothing a look-up table does at 8 bits),
#     not x transcendental_16 / transcendental_fp16 as a Softmax (whose exponentials are a look-up at 8 bits);
#     a variant with a fitted count of its own (`layernorm`, 1-30) was measured and dropped (docs/latency.md);
#   branch_overlap: ops on independent branches at the same depth of the graph share one fixed per-op cost (they
#     are dispatched together: latency.branches); a chain pays it at every op;
#   concat_requantize_per_input: with concat_requantize, each input of a quantized Concat is requantized by an op of
#     its own (a fixed cost per input), not in one pass over all of them;
#   hardswish_own_op: a HardSwish after a matrix op runs as a vector op of its own, overlapped with that op like a
#     SiLU, instead of fusing into it as a Relu does.
#   vector_add_folds: an Add of a matrix op's output and an activation that is one vector along that output's
#     columns (an attention mask [1, 1, 1, S] after the query-key MatMul) folds into the matrix op's output stage
#     as its bias does, instead of running as a vector op over the whole output (latency.fusion);
#   bias_per_column: a constant Add after a Gemm or MatMul folds into its output stage only when it is one value
#     per output column (a bias); a whole constant tensor (a relative position bias on attention scores) runs as an
#     element-wise Add of its own, reading the constant;
#   group_packing: a grouped convolution whose groups are narrower than the matrix unit's channel block of 32 packs
#     32 / width groups into one block (their weights a block-diagonal tile): a 4-wide group costs 32 / 4 of its
#     MACs, not (32 / 4)^2 as a group padded to a block of its own (QNN HTP guideline "Number of channels": more
#     channels in a group "up to the hardware capacity of 32", group widths a small power of 2);
#   batchnorm_split: a quantized BatchNorm that runs as a vector op of its own (nothing before it folds it) is a
#     multiply and an add, two vector passes each with its fixed cost; an fp16 one a single multiply-add
#     (latency.fusion.split_batchnorms);
#   batchnorm_before_conv: an fp16 BatchNorm that runs as a vector op of its own (with the clamp fused into it) and
#     is read only by convolutions is applied as they stage their input for the matrix unit: no pass of its own
#     (latency.fusion; DenseNet's float model runs at ResNet-50's cost per MAC on the device);
#   metadata_ops_free: an op that moves no data (Reshape, Flatten, Squeeze, Unsqueeze, Identity, Dropout, a
#     channels-last Transpose with channels_last_transpose, a float Concat with concat_in_place) has no fixed cost:
#     the graph's preparation folds it into its tensors' descriptions, and it never runs (latency.features).
# On: silu_after_depthwise (87 -> 86 of 256 cross-validated rows outside), prelu_overlaps (92 -> 91 with the
# left-out fits started from nominal values), and shallow_input with shallow_input_packing and concat_requantize
# (together 94 -> 70 of 256, with the fit's unidentifiable constants held: latency.fitting.HELD), then
# depthwise_tap_groups (70 -> 60) and tiny_ops (60 -> 59; issue 22), then concat_in_place with
# clamp_after_vector (59 -> 56) and branch_overlap (56 -> 53; issue 22, second round), then metadata_ops_free
# (53 -> 50), vector_add_folds (50 -> 49), channels_last_transpose (49 -> 48), hardswish_own_op (48 -> 46),
# layernorm_plain (46 -> 37) and layout_look_through (37 -> 35; issue 22, third round), then bias_per_column
# (35 -> 34; issue 22, fourth round; group_packing, measured with it and alone: 39), then batchnorm_split
# (34 -> 28; issue 22, sixth round; batchnorm_before_conv, measured alone 37 and with group_packing 34, seventh
# round). Off: the others, each of
# which, measured alone or with the others, left more cross-validation misses than without it (the refit moves
# other architectures' rows); kept to be measured again with the next formula changes (docs/latency.md, "Fit").
MECHANISMS = {"layout_look_through": True, "clamp_after_vector": True, "channels_last_transpose": True,
              "prelu_overlaps": True, "concat_in_place": True, "silu_after_depthwise": True,
              "depthwise_tap_groups": True, "concat_requantize": True,
              "channel_blocks": False, "channel_block_lanes": False,
              "vtcm_partial_spill": False, "shallow_input": True,
              "shallow_input_packing": True, "tiny_ops": True, "overhead_overlaps": False,
              "layernorm_plain": True, "hardswish_own_op": True,
              "branch_overlap": True, "concat_requantize_per_input": False, "metadata_ops_free": True,
              "vector_add_folds": True, "group_packing": False,
              "bias_per_column": True, "batchnorm_split": True,
              "batchnorm_before_conv": False}

TYPE_BITS = {"uint8": 8, "int8": 8, "uint16": 16, "int16": 16, "float16": 16, "int32": 32, "float32": 32,
             "uint4": 4, "int4": 4}


def type_bytes(dtype: str) -> float:
    """Bytes per element of `dtype` (an unknown type counts as 32 bits)."""
    return TYPE_BITS.get(dtype, 32) / 8


@dataclass
class HtpOp:
    """One op as the HTP runs it, with what the cost formulas need."""

    node: str
    op_type: str
    engine: str  # "hmx", "hvx", "dma" (data mover), "none" (layout), "cpu" (graph I/O), "graph"
    inputs: list  # [(activation id, received dtype, elements)]
    outputs: list  # [(activation id, produced dtype, elements)]
    weight_bytes: float = 0.0
    weight_type: str = ""
    macs: int = 0  # logical multiply-accumulates
    hmx_macs: int = 0  # MACs with channels padded to HMX blocks
    work: float = 0.0  # HVX elements processed (x the class's instructions per 128-byte vector)
    cls: str = ""  # cost class (OP_CLASSES)
    kind: str = "compute"  # "compute", "convert", "io", "graph"
    hidden_by: int = -1  # index of the matrix op whose time can hide this activation's HVX time
    # Index of the op this activation fused into (a matrix op, or a vector op for a clamp), -1 if none: the
    # fusion holds only while both compute in one type (a promotion can break it: latency.promotion).
    fused_into: int = -1
    absorbed: list = field(default_factory=list)  # tensors a fused pattern (SiLU, Gelu) now reads inside itself
    weights: list = field(default_factory=list)  # [(float-model name, dtype, elements)] of its constant operands
    # (input slot, channels, taps, packed) of an 8-bit convolution reading a shallow graph-input image
    # (latency.shallow): what it becomes when promoted to 16 bits.
    shallow: tuple = ()
    out_channels: int = 0  # a Gemm's or MatMul's output columns (its last axis), 0 for other ops
