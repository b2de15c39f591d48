"""The `studio` command: the studio in a browser, served by Panel on this machine only unless sharing is chosen
(with Panel's authentication and an origin list)."""

from __future__ import annotations

from ..errors import MpstudioError


def _studio(args) -> int:
    import panel as pn

    from ..widgets.serving import is_loopback, policy_from, studio_session

    policy = policy_from(args)
    local = args.address in ("localhost", "") or is_loopback(args.address)
    if not local and not args.share:
        raise MpstudioError(f"--address {args.address} listens beyond this machine; add --share with --basic-auth "
                            "(and --allow-websocket-origin HOST:PORT) to share the studio, or leave --address out")
    if args.share and not args.basic_auth and not pn.config.oauth_provider:
        raise MpstudioError("--share needs authentication: give --basic-auth (a password or a JSON file of users "
                            "and passwords), or serve app.py with Panel's OAuth options (docs/security.md)")
    auth = {"basic_auth": args.basic_auth, "cookie_secret": args.cookie_secret} if args.basic_auth else {}
    origins = args.allow_websocket_origin or [f"localhost:{args.port}", f"127.0.0.1:{args.port}"]

    def session():
        pn.extension("tabulator")
        return studio_session(args, policy)

    print(f"mpstudio: the studio at http://{'localhost' if local else args.address}:{args.port}/ "
          f"({'this machine only' if not args.share else 'shared, with authentication'})", flush=True)
    pn.serve({"/": session}, address=args.address, port=args.port, websocket_origin=origins, show=args.show,
             title="mpstudio", **auth)
    return 0


def add_studio_parser(sub) -> None:
    from ..widgets.serving import add_studio_arguments

    s = sub.add_parser("studio", help="the studio in a browser (this machine only, unless --share)")
    add_studio_arguments(s)
    s.add_argument("--address", default="localhost",
                   help="the address to listen on (default localhost: 127.0.0.1 and ::1)")
    s.add_argument("--port", type=int, default=5006, help="the port (default 5006)")
    s.add_argument("--allow-websocket-origin", action="append", default=[], metavar="HOST:PORT",
                   help="a host:port the studio's page may be loaded from (repeat; needed to share it)")
    s.add_argument("--basic-auth", metavar="PASSWORD_OR_FILE",
                   help="Panel's basic authentication: one password, or a JSON file of users and passwords")
    s.add_argument("--cookie-secret", help="the secret that signs login cookies (default: a random one)")
    s.add_argument("--show", action="store_true", help="open the studio in a browser")
    s.set_defaults(func=_studio)
