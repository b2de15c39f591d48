"""Reading a model file: a clear error for a missing, corrupt or empty one, ONNX's checker (through the file for a
model past protobuf's 2 GB limit), and the external data files beside it."""

from __future__ import annotations

import os
from pathlib import Path

import onnx

from .errors import MpstudioError, brief


def load_model(source: str | os.PathLike | onnx.ModelProto | bytes) -> onnx.ModelProto:
    """Read a model from a path, bytes or a ModelProto, with a clear error for a missing or corrupt file."""
    if isinstance(source, onnx.ModelProto):
        return source
    if isinstance(source, (bytes, bytearray)):
        try:
            return onnx.load_from_string(bytes(source))
        except Exception as exc:
            raise MpstudioError(f"the given bytes are not an ONNX model ({brief(exc)})") from exc
    if not isinstance(source, (str, os.PathLike)):
        raise MpstudioError(f"give a model as a path, bytes or an onnx.ModelProto, not {type(source).__name__}")
    path = Path(source)
    if not path.exists():
        raise MpstudioError(f"model file not found: {path}")
    if path.is_dir():
        raise MpstudioError(f"{path} is a folder; give the path of an .onnx file")
    try:
        model = onnx.load(str(path))
    except Exception as exc:
        raise MpstudioError(
            f"{path} is not a readable ONNX model ({brief(exc)}); check that the file is complete and "
            "that its external data files are beside it"
        ) from exc
    if not model.graph.node:
        raise MpstudioError(f"{path} holds no graph nodes; is it really an ONNX model?")
    return model


def check_model(model: onnx.ModelProto, source) -> None:
    """ONNX's checker on the model; one over protobuf's 2 GB limit (its weights in external data) is checked
    through its file, the way ONNX checks large models."""
    try:
        if over_protobuf_limit(model):
            if not isinstance(source, (str, os.PathLike)):
                raise MpstudioError("the model is over protobuf's 2 GB limit: save it with its weights as external "
                                    "data (onnx.save(..., save_as_external_data=True)) and give its path")
            onnx.checker.check_model(str(source))
        else:
            onnx.checker.check_model(model)
    except MpstudioError:
        raise
    except Exception as exc:
        raise MpstudioError(f"the model fails ONNX's checker: {brief(exc)}") from exc


def external_data_files(source: str | os.PathLike) -> list[Path]:
    """The files a model file's external data lives in (by their `location`, beside the model), found without
    reading them; none when the file cannot be read as a model (loading it reports that)."""
    from onnx.external_data_helper import _get_all_tensors

    try:
        header = onnx.load(str(source), load_external_data=False)
    except Exception:
        return []
    folder = Path(source).parent
    return sorted({folder / entry.value for tensor in _get_all_tensors(header) for entry in tensor.external_data
                   if entry.key == "location"})


def refuse_over_protobuf_limit(source) -> None:
    """A model file whose weights (in external data) take it past protobuf's 2 GB limit: checked through its
    file, as ONNX checks large models, then refused with what is wrong, before its weights are read."""
    if not isinstance(source, (str, os.PathLike)) or not Path(source).is_file():
        return
    try:
        header = onnx.load(str(source), load_external_data=False)
    except Exception:
        return  # load_model reports an unreadable file
    folder = Path(source).parent
    external = 0
    for tensor in header.graph.initializer:
        entries = {entry.key: entry.value for entry in tensor.external_data}
        if "length" in entries and entries["length"].isdigit():
            external += int(entries["length"])
        elif "location" in entries and (folder / entries["location"]).is_file():
            external += (folder / entries["location"]).stat().st_size
    if header.ByteSize() + external < onnx.checker.MAXIMUM_PROTOBUF:
        return
    try:
        onnx.checker.check_model(str(source))
    except Exception as exc:
        raise MpstudioError(f"the model fails ONNX's checker: {brief(exc)}") from exc
    raise MpstudioError(
        f"{source} is a valid model (ONNX's checker passes on its file), but its {external / 2**30:.1f} GiB of "
        "weights take it past protobuf's 2 GB limit, which mpstudio cannot prepare and quantize yet; use a "
        "smaller model or a version of it with fewer weights")


def over_protobuf_limit(model: onnx.ModelProto) -> bool:
    try:
        return model.ByteSize() >= onnx.checker.MAXIMUM_PROTOBUF
    except Exception:  # protobuf cannot even size a message past 2 GB
        return True
