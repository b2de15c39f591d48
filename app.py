"""The studio in a browser: `panel serve app.py` opens the built-in demo;
`panel serve app.py --args --study DIR` opens a study; `--args --model M.onnx --data DIR` a model and data."""

import argparse
import sys

import panel as pn

from mpstudio.widgets import Studio, StudioState

parser = argparse.ArgumentParser(prog="panel serve app.py --args", description=__doc__.splitlines()[0])
parser.add_argument("--study", help="a study folder to open (or to create, with --model and --data)")
parser.add_argument("--model", help="an ONNX model file")
parser.add_argument("--data", help="a folder of .npz samples, keys = the model's input names")
parser.add_argument("--shape", action="append", default=[], help="a static shape for a dynamic input: x=1,3,224,224")
parser.add_argument("--allow-fallback", action="store_true",
                    help="open a model with nodes QNN HTP lacks: HTP evaluations run them on ORT's CPU EP")
args = parser.parse_args(sys.argv[1:])

pn.extension("tabulator")

state = StudioState.from_arguments(study=args.study, model=args.model, data=args.data, shapes=" ".join(args.shape),
                                   allow_fallback=args.allow_fallback)
Studio(state).servable()
