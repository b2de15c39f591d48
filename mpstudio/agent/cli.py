"""`mpstudio agent serve`: the command line of the remote agent."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from ..errors import MpstudioError
from ..runtime import DEFAULT_HTP_ARCH, HTP_OPTION_RULES
from .protocol import TOKEN_ENV


def add_parser(subparsers) -> None:
    """Add the `agent` command (with its `serve` subcommand) to an argparse subparsers object."""
    agent = subparsers.add_parser("agent", help="the QNN HTP remote agent", description="The QNN HTP remote agent.")
    commands = agent.add_subparsers(dest="agent_command", metavar="COMMAND")
    commands.required = True
    serve = commands.add_parser(
        "serve",
        help="serve this device's HTP (or the x86_64 emulator) over HTTP",
        description="Serve this device's HTP over HTTP. Listens on 127.0.0.1 unless told otherwise; any other "
        f"address needs a bearer token (--token or the {TOKEN_ENV} environment variable, which is safer: "
        "command lines are visible to other users).",
    )
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=8765, help="port (default 8765; 0 picks a free one)")
    serve.add_argument("--token", default=None, help=f"bearer token clients must send (default: ${TOKEN_ENV})")
    serve.add_argument("--workdir", type=Path, default=None,
                       help="where models and worker directories live (default: a temporary directory)")
    serve.add_argument("--max-upload-mb", type=float, default=512.0, help="largest request body in MB (default 512)")
    serve.add_argument("--run-timeout", type=float, default=300.0,
                       help="seconds a request may take on the device before its worker is killed (default 300)")
    serve.add_argument("--max-queue", type=int, default=64, help="requests that may wait for the device (default 64)")
    serve.add_argument("--max-sessions", type=int, default=4, help="sessions kept for reuse (default 4)")
    serve.add_argument("--device-name", default=None, help="name results are labelled with (default: host and CPU)")
    serve.add_argument("--htp-arch", default=DEFAULT_HTP_ARCH, choices=HTP_OPTION_RULES["htp_arch"].choices,
                       help=f"default htp_arch for runs that do not set it (default {DEFAULT_HTP_ARCH})")
    serve.add_argument("--soc-model", default=None, help="default soc_model for runs that do not set it")
    serve.add_argument("--threads", type=int, default=0, help="ORT intra-op threads (default: all cores)")
    limits = serve.add_argument_group("limits", "What one client may make the agent hold (docs/agent.md)")
    limits.add_argument("--max-inputs-mb", type=float, default=None,
                        help="largest total size of a run's input arrays once decompressed (default: --max-upload-mb)")
    limits.add_argument("--max-queued-mb", type=float, default=1024.0,
                        help="request bytes runs waiting for the device may hold between them; past it a run "
                        "gets 503 (default 1024)")
    limits.add_argument("--max-store-mb", type=float, default=10240.0,
                        help="disk kept for uploaded models; the least recently used are evicted (default 10240)")
    limits.add_argument("--max-uploads", type=int, default=2, help="uploads in progress at once (default 2)")
    limits.add_argument("--max-connections", type=int, default=128,
                        help="open connections; at the cap, the oldest that has not sent the token is closed to "
                        "make room (default 128)")
    limits.add_argument("--max-unauthenticated-per-client", type=int, default=16,
                        help="connections one client address may hold before sending the token (default 16)")
    limits.add_argument("--header-timeout", type=float, default=10.0,
                        help="seconds a client has to send a request's headers (default 10)")
    limits.add_argument("--body-timeout", type=float, default=30.0,
                        help="longest pause, in seconds, in the middle of a request body (default 30)")
    limits.add_argument("--request-timeout", type=float, default=600.0,
                        help="seconds a client has to send a whole request, body included (default 600)")
    serve.add_argument("--http", default="auto", choices=("auto", "h11", "httptools"),
                       help="HTTP parser (default: httptools when installed, else h11)")
    serve.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    serve.set_defaults(func=run_serve)


def run_serve(args: argparse.Namespace) -> int:
    from .server import AgentConfig, serve

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    token = args.token if args.token is not None else os.environ.get(TOKEN_ENV) or None
    config = AgentConfig(
        host=args.host, port=args.port, token=token, workdir=args.workdir, max_upload_mb=args.max_upload_mb,
        run_timeout_s=args.run_timeout, max_queue=args.max_queue, max_queued_mb=args.max_queued_mb,
        max_sessions=args.max_sessions,
        device_name=args.device_name, htp_arch=args.htp_arch, soc_model=args.soc_model,
        intra_op_threads=args.threads, max_inputs_mb=args.max_inputs_mb, max_store_mb=args.max_store_mb,
        max_uploads=args.max_uploads, max_connections=args.max_connections,
        max_unauthenticated_per_client=args.max_unauthenticated_per_client, header_timeout_s=args.header_timeout,
        body_timeout_s=args.body_timeout, request_timeout_s=args.request_timeout, http=args.http,
    )
    try:
        config.check()
        serve(config, log_level=args.log_level)
    except MpstudioError as exc:
        print(f"mpstudio agent: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # typically the port is taken
        print(f"mpstudio agent: cannot listen on {args.host}:{args.port}: {exc}", file=sys.stderr)
        return 2
    return 0
