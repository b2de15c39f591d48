"""What the HTP builds of a model: for each ONNX node, the QNN op ONNX Runtime's QNN EP lowered it to and the type
that op computes in, read from the HTP's own description of the graph.

When profiling at level "optrace", QNN's HTP backend writes a schematic of the graph it prepared (into the working
directory of the process): the graph as the EP handed it over ("graph_before_optimization", one entry per QNN op
with the dtype of its outputs) and the names of the ONNX nodes each op came from ("qnn_name_translations"). From
those this module tells which nodes run as quantized ops, which the HTP computes in float (a node unit the EP did
not group, e.g. an Add whose inputs and output have different quantized types), and which QuantizeLinear /
DequantizeLinear nodes run as ops of their own. The cost model reads the same thing from the ONNX model by rule
(mpstudio.latency.units); this is the HTP's own answer, for the models where the rule is not enough.

The session is made in a spawned process with its own working directory: QNN writes the schematic into the
current directory, and a session must never be made in a forked process.
"""

from __future__ import annotations

import glob
import os
import re
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from .errors import MpstudioError

BUILD_TIMEOUT = 900.0  # seconds the HTP may take to prepare a model (a BERT-size encoder takes about a minute)
_ENTRY = re.compile(r"\n\t(0x[0-9a-f]+): \{\n\t\t'operation':'([^']+)'(.*?)\n\t\},", re.S)
_DTYPE = re.compile(r"'dtype': '(\w+)'")
_NAME = re.compile(r"^(0x[0-9a-f]+): '(.*)',?$", re.M)
_FLOAT = ("Float32", "Float16", "BFloat16")
STANDALONE_OPS = ("q::QNN_Quantize", "q::QNN_Dequantize")


@dataclass(frozen=True)
class BuiltOp:
    """One QNN op of the prepared graph: its op type, the dtype of its first output and its ONNX source node."""

    qnn_op: str
    dtype: str
    node: str

    @property
    def computes_in_float(self) -> bool:
        return self.dtype in _FLOAT and self.qnn_op not in STANDALONE_OPS and not self.qnn_op.startswith("$")


@dataclass(frozen=True)
class HtpBuild:
    """The QNN ops the HTP was handed for one model, with their ONNX source nodes (`partitions`: how many QNN graphs
    the EP made of it; a node of the model in none of them runs on ORT's CPU EP)."""

    ops: tuple[BuiltOp, ...]
    partitions: int = 1

    @property
    def nodes(self) -> frozenset[str]:
        """The ONNX nodes the HTP took (a quantized group by its op's name: its Q/DQ nodes are not listed)."""
        return frozenset(o.node for o in self.ops if o.node)

    @property
    def float_nodes(self) -> frozenset[str]:
        """ONNX nodes (other than Q/DQ) whose QNN op computes in float on the HTP."""
        return frozenset(o.node for o in self.ops if o.node and o.computes_in_float)

    @property
    def standalone(self) -> frozenset[str]:
        """ONNX QuantizeLinear / DequantizeLinear nodes that run as ops of their own (not folded into a node unit)."""
        return frozenset(o.node for o in self.ops if o.node and o.qnn_op in STANDALONE_OPS)

    def counts(self) -> Counter:
        """QNN ops by (op type, dtype)."""
        return Counter((o.qnn_op, o.dtype) for o in self.ops if not o.qnn_op.startswith("$"))

    def summary(self) -> str:
        c = self.counts()
        floats = sum(n for (op, dtype), n in c.items() if dtype in _FLOAT and op not in STANDALONE_OPS
                     and op not in ("q::Input", "q::Output"))
        standalone = sum(n for (op, _), n in c.items() if op in STANDALONE_OPS)
        converts = sum(n for (op, _), n in c.items() if op == "q::QNN_Convert")
        parts = f" in {self.partitions} partitions" if self.partitions > 1 else ""
        return (f"{sum(c.values())} QNN ops{parts}: {floats} computing in float, {standalone} standalone "
                f"Quantize/Dequantize, {converts} converts")


def read_schematic(text: str) -> HtpBuild:
    """The ops of a QNN HTP schematic's graph before optimization, each with its ONNX source node."""
    begin = text.find("graph_before_optimization = {")
    end = text.find(":::END:graph_before_optimization:::")
    if begin < 0 or end < 0:
        raise MpstudioError("the HTP schematic has no graph description; it may be from another QNN version")
    names = {}
    start = text.find("qnn_name_translations = {")
    if start >= 0:
        block = text[start:text.find("\n}", start)]
        names = {int(k, 16): v for k, v in _NAME.findall(block)}
    ops = []
    for op_id, operation, body in _ENTRY.findall(text[begin:end] + "\n"):
        dtype = _DTYPE.search(body.split("'outputs'", 1)[-1])
        ops.append(BuiltOp(operation, dtype.group(1) if dtype else "", names.get(int(op_id, 16), "")))
    return HtpBuild(tuple(ops))


def htp_build(model: str | os.PathLike, timeout: float = BUILD_TIMEOUT) -> HtpBuild:
    """Prepare `model` on the QNN HTP backend (CPU fallback allowed, so a node QNN refuses does not stop it) and
    read what the HTP was handed. Raises MpstudioError when no HTP backend is here or the preparation fails."""
    from .runtime import qnn_library_path, spawn_context

    if qnn_library_path() is None:
        raise MpstudioError("no QNN HTP backend is installed here; install onnxruntime-qnn to ask the HTP")
    path = str(Path(model).resolve())
    with tempfile.TemporaryDirectory(prefix="mpstudio-htp-build-") as workdir:
        ctx = spawn_context()
        parent, child = ctx.Pipe(duplex=False)
        process = ctx.Process(target=_build_worker, args=(child, path, workdir), daemon=True)
        process.start()
        child.close()
        try:
            if not parent.poll(timeout):
                raise MpstudioError(f"the HTP did not prepare {Path(path).name} within {timeout:.0f} s")
            error = parent.recv()
        except EOFError:
            error = f"the process preparing the model ended (exit code {process.exitcode})"
        finally:
            if process.is_alive():
                process.kill()
            process.join(10)
        if error:
            raise MpstudioError(f"the HTP could not prepare {Path(path).name}: {error}")
        found = sorted(glob.glob(os.path.join(workdir, "*schematic.bin")))
        if not found:
            raise MpstudioError("the HTP wrote no schematic; this QNN version may not support optrace profiling, "
                                "or the EP took no node of the model")
        # one schematic per QNN partition: the nodes between them were left to ORT's CPU EP
        parts = [read_schematic(Path(f).read_bytes().decode("latin-1")) for f in found]
        return HtpBuild(tuple(op for part in parts for op in part.ops), len(parts))


def _build_worker(conn, path: str, workdir: str) -> None:
    os.chdir(workdir)
    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)  # QNN's native lines go to fd 1; this process prints nothing
    try:
        import onnxruntime as ort

        from .runtime import register_qnn

        options = ort.SessionOptions()
        options.log_severity_level = 3
        options.add_provider_for_devices(register_qnn(), {
            "backend_type": "htp", "profiling_level": "optrace",
            "profiling_file_path": os.path.join(workdir, "profile.csv")})
        ort.InferenceSession(path, options)
        conn.send("")
    except Exception as exc:  # the parent reports it
        conn.send(str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__)
