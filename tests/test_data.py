"""Data sources: folders of npz/npy, feed lists, callables, image folders; checks, splits, ORT reader."""

import threading

import numpy as np
import pytest

from conftest import conv_feeds
from mpstudio import MpstudioError
from mpstudio.data import (
    CalibrationReader, CallableSource, Cancelled, FeedList, ImageFolder, NpzFolder, as_source, check_feeds, split,
)
from mpstudio.model import TensorSpec

SPEC = (TensorSpec("x", (1, 3, 16, 16), "float32"),)


def test_npz_folder_round_trip(tmp_path):
    source = FeedList(conv_feeds(5))
    source.save_npz(tmp_path / "d")
    folder = NpzFolder(tmp_path / "d", ["x"])
    assert len(folder) == 5
    for a, b in zip(source.feeds(), folder.feeds()):
        np.testing.assert_array_equal(a["x"], b["x"])
    assert folder.fingerprint() == source.fingerprint()
    check_feeds(folder, SPEC)


def test_npy_files_map_to_the_single_input(tmp_path):
    (tmp_path / "d").mkdir()
    np.save(tmp_path / "d" / "0.npy", conv_feeds(1)[0]["x"])
    folder = NpzFolder(tmp_path / "d", ["x"])
    check_feeds(folder, SPEC)


def test_pickled_npz_is_refused_not_loaded(tmp_path):
    (tmp_path / "d").mkdir()
    np.savez(tmp_path / "d" / "0.npz", x=np.array([{"a": 1}], dtype=object))
    with pytest.raises(MpstudioError, match="pickled"):
        NpzFolder(tmp_path / "d", ["x"]).sample(0)


def test_wrong_shape_dtype_and_names_are_clear(tmp_path):
    with pytest.raises(MpstudioError, match=r"shape \[1, 3, 8, 8\].*wants \[1, 3, 16, 16\]"):
        check_feeds(FeedList([{"x": np.zeros((1, 3, 8, 8), np.float32)}]), SPEC)
    with pytest.raises(MpstudioError, match="is float64, the model wants float32"):
        check_feeds(FeedList([{"x": np.zeros((1, 3, 16, 16))}]), SPEC)
    with pytest.raises(MpstudioError, match=r"missing \['x'\].*unexpected \['input'\]"):
        check_feeds(FeedList([{"input": np.zeros((1, 3, 16, 16), np.float32)}]), SPEC)
    with pytest.raises(MpstudioError, match="holds no samples"):
        check_feeds(FeedList([]), SPEC)



def test_an_image_channels_last_is_told_how_to_transpose():
    with pytest.raises(MpstudioError, match=r"shape \[1, 16, 16, 3\], the model wants \[1, 3, 16, 16\]: the same sizes "
                                            r"in another order \(channels-last, NHWC.*np.transpose\(x, \(0, 3, 1, 2\)\)"):
        check_feeds(FeedList([{"x": np.zeros((1, 16, 16, 3), np.float32)}]), SPEC)
    with pytest.raises(MpstudioError, match=r"another order; transpose each array with np.transpose\(x, \(0, 2, 1, 3\)\)"):
        check_feeds(FeedList([{"x": np.zeros((1, 16, 3, 16), np.float32)}]), SPEC)
    with pytest.raises(MpstudioError) as other_size:  # other sizes: no transpose would do
        check_feeds(FeedList([{"x": np.zeros((1, 3, 20, 20), np.float32)}]), SPEC)
    assert "transpose" not in str(other_size.value)


def test_missing_and_empty_folders(tmp_path):
    with pytest.raises(MpstudioError, match="not found"):
        NpzFolder(tmp_path / "nothing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(MpstudioError, match="no .npz or .npy"):
        NpzFolder(tmp_path / "empty")


def test_callable_and_coercion():
    source = as_source((lambda i: {"x": np.full((1, 3, 16, 16), i, np.float32)}, 4))
    assert isinstance(source, CallableSource) and len(source) == 4
    assert source.sample(3)["x"][0, 0, 0, 0] == 3
    with pytest.raises(MpstudioError, match="sample count"):
        as_source(lambda i: {})
    assert len(as_source(conv_feeds(3))) == 3
    with pytest.raises(MpstudioError, match="not a dict"):
        FeedList([np.zeros(3)])


def test_image_folder_with_preprocessing(tmp_path):
    from PIL import Image

    (tmp_path / "img").mkdir()
    for i in range(3):
        Image.fromarray(np.full((20, 20, 3), 40 * i, np.uint8)).save(tmp_path / "img" / f"{i}.png")

    def preprocess(image):
        arr = np.asarray(image.resize((16, 16)), np.float32).transpose(2, 0, 1)[None] / 255.0
        return arr

    source = as_source(tmp_path / "img", ["x"], preprocess=preprocess)
    assert isinstance(source, ImageFolder) and len(source) == 3
    check_feeds(source, SPEC)
    assert source.sample(2)["x"].max() == pytest.approx(80 / 255)


def test_split_is_deterministic_and_disjoint():
    source = FeedList(conv_feeds(10))
    cal, ev = split(source, 0.3)
    assert len(cal) == 3 and len(ev) == 7
    np.testing.assert_array_equal(ev.sample(0)["x"], source.sample(3)["x"])
    with pytest.raises(MpstudioError):
        split(source, 10)


def test_calibration_reader_progress_and_cancel():
    calls = []
    reader = CalibrationReader(FeedList(conv_feeds(3)), progress=lambda d, t, m: calls.append((d, t)))
    assert sum(1 for _ in iter(reader.get_next, None)) == 3
    assert calls == [(1, 3), (2, 3), (3, 3)]
    cancel = threading.Event()
    cancel.set()
    with pytest.raises(Cancelled):
        CalibrationReader(FeedList(conv_feeds(3)), cancel=cancel).get_next()
