"""The built-in demo: PP-OCRv4's text-line recognizer on rendered lines of real English text, scored by CER.

The model ships in the `rapidocr_onnxruntime` package (Apache-2.0; install with `pip install mpstudio[demo]`);
only its .onnx file is used. The lines are sentences from the help topics that come with Python itself,
rendered with Pillow's built-in font plus mild blur and noise, deterministic by seed, so the ground truth
is exact.
"""

from __future__ import annotations

import importlib.util
import random
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..cache import cache_root
from ..data import DataSource, NpzFolder, TaskMetric
from ..errors import MpstudioError
from ..ctc_text import cer_metric, ctc_charset
from ..model import PreparedModel, prepare_model

MODEL_FILE = "ch_PP-OCRv4_rec_infer.onnx"
INPUT_NAME = "x"
HEIGHT, WIDTH = 48, 320
DATA_VERSION = 1  # bump when rendering changes, so cached data is remade


@dataclass(frozen=True)
class DemoCase:
    """A model with its data and task metric, ready for a study."""

    name: str
    model: PreparedModel
    calibration: DataSource
    evaluation: DataSource
    metric: TaskMetric
    texts: tuple[str, ...]  # ground truth of the evaluation lines, in order

    @property
    def model_path(self) -> Path:
        return Path(self.model.source)


def demo_model_file() -> Path:
    """The recognizer's .onnx file inside the installed `rapidocr_onnxruntime` package."""
    spec = importlib.util.find_spec("rapidocr_onnxruntime")
    if spec is None or not spec.submodule_search_locations:
        raise MpstudioError(
            "the built-in demo needs its model package: pip install 'mpstudio[demo]' "
            "(it installs rapidocr_onnxruntime, which ships the PP-OCRv4 recognizer)"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / "models" / MODEL_FILE
    if not path.is_file():
        raise MpstudioError(f"the installed rapidocr_onnxruntime lacks {MODEL_FILE}; reinstall mpstudio[demo]")
    return path


def load_demo(calibration_lines: int = 100, evaluation_lines: int = 100, seed: int = 0,
              cache_dir: str | Path | None = None) -> DemoCase:
    """The PP-OCRv4 recognizer (static shape [1, 3, 48, 320]), rendered lines, and the CER metric.

    The prepared model and the rendered samples are cached (`cache_dir`, default the mpstudio cache), so
    later calls are fast and every call returns identical data.
    """
    root = Path(cache_dir) if cache_dir else cache_root() / "demo"
    source = demo_model_file()
    prepared_path = root / "ppocrv4_rec_static.onnx"
    if not prepared_path.exists():
        prepare_model(source, {INPUT_NAME: [1, 3, HEIGHT, WIDTH]}).save(prepared_path)
    # Always read back from the file, so the first call and later ones give the same model and hash.
    prepared = prepare_model(prepared_path, optimize=False)
    charset = ctc_charset(prepared)

    total = calibration_lines + evaluation_lines
    data_dir = root / f"lines-v{DATA_VERSION}-seed{seed}-n{total}"
    if not (data_dir / "texts.txt").exists():
        render_dataset(sample_lines(total, seed, set(charset)), data_dir, seed)
    texts = (data_dir / "texts.txt").read_text().splitlines()
    samples = NpzFolder(data_dir / "samples", [INPUT_NAME])
    calibration = samples.subset(range(calibration_lines), "demo-lines[calibration]")
    evaluation = samples.subset(range(calibration_lines, total), "demo-lines[evaluation]")
    references = tuple(texts[calibration_lines:])
    return DemoCase(
        name="PP-OCRv4 text-line recognizer",
        model=prepared,
        calibration=calibration,
        evaluation=evaluation,
        metric=cer_metric(references, charset),
        texts=references,
    )


# ---- text ------------------------------------------------------------------------------------------------
_ASCII_QUOTES = str.maketrans({"\u2018": "'", "\u2019": "'", "\u201c": '"', "\u201d": '"'})


def sample_lines(count: int, seed: int, charset: set[str], min_chars: int = 6, max_chars: int = 22) -> list[str]:
    """`count` distinct lines of real English prose from Python's own help topics, chosen by seed."""
    from pydoc_data.topics import topics

    rng = random.Random(seed)
    words: list[str] = []
    for key in sorted(topics):
        for paragraph in topics[key].split("\n\n"):
            text = " ".join(paragraph.split())
            # Prose only: code samples and tables make poor text lines.
            if len(text) < 80 or re.search(r"[{}<>|=_*\\`]|>>>|\.\.\.", text):
                continue
            text = text.translate(_ASCII_QUOTES)
            words.extend(w for w in text.split(" ") if w and all(c in charset for c in w))
    lines: list[str] = []
    seen: set[str] = set()
    while len(lines) < count:
        start = rng.randrange(0, len(words) - 10)
        target = rng.randint(min_chars, max_chars)
        line = words[start]
        for word in words[start + 1:start + 12]:
            if len(line) + 1 + len(word) > target:
                break
            line += " " + word
        # A line wider than 320/48 would be squashed by the resize; real line crops rarely are.
        if len(line) >= min_chars and line not in seen and _aspect(line) <= 0.95 * WIDTH / HEIGHT:
            seen.add(line)
            lines.append(line)
    return lines


def _aspect(text: str) -> float:
    from PIL import ImageFont

    font = ImageFont.load_default(size=36)  # the largest size render_line uses
    left, top, right, bottom = font.getbbox(text)
    return (right - left + 8) / (bottom - top + 6)


def render_line(text: str, seed: int) -> np.ndarray:
    """An RGB uint8 image of one line of text, with mild blur and noise, deterministic by seed."""
    from PIL import Image, ImageDraw, ImageFilter, ImageFont

    rng = np.random.default_rng(seed)
    size = int(rng.integers(26, 36))
    font = ImageFont.load_default(size=size)
    left, top, right, bottom = font.getbbox(text)
    pad_x, pad_y = int(rng.integers(4, 12)), int(rng.integers(3, 8))
    background = int(rng.integers(215, 256))
    ink = int(rng.integers(0, 70))
    image = Image.new("L", (right - left + 2 * pad_x, bottom - top + 2 * pad_y), background)
    ImageDraw.Draw(image).text((pad_x - left, pad_y - top), text, fill=ink, font=font)
    image = image.filter(ImageFilter.GaussianBlur(radius=float(rng.uniform(0.0, 0.9))))
    pixels = np.asarray(image, dtype=np.float32) + rng.normal(0.0, rng.uniform(1.0, 6.0), (image.height, image.width))
    gray = np.clip(pixels, 0, 255).astype(np.uint8)
    return np.stack([gray] * 3, axis=-1)


def preprocess_line(rgb: np.ndarray) -> np.ndarray:
    """PP-OCR recognizer input: height 48 keeping aspect (width at most 320), scaled to [-1, 1], padded, NCHW."""
    from PIL import Image

    h, w = rgb.shape[:2]
    new_w = min(WIDTH, max(1, int(np.ceil(HEIGHT * w / h))))
    resized = np.asarray(Image.fromarray(rgb).resize((new_w, HEIGHT), Image.BILINEAR), dtype=np.float32)
    chw = ((resized / 255.0 - 0.5) / 0.5).transpose(2, 0, 1)
    out = np.zeros((1, 3, HEIGHT, WIDTH), dtype=np.float32)
    out[0, :, :, :new_w] = chw
    return out


def render_dataset(texts: list[str], folder: Path, seed: int) -> None:
    """Render and preprocess every line; write `samples/NNNNNN.npz`, `images/NNNNNN.png` and `texts.txt`."""
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "samples").mkdir(exist_ok=True)
    (folder / "images").mkdir(exist_ok=True)
    for i, text in enumerate(texts):
        rgb = render_line(text, seed * 100_003 + i)
        Image.fromarray(rgb).save(folder / "images" / f"{i:06d}.png")
        np.savez(folder / "samples" / f"{i:06d}.npz", **{INPUT_NAME: preprocess_line(rgb)})
    # Written last: its presence marks a complete dataset.
    (folder / "texts.txt").write_text("\n".join(texts) + "\n")
