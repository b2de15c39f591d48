"""Arguments several subcommands share (agents, input shapes, --quiet), and the runner `--agent` names."""

from __future__ import annotations


def open_runner(args, stack):
    """None (this process), an AgentPool over `--agent` URLs, or a local agent started for this command."""
    if getattr(args, "agent", None):
        from ..agent import AgentPool

        return stack.enter_context(AgentPool(args.agent, token=args.token))
    if getattr(args, "local_agent", False):
        from ..agent import LocalAgent

        return stack.enter_context(LocalAgent()).client
    return None


def add_runner_args(parser) -> None:
    parser.add_argument("--agent", action="append", metavar="URL", help="agent URL (repeat for a pool of devices)")
    parser.add_argument("--token", default=None, help="bearer token of the agents")
    parser.add_argument("--local-agent", action="store_true", help="start an agent on loopback for this command")


def add_shape_arg(parser) -> None:
    parser.add_argument("--shape", action="append", metavar="NAME=D1,D2,...", help="fix a dynamic input's shape")


def add_quiet_arg(parser) -> None:
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
