"""The agent's model store: files named by their verified sha256, a disk quota with least-recently-used
eviction, and the check that keeps a model from making ONNX Runtime read any other file.
"""

from __future__ import annotations

import logging
import os
import uuid
from collections import Counter, OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ..runtime import first_line
from .protocol import AgentError, check_model_id

log = logging.getLogger("mpstudio.agent")


class ModelStore:
    """Model files under `root/models`, at most `quota_bytes` of them; the least recently used go first.

    A model in use by a request (`in_use`) is never evicted. All calls come from the server's event loop.
    """

    def __init__(self, root: Path, quota_bytes: int):
        self.models = root / "models"
        self.incoming = root / "incoming"
        self.quota_bytes = quota_bytes
        self.models.mkdir(parents=True, exist_ok=True)
        self.incoming.mkdir(parents=True, exist_ok=True)
        for stale in self.incoming.glob("*.part"):  # uploads cut short by a previous run of the agent
            stale.unlink(missing_ok=True)
        self._sizes: OrderedDict[str, int] = OrderedDict()  # model id -> bytes, least recently used first
        found = sorted(self.models.glob("*.onnx"), key=lambda p: p.stat().st_mtime)
        for path in found:
            self._sizes[path.stem] = path.stat().st_size
        self._pins: Counter[str] = Counter()

    @property
    def used_bytes(self) -> int:
        return sum(self._sizes.values())

    def path(self, model_id: str) -> Path:
        return self.models / f"{check_model_id(model_id)}.onnx"

    def has(self, model_id: str) -> bool:
        return model_id in self._sizes and self.path(model_id).exists()

    def existing(self, model_id: str) -> Path:
        """The model's file, marked as just used; 404 when the agent does not have it."""
        path = self.path(model_id)
        if not self.has(model_id):
            self._sizes.pop(model_id, None)
            raise AgentError(f"model {model_id} is not on this agent; upload it first", 404)
        self._sizes.move_to_end(model_id)
        try:
            os.utime(path)  # the order survives a restart of the agent
        except OSError:
            pass
        return path

    @contextmanager
    def in_use(self, model_id: str) -> Iterator[Path]:
        """The model's file, kept from eviction for the duration."""
        path = self.existing(model_id)
        self._pins[model_id] += 1
        try:
            yield path
        finally:
            self._pins[model_id] -= 1
            if self._pins[model_id] <= 0:
                del self._pins[model_id]

    def new_incoming(self) -> Path:
        return self.incoming / f"{uuid.uuid4().hex}.part"

    def check_fits(self, size: int) -> None:
        if size > self.quota_bytes:
            raise AgentError(
                f"a model of {size / 2**20:.1f} MB is larger than the agent's model store of "
                f"{self.quota_bytes / 2**20:g} MB (start the agent with a larger --max-store-mb)", 413)

    def adopt(self, path: Path, model_id: str) -> Path:
        """Move a verified file into the store (atomic, so a concurrent reader never sees half a model),
        evicting the least recently used models that are not in use until it fits the quota."""
        size = path.stat().st_size
        self.check_fits(size)
        self._evict_for(size, keep=model_id)
        final = self.path(model_id)
        os.replace(path, final)
        self._sizes[model_id] = size
        self._sizes.move_to_end(model_id)
        return final

    def _evict_for(self, size: int, keep: str) -> None:
        used = self.used_bytes - self._sizes.get(keep, 0)
        for model_id in list(self._sizes):
            if used + size <= self.quota_bytes:
                return
            if model_id == keep or self._pins[model_id]:
                continue
            used -= self._sizes.pop(model_id)
            self.path(model_id).unlink(missing_ok=True)
            log.info("model %s evicted (model store quota %.0f MB)", model_id[:12], self.quota_bytes / 2**20)
        if used + size > self.quota_bytes:
            raise AgentError(
                f"the models in use fill the agent's model store of {self.quota_bytes / 2**20:g} MB; retry when "
                "the running requests are done, or start the agent with a larger --max-store-mb", 507)


def check_model_file(path: Path) -> None:
    """Refuse what is not an ONNX model, and models that would make ORT read other files: a tensor anywhere
    (initializers, Constant and other node attributes, sparse tensors, subgraphs, functions) that keeps
    its data outside the model, or an EPContext node that points to a context binary file."""
    import onnx

    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:
        raise AgentError(f"the upload is not an ONNX model: {first_line(exc)}") from None
    if not model.ir_version or not model.HasField("graph"):
        raise AgentError("the upload is not an ONNX model (it has no IR version or no graph)")
    for where, tensor in _tensors(model):
        if tensor.data_location == onnx.TensorProto.EXTERNAL or len(tensor.external_data):
            raise AgentError(
                f"{where} keeps its data in an external file, which the agent does not accept: save the model "
                "with all tensors inside (onnx.save(..., save_as_external_data=False))"
            )
    for node in _nodes(model):
        if node.op_type == "EPContext":
            embed = next((a.i for a in node.attribute if a.name == "embed_mode"), 1)
            if embed != 1:
                raise AgentError(
                    f"EPContext node {node.name!r} points to a context binary file; the agent accepts only "
                    "embedded context binaries (ep.context_embed_mode=1)"
                )


def _subgraphs(node) -> Iterator:
    for attribute in node.attribute:
        if attribute.HasField("g"):
            yield attribute.g
        yield from attribute.graphs


def _graphs(graph) -> Iterator:
    """A graph and every subgraph below it (If/Loop/Scan bodies, at any depth)."""
    yield graph
    for node in graph.node:
        for sub in _subgraphs(node):
            yield from _graphs(sub)


def _all_graphs(model) -> Iterator:
    """The main graph, the subgraphs of function bodies, and everything below them."""
    yield from _graphs(model.graph)
    for function in model.functions:
        for node in function.node:
            for sub in _subgraphs(node):
                yield from _graphs(sub)


def _nodes(model) -> Iterator:
    for graph in _all_graphs(model):
        yield from graph.node
    for function in model.functions:
        yield from function.node


def _tensors(model) -> Iterator[tuple[str, object]]:
    """(description, TensorProto) for every tensor of the model that can hold data."""
    for graph in _all_graphs(model):
        for tensor in graph.initializer:
            yield f"initializer {tensor.name!r}", tensor
        for sparse in graph.sparse_initializer:
            yield f"sparse initializer {sparse.values.name!r}", sparse.values
            yield f"sparse initializer {sparse.values.name!r} (indices)", sparse.indices
    for node in _nodes(model):
        for attribute in node.attribute:
            where = f"attribute {attribute.name!r} of node {node.name or node.op_type!r}"
            if attribute.HasField("t"):
                yield where, attribute.t
            for tensor in attribute.tensors:
                yield where, tensor
            if attribute.HasField("sparse_tensor"):
                yield where, attribute.sparse_tensor.values
                yield where, attribute.sparse_tensor.indices
            for sparse in attribute.sparse_tensors:
                yield where, sparse.values
                yield where, sparse.indices
