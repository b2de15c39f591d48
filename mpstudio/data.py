"""Calibration and evaluation data: sources of feed dicts, checks against the model, splits, ORT adapter."""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator, Mapping, Sequence

import numpy as np
from onnxruntime.quantization import CalibrationDataReader

from .errors import MpstudioError

Feed = dict[str, np.ndarray]
Progress = Callable[[int, int, str], None]
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".webp", ".tif", ".tiff")


class DataSource:
    """A finite, ordered, re-iterable sequence of feed dicts (one per sample).

    Subclasses implement `__len__` and `sample(i)`; everything else builds on those.
    """

    name = "data"

    def __len__(self) -> int:  # pragma: no cover - abstract
        raise NotImplementedError

    def sample(self, index: int) -> Feed:  # pragma: no cover - abstract
        raise NotImplementedError

    def feeds(self) -> Iterator[Feed]:
        for i in range(len(self)):
            yield self.sample(i)

    def __iter__(self) -> Iterator[Feed]:
        return self.feeds()

    def subset(self, indices: Sequence[int], name: str | None = None) -> "DataSource":
        return Subset(self, list(indices), name or f"{self.name}[subset]")

    def head(self, n: int) -> "DataSource":
        return self.subset(range(min(n, len(self))), f"{self.name}[:{n}]")

    def fingerprint(self) -> str:
        """sha256 over every sample's names, dtypes, shapes and bytes: names the data in caches."""
        digest = hashlib.sha256()
        for feed in self.feeds():
            for key in sorted(feed):
                arr = np.ascontiguousarray(feed[key])
                digest.update(f"{key}|{arr.dtype.str}|{arr.shape}|".encode())
                digest.update(arr.data)
        return digest.hexdigest()

    def save_npz(self, folder: str | Path) -> Path:
        """Write one `.npz` per sample (`000000.npz` ...), readable by `NpzFolder`."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        for i, feed in enumerate(self.feeds()):
            np.savez(folder / f"{i:06d}.npz", **feed)
        return folder


class FeedList(DataSource):
    """Feed dicts given in memory (any iterable of dicts is read once and kept)."""

    def __init__(self, feeds: Iterable[Mapping[str, np.ndarray]], name: str = "feeds"):
        self._feeds = []
        for i, feed in enumerate(feeds):
            if not isinstance(feed, Mapping):
                raise MpstudioError(f"sample {i} of {name} is a {type(feed).__name__}, not a dict of input name -> array")
            self._feeds.append({str(k): np.asarray(v) for k, v in feed.items()})
        self.name = name

    def __len__(self) -> int:
        return len(self._feeds)

    def sample(self, index: int) -> Feed:
        return dict(self._feeds[index])


class CallableSource(DataSource):
    """`fn(i)` returns the feed dict of sample i, for i in range(count)."""

    def __init__(self, fn: Callable[[int], Mapping[str, np.ndarray]], count: int, name: str = "callable"):
        if count <= 0:
            raise MpstudioError("a callable data source needs a positive sample count")
        self.fn, self.count, self.name = fn, int(count), name

    def __len__(self) -> int:
        return self.count

    def sample(self, index: int) -> Feed:
        feed = self.fn(index)
        if not isinstance(feed, Mapping):
            raise MpstudioError(f"{self.name}({index}) returned a {type(feed).__name__}, not a dict of input name -> array")
        return {str(k): np.asarray(v) for k, v in feed.items()}


class NpzFolder(DataSource):
    """A folder of `.npz` files (one sample each, keys = input names) or `.npy` files (single-input models).

    Arrays are loaded with `allow_pickle=False`: a pickled file is refused, never executed.
    """

    def __init__(self, folder: str | Path, input_names: Sequence[str] | None = None):
        self.folder = Path(folder)
        if not self.folder.is_dir():
            raise MpstudioError(f"data folder not found: {self.folder}")
        self.files = sorted(p for p in self.folder.iterdir() if p.suffix in (".npz", ".npy"))
        if not self.files:
            raise MpstudioError(f"no .npz or .npy files in {self.folder}; write one file per sample")
        self.input_names = list(input_names or [])
        self.name = self.folder.name

    def __len__(self) -> int:
        return len(self.files)

    def sample(self, index: int) -> Feed:
        path = self.files[index]
        try:
            loaded = np.load(path, allow_pickle=False)
            if isinstance(loaded, np.ndarray):
                if len(self.input_names) > 1:
                    raise MpstudioError(
                        f"{path.name} is a single .npy array but the model has inputs {self.input_names}; use .npz"
                    )
                return {self.input_names[0] if self.input_names else "input": loaded}
            with loaded:
                feed = {key: loaded[key] for key in loaded.files}
        except MpstudioError:
            raise
        except ValueError as exc:
            if "pickle" in str(exc):
                raise MpstudioError(f"{path.name} holds pickled objects, which mpstudio never loads; save plain arrays") from exc
            raise MpstudioError(f"cannot read {path.name}: {exc}") from exc
        except Exception as exc:
            raise MpstudioError(f"cannot read {path.name}: {exc}") from exc
        if set(feed) == {"arr_0"} and len(self.input_names) == 1:
            feed = {self.input_names[0]: feed["arr_0"]}
        return feed


class ImageFolder(DataSource):
    """A folder of images, each turned into a feed by `preprocess(PIL.Image) -> array or feed dict`."""

    def __init__(self, folder: str | Path, preprocess: Callable, input_name: str | None = None):
        from PIL import Image  # Pillow is needed only for image folders

        self._open = Image.open
        self.folder = Path(folder)
        if not self.folder.is_dir():
            raise MpstudioError(f"image folder not found: {self.folder}")
        self.files = sorted(p for p in self.folder.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
        if not self.files:
            raise MpstudioError(f"no images ({', '.join(IMAGE_SUFFIXES)}) in {self.folder}")
        self.preprocess, self.input_name, self.name = preprocess, input_name, self.folder.name

    def __len__(self) -> int:
        return len(self.files)

    def sample(self, index: int) -> Feed:
        path = self.files[index]
        try:
            with self._open(path) as image:
                out = self.preprocess(image.convert("RGB"))
        except MpstudioError:
            raise
        except Exception as exc:
            raise MpstudioError(f"preprocessing {path.name} failed: {exc}") from exc
        if isinstance(out, Mapping):
            return {str(k): np.asarray(v) for k, v in out.items()}
        return {self.input_name or "input": np.asarray(out)}


class Subset(DataSource):
    def __init__(self, base: DataSource, indices: list[int], name: str):
        bad = [i for i in indices if not 0 <= i < len(base)]
        if bad:
            raise MpstudioError(f"sample indices {bad[:5]} are outside {base.name} ({len(base)} samples)")
        self.base, self.indices, self.name = base, indices, name

    def __len__(self) -> int:
        return len(self.indices)

    def sample(self, index: int) -> Feed:
        return self.base.sample(self.indices[index])


def as_source(data, input_names: Sequence[str] | None = None, preprocess: Callable | None = None) -> DataSource:
    """Coerce what a user gives (source, folder path, list of dicts, callable with a count) to a DataSource."""
    if isinstance(data, DataSource):
        return data
    if isinstance(data, (str, os.PathLike)):
        path = Path(data)
        if not path.exists():
            raise MpstudioError(f"data folder not found: {path}")
        if preprocess is not None:
            return ImageFolder(path, preprocess, input_names[0] if input_names and len(input_names) == 1 else None)
        return NpzFolder(path, input_names)
    if isinstance(data, tuple) and len(data) == 2 and callable(data[0]):
        return CallableSource(data[0], data[1])
    if callable(data):
        raise MpstudioError("a callable data source needs a sample count: pass (fn, count) or CallableSource(fn, count)")
    if isinstance(data, Mapping):
        return FeedList([data])
    if isinstance(data, Iterable):
        return FeedList(data)
    raise MpstudioError(f"cannot use a {type(data).__name__} as data: give a folder, a list of feed dicts, or (fn, count)")


def check_feeds(source: DataSource, inputs, limit: int | None = None) -> None:
    """Check samples against the model's inputs (`TensorSpec`s): names, shapes and dtypes, with clear errors."""
    if len(source) == 0:
        raise MpstudioError(f"{source.name} holds no samples")
    for i in range(len(source) if limit is None else min(limit, len(source))):
        check_feed(source.sample(i), inputs, f"sample {i} of {source.name}")


def check_feed(feed: Feed, inputs, where: str) -> None:
    """Check one feed against the model's inputs; `where` names the sample in the error."""
    expected = {spec.name: spec for spec in inputs}
    missing = sorted(set(expected) - set(feed))
    extra = sorted(set(feed) - set(expected))
    if missing or extra:
        raise MpstudioError(
            f"{where} does not match the model's inputs: "
            + (f"missing {missing}" if missing else "")
            + ("; " if missing and extra else "")
            + (f"unexpected {extra}" if extra else "")
            + f" (the model takes {sorted(expected)})"
        )
    for name, spec in expected.items():
        arr = feed[name]
        if arr.dtype.name != spec.dtype:
            why = (" (mpstudio quantizes a float16 model's float32 form)"
                   if (arr.dtype.name, spec.dtype) == ("float16", "float32") else "")
            raise MpstudioError(
                f"{where}: input {name!r} is {arr.dtype.name}, the model wants {spec.dtype}{why}; "
                f"convert it with .astype(np.{spec.dtype})"
            )
        if tuple(arr.shape) != tuple(spec.shape):
            raise MpstudioError(
                f"{where}: input {name!r} has shape {list(arr.shape)}, the model wants {list(spec.shape)}"
                + _layout_hint(tuple(arr.shape), tuple(spec.shape))
            )


def _layout_hint(shape: tuple, wanted: tuple) -> str:
    """When `shape` holds `wanted`'s sizes in another order (an image channels-last, NHWC, for a model that takes
    NCHW), the transpose that gives the model's order ("" otherwise)."""
    if not all(isinstance(d, int) for d in wanted) or shape == wanted or sorted(shape) != sorted(wanted):
        return ""
    perm, used = [], set()
    for size in wanted:  # each wanted axis from the first unused axis of its size, so equal sizes keep their order
        axis = next(i for i, d in enumerate(shape) if d == size and i not in used)
        perm.append(axis)
        used.add(axis)
    layout = " (channels-last, NHWC, for a model that takes NCHW)" if perm == [0, 3, 1, 2] else ""
    return (f": the same sizes in another order{layout}; transpose each array with "
            f"np.transpose(x, {tuple(perm)}) when preprocessing it")


def check_finite(feed: Feed, where: str) -> None:
    """Refuse NaN and infinities in a feed's float inputs (a calibrator cannot take a range over them); `where`
    names the sample in the error."""
    for name, arr in feed.items():
        arr = np.asarray(arr)
        if arr.dtype.kind in "fc" and not np.isfinite(arr).all():
            bad = ~np.isfinite(arr)
            first = tuple(int(i) for i in np.argwhere(bad)[0])
            kinds = " and ".join(k for k, found in (("NaN", np.isnan(arr).any()), ("infinite values", np.isinf(arr).any()))
                                 if found)
            raise MpstudioError(
                f"{where}: input {name!r} holds {kinds} ({int(bad.sum())} of {arr.size} values, the first at index "
                f"{list(first)}); calibration needs finite numbers: fix or drop that sample")


def split(source: DataSource, calibration: int | float = 0.5) -> tuple[DataSource, DataSource]:
    """Deterministic calibration / evaluation split: the first part calibrates, the rest evaluates."""
    n = len(source)
    k = int(round(calibration * n)) if isinstance(calibration, float) else int(calibration)
    if not 0 < k < n:
        raise MpstudioError(f"cannot split {n} samples into {k} for calibration and {n - k} for evaluation")
    return (
        source.subset(range(k), f"{source.name}[calibration]"),
        source.subset(range(k, n), f"{source.name}[evaluation]"),
    )


class CalibrationReader(CalibrationDataReader):
    """ORT's CalibrationDataReader over a DataSource, reporting progress and honouring a cancel event.

    Given the model's `inputs`, each sample is checked as it is served (and every sample for NaN and
    infinities), so bad data fails with a clear message without a separate pass over the files.
    """

    def __init__(self, source: DataSource, progress: Progress | None = None, cancel=None, message: str = "calibrating",
                 inputs=None):
        self.source, self.progress, self.cancel, self.message = source, progress, cancel, message
        self.inputs = inputs
        self._iter = None
        self.count = 0
        self.exhausted = False
        self._chunk_end: int | None = None

    def start_chunk(self, size: int) -> None:
        """Serve at most `size` more samples, then report the end (so a calibrator can merge ranges)."""
        self._chunk_end = self.count + size

    def get_next(self):
        if self._iter is None:
            self._iter = self.source.feeds()
        if self.cancel is not None and self.cancel.is_set():
            raise Cancelled("cancelled")
        if self._chunk_end is not None and self.count >= self._chunk_end:
            return None
        feed = next(self._iter, None)
        if feed is None:
            self.exhausted = True
        else:
            where = f"sample {self.count} of {self.source.name}"
            if self.inputs is not None:
                check_feed(feed, self.inputs, where)
            check_finite(feed, where)
            self.count += 1
            if self.progress:
                self.progress(self.count, len(self.source), self.message)
        return feed

    def __len__(self):
        return len(self.source)


class Cancelled(MpstudioError):
    """Long work stopped because its cancel event was set."""


@dataclass(frozen=True)
class TaskMetric:
    """A task metric over a whole evaluation set: `fn(outputs) -> float`, outputs in sample order.

    Each item of `outputs` is a dict of output name -> array for one sample; the labels live in `fn`. With
    `needs_reference`, `fn(outputs, reference)` also gets the float model's outputs on the same samples (a
    study passes them; see `mpstudio.metrics` for metrics stored by reference).
    """

    name: str
    fn: Callable[..., float]
    higher_is_better: bool = False
    needs_reference: bool = False

    def __call__(self, outputs: list[Feed], reference: list[Feed] | None = None) -> float:
        if not self.needs_reference:
            return float(self.fn(outputs))
        if reference is None:
            raise MpstudioError(f"the metric {self.name!r} compares with the float model's outputs; evaluate it "
                                "in a study (Study.evaluate), which passes them")
        return float(self.fn(outputs, reference))
