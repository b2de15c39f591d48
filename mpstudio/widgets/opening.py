"""What a studio session opens: the study of a model and its data folder (made on first use), the demo, or
what `panel serve app.py --args ...` names."""

from __future__ import annotations

import hashlib
import threading
from pathlib import Path

from ..cache import cache_root
from ..data import NpzFolder
from ..errors import MpstudioError
from ..model import parse_shape_args
from ..model_file import external_data_files
from ..study import Study

_CREATING = threading.Lock()  # studies are created one at a time in this process


def demo_study(study_folder: Path | None, progress=None) -> Study:
    """The demo study (created on first use)."""
    with _CREATING:  # two sessions opening the demo at once must not both create it
        return Study.demo(study_folder, progress=progress)


def model_study(model, data, shapes: str, fallback: bool, study_folder: Path | None, progress=None,
                confine=None) -> Study:
    """The study of `model` calibrated and evaluated on the `.npz` samples in `data`: the one already made from
    the same files (in `study_folder`, or the cache), or a new one. `confine(path, what)` (a served studio's
    `ServerPolicy.confine`) refuses files that lie, or link, outside the folders visitors may open."""
    if not str(model).strip() or not str(data).strip():
        raise MpstudioError("give a model file (.onnx) and a data folder of .npz samples")
    model_path, data_path = Path(str(model).strip()).expanduser(), Path(str(data).strip()).expanduser()
    if not model_path.is_file():
        raise MpstudioError(f"model file not found: {model_path}")
    if confine is not None:
        confine_linked_files(model_path, data_path, confine)
    try:
        input_shapes = parse_shape_args(shapes.split()) if shapes.strip() else None
    except MpstudioError as exc:
        raise MpstudioError(studio_wording(str(exc))) from None
    digest = hashlib.sha256(model_path.read_bytes())
    digest.update(str(data_path.resolve()).encode())
    suffix = "-fallback" if fallback else ""  # a study with CPU fallback is another study
    folder = study_folder or cache_root() / "studies" / f"{model_path.stem}-{digest.hexdigest()[:12]}{suffix}"
    with _CREATING:
        if (folder / "study.json").exists():
            return Study.open(folder)
        from ..model import prepare_model

        try:
            prepared = prepare_model(model_path, input_shapes)
        except MpstudioError as exc:
            raise MpstudioError(studio_wording(str(exc))) from None
        if not prepared.qnn_ready and not fallback:
            raise MpstudioError(prepared.fallback_refusal() + " In the studio: tick \"Allow CPU fallback\" "
                                "and open the model again.")
        calibration = NpzFolder(data_path, [spec.name for spec in prepared.inputs])
        return Study.create(folder, prepared, calibration, progress=progress, allow_fallback=fallback)


def confine_linked_files(model_path: Path, data_path: Path, confine) -> None:
    """Refuse, before any is read, a sample in the data folder or an external data file of the model that is a
    link to a place outside the folders visitors may open (the folder and the model themselves were confined
    when typed)."""
    for file in external_data_files(model_path):
        confine(file, "model's external data file")
    if data_path.is_dir():
        for file in sorted(data_path.iterdir()):
            if file.suffix in (".npz", ".npy"):
                confine(file, "data file")


SHAPES_FIELD = "Input shapes"


def studio_wording(message: str) -> str:
    """A shape error as the studio says it: the *Input shapes* field beside the model path, not the command
    line's flags or Python's arguments."""
    how = (f"type each in the \u201c{SHAPES_FIELD}\u201d field beside the model path as NAME=D1,D2,... "
           "(several separated by spaces, such as x=1,3,224,224), then open the model again.")
    head, cut, _ = message.partition(". Give each a concrete shape:")
    if cut:
        return f"{head}. Give each a concrete shape: {how}"
    if message.startswith("bad --shape "):
        return message.replace("bad --shape ", f"bad shape in \u201c{SHAPES_FIELD}\u201d: ", 1)
    return message


def open_arguments(state, study: str | None, model: str | None, data: str | None, shapes: str) -> None:
    """Open in `state` what the command line names: a model and its data, a study folder, or the demo."""
    if model or data:
        if not (model and data):
            state.show_error("give both --model and --data (a folder of .npz samples), or --study, or "
                             "nothing for the demo")
        else:
            state.open_model(model, data, shapes)
    elif study:
        state.open_study(study)
    else:
        state.open_demo()
