"""A study of one of benchmarks/outcome.py's public models, for `benchmarks/search.py --study DIR`.

    python benchmarks/public_study.py encoder DIR [--encoder FILE] [--samples 48]
    python benchmarks/public_study.py cnn DIR [--samples 64] [--size 96]

encoder: a BERT-family encoder (`--encoder FILE`, e.g. a torch export with inputs input_ids/attention_mask [1,64];
without it the MiniLM-size one built with onnx.helper) on random token sequences of 16-64 tokens, scored by the
cosine of its hidden states against the float model's. cnn: MobileNet-v2 (latency_models.mobilenet_v2, random
weights) at `--size`, random normal images, scored by top-1 agreement with the float model. The data come from
outcome.py's fixed seed (`--samples` evaluation samples and 32 calibration samples): two builds are the same study.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from mpstudio.model import prepare_model  # noqa: E402
from mpstudio.study import Study  # noqa: E402


def build(kind: str, folder: Path, samples: int, encoder: str | None = None, size: int = 96) -> Study:
    import outcome

    if kind == "encoder":
        case = outcome.encoder_case(encoder, samples)
    else:
        import latency_models
        from mpstudio.data import FeedList
        from mpstudio.metrics import metric_spec

        model = latency_models.mobilenet_v2(size)
        feeds = latency_models.random_feeds(model, samples + 32, seed=outcome.SEED)
        case = outcome.Case("cnn", f"MobileNet-v2 {size}x{size} (onnx.helper, random weights)", model,
                            FeedList(feeds[samples:], name="calibration images"),
                            FeedList(feeds[:samples], name="images"), metric_spec("top1"))
    return Study.create(folder, prepare_model(case.model, case.shapes), case.calibration, case.evaluation,
                        case.metric, name=f"{case.name}: {case.what}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("kind", choices=("encoder", "cnn"))
    parser.add_argument("folder", type=Path)
    parser.add_argument("--samples", type=int, default=48, help="evaluation samples (32 more calibrate)")
    parser.add_argument("--encoder", help="an ONNX encoder file instead of the onnx.helper one")
    parser.add_argument("--size", type=int, default=96, help="the CNN's input size")
    args = parser.parse_args(argv)
    with build(args.kind, args.folder, args.samples, args.encoder, args.size) as study:
        print(f"{study.folder}: {study.name}; {len(study.calibration)} calibration and "
              f"{len(study.evaluation_data)} evaluation samples; metric {study.metric_name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
