"""The studio in a browser, on this machine only: `panel serve app.py --address localhost` opens the built-in demo;
`--args --study DIR` opens a study; `--args --model M.onnx --data DIR` a model and data. `--args --root DIR` names
the folders visitors may open files in (default: the working directory), `--args --agent URL` the remote agents
they may run plans on. Sessions are served to other machines only with `--args --share` and Panel's authentication
(docs/security.md)."""

import sys

import panel as pn

from mpstudio.errors import MpstudioError
from mpstudio.widgets.origin_guard import refuse_websockets_without_origin
from mpstudio.widgets.serving import policy_from, studio_parser, studio_session
from mpstudio.widgets.studio import TITLE

refuse_websockets_without_origin()  # before anything else this session does
args = studio_parser().parse_args(sys.argv[1:])
try:
    policy = policy_from(args)
except MpstudioError as exc:
    sys.exit(f"mpstudio: error: {exc}")

pn.extension("tabulator")
studio_session(args, policy).servable(title=TITLE)
