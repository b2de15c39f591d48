"""The `mpstudio` command line: one module per group of subcommands, the parser and `main` here."""

from __future__ import annotations

import argparse
import sys

from ..errors import MpstudioError
from .demo import add_demo_parser
from .evaluate import add_evaluate_parser
from .model import add_analyze_parser, add_prepare_parser, add_quantize_parser, open_model_data_plan
from .progress import progress_bar
from .study import add_diverge_parser, add_export_parser, add_import_parser, add_search_parser, add_study_parser

__all__ = ["build_parser", "main", "open_model_data_plan", "progress_bar"]


def _add_agent_parser(sub) -> None:
    try:
        from ..agent.cli import add_parser
    except ImportError:  # the agent's server dependencies are optional at import time
        return
    add_parser(sub)


_COMMANDS = (add_prepare_parser, add_quantize_parser, add_analyze_parser, add_demo_parser, add_search_parser,
             add_study_parser, add_export_parser, add_import_parser, _add_agent_parser, add_diverge_parser,
             add_evaluate_parser)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mpstudio", description="Mixed-precision studio for ONNX models on Qualcomm NPUs.")
    parser.add_argument("--version", action="version", version=f"mpstudio {__import__('mpstudio').__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for add in _COMMANDS:
        add(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except MpstudioError as exc:
        print(f"mpstudio: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("mpstudio: interrupted", file=sys.stderr)
        return 130

