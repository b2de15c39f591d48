"""`python -m mpstudio.agent serve ...`: the agent without the full `mpstudio` command line."""

import argparse
import sys

from .cli import add_parser


def main(argv=None) -> int:
    # Usage lines then read "python -m mpstudio agent serve", an equivalent command.
    parser = argparse.ArgumentParser(prog="python -m mpstudio")
    # add_parser adds the `agent` command; here the program itself is the agent, so unwrap one level.
    wrapper = parser.add_subparsers(dest="command")
    add_parser(wrapper)
    args = parser.parse_args(["agent", *(sys.argv[1:] if argv is None else argv)])
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
