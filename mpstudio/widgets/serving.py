"""The studio's session page, served by `panel serve app.py`: the studio's arguments (`--root`, `--agent`,
`--share` beside what to open), and each session's page: the studio, or a refusal for a client off this machine
(mpstudio.widgets.policy says who may have one; docs/security.md)."""

from __future__ import annotations

import argparse
import html
import logging

import panel as pn

from ..agent.protocol import TOKEN_ENV
from .policy import AGENTS_ENV, ROOTS_ENV, ServerPolicy, authentication, client_refusal, session_address
from .study_session import open_study_folder, study_key

log = logging.getLogger(__name__)
STUDY_QUERY = "study"  # the address's key of the study a tab shows


def studio_parser(prog: str = "panel serve app.py --args") -> argparse.ArgumentParser:
    """The studio's own arguments (after `--args` for `panel serve`)."""
    parser = argparse.ArgumentParser(prog=prog, description="The mixed-precision studio in a browser.")
    add_studio_arguments(parser)
    return parser


def add_studio_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--study", help="a study folder to open (or to create, with --model and --data)")
    parser.add_argument("--model", help="an ONNX model file")
    parser.add_argument("--data", help="a folder of .npz samples, keys = the model's input names")
    parser.add_argument("--shape", action="append", default=[], help="a static shape for a dynamic input: "
                                                                     "x=1,3,224,224")
    parser.add_argument("--allow-fallback", action="store_true",
                        help="open a model with nodes QNN HTP lacks: HTP evaluations run them on ORT's CPU EP")
    parser.add_argument("--root", action="append", default=[], metavar="DIR",
                        help=f"a folder visitors may open models, data and studies in (repeat for more; default "
                             f"${ROOTS_ENV} or the working directory)")
    parser.add_argument("--agent", action="append", default=[], metavar="URL",
                        help=f"a remote agent the Run panel offers (repeat for more; default ${AGENTS_ENV}); its "
                             f"token comes from ${TOKEN_ENV}")
    parser.add_argument("--share", action="store_true",
                        help="serve clients on other machines too (needs Panel's --basic-auth or OAuth)")


def policy_from(args) -> ServerPolicy:
    return ServerPolicy.served(args.root, args.agent, share=args.share)


def studio_session(args, policy: ServerPolicy):
    """One session's page: the studio opened on what `args` names (its jobs stopped when the session ends), or a
    refusal when the client may not have one."""
    from .state import StudioState
    from .studio import Studio

    address = session_address()
    refusal = client_refusal(address, policy.share, authentication())
    if refusal:
        log.warning("refused a studio session to %s: %s", address, refusal)
        return pn.pane.HTML(f"<p class='mpstudio-refused'>{html.escape(refusal)}</p>")
    reloaded = open_study_folder(_query_value(STUDY_QUERY))
    if reloaded is not None:  # a reload of a tab that had this study open: the study again, not the arguments'
        state = StudioState.from_arguments(study=str(reloaded), policy=policy)
    else:
        state = StudioState.from_arguments(study=args.study, model=args.model, data=args.data,
                                           shapes=" ".join(args.shape), allow_fallback=args.allow_fallback,
                                           policy=policy)
    keep_study_in_address(state, pn.state.location)
    pn.state.on_session_destroyed(lambda context: state.close())
    return Studio(state).template()


def keep_study_in_address(state, location) -> None:
    """The tab's address names the study it shows (`?study=KEY`, mpstudio.widgets.study_session.study_key), so a
    reload comes back to it, whether the server's arguments or the Model and data panel opened it."""
    if location is None:
        return

    def on_study(event):
        if event.new is not None:
            location.update_query(**{STUDY_QUERY: study_key(event.new.folder)})
    state.param.watch(on_study, "study")


def _query_value(name: str) -> str:
    values = (pn.state.session_args or {}).get(name) or [b""]
    return values[0].decode(errors="replace")
