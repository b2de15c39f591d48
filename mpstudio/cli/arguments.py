"""Arguments several subcommands share (agents, input shapes, --quiet), and the runner `--agent` names."""

from __future__ import annotations

from ..errors import MpstudioError


def open_ray(args, stack):
    """The Ray cluster `--ray` (or $MPSTUDIO_RAY_ADDRESS) names, connected for this command; None without one."""
    from ..distributed.cluster import ray_address

    if not hasattr(args, "ray"):  # a command whose runs are not samples (a device's build)
        return None
    address = ray_address(args.ray)
    if address is None:
        return None
    if getattr(args, "agent", None) or getattr(args, "local_agent", False):
        raise MpstudioError("--ray and --agent/--local-agent name two places to run: choose one (unset "
                            "MPSTUDIO_RAY_ADDRESS to use agents)")
    from ..distributed import connect

    cluster = connect(address)
    stack.callback(cluster.close)
    print(cluster.describe())
    return cluster


def open_runner(args, stack):
    """None (this process), an AgentPool over `--agent` URLs, a local agent started for this command, or the
    Ray cluster of `--ray` / $MPSTUDIO_RAY_ADDRESS (`distributed.OverRay`)."""
    cluster = open_ray(args, stack)
    if cluster is not None:
        from ..distributed import OverRay

        return OverRay(cluster)
    if getattr(args, "agent", None):
        from ..agent import AgentPool

        return stack.enter_context(AgentPool(args.agent, token=args.token))
    if getattr(args, "local_agent", False):
        from ..agent import LocalAgent

        return stack.enter_context(LocalAgent()).client
    return None


def add_runner_args(parser, ray: bool = True) -> None:
    """--agent, --token, --local-agent; and --ray where the command's runs are samples (not a device's build)."""
    parser.add_argument("--agent", action="append", metavar="URL", help="agent URL (repeat for a pool of devices)")
    parser.add_argument("--token", default=None, help="bearer token of the agents")
    parser.add_argument("--local-agent", action="store_true", help="start an agent on loopback for this command")
    if ray:
        add_ray_arg(parser)


def add_ray_arg(parser) -> None:
    parser.add_argument("--ray", metavar="auto|ADDRESS", default=None,
                        help="run CPU and HTP-emulator samples (and sensitivity chunks) on a Ray cluster: auto, "
                             "HOST:PORT, ray://HOST:PORT, or local (default: $MPSTUDIO_RAY_ADDRESS; docs/ray.md)")


def add_shape_arg(parser) -> None:
    parser.add_argument("--shape", action="append", metavar="NAME=D1,D2,...", help="fix a dynamic input's shape")


def add_quiet_arg(parser, help: str = "no progress bars") -> None:
    parser.add_argument("--quiet", action="store_true", help=help)


def prepare_for_data(model: str, shape_args, data: str | None):
    """`prepare_model` with the command line's --shape; a model whose inputs are dynamic, given no shape for
    them, is told the --shape its data's first sample has."""
    from ..model import parse_shape_args, prepare_model

    try:
        return prepare_model(model, parse_shape_args(shape_args))
    except MpstudioError as exc:
        hint = _shapes_of_first_sample(data) if data and "these inputs are dynamic" in str(exc) else ""
        if not hint:
            raise
        raise MpstudioError(f"{exc} The first sample of {data} has {hint}") from None


def _shapes_of_first_sample(data: str) -> str:
    from ..data import NpzFolder

    try:
        sample = NpzFolder(data).sample(0)
    except Exception:  # the data's own errors come when it is read for real
        return ""
    return " ".join(f"--shape {name}={','.join(str(d) for d in value.shape)}" for name, value in sample.items())
