"""The ``tray`` command line."""

from __future__ import annotations

import argparse
import runpy
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tray", description="tray: tasks and actors, "
                                     "real or simulated")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("version", help="print tray's version")
    sim = commands.add_parser(
        "sim", help="run a Python script whose tray.init() uses the simulated backend, and "
                    "print the run's trace digest")
    sim.add_argument("script", help="path of the script to run")
    sim.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the script")
    from ..serve import _cli as serve_cli
    from ..simtest import cli as simtest_cli
    from . import cluster

    cluster.add_parsers(commands)
    simtest_cli.add_parsers(commands)
    serve_cli.add_parsers(commands)
    args = parser.parse_args(argv)
    if args.command == "simtest":
        return simtest_cli.dispatch(args)
    if args.command == "serve":
        return serve_cli.dispatch(args)
    if args.command in ("start", "stop", "status"):
        return getattr(cluster, args.command)(args)
    if args.command == "version":
        import tray

        print(tray.__version__)
        return 0
    if args.command == "sim":
        import tray.simtest

        sys.argv = [args.script, *args.args]
        runpy.run_path(args.script, run_name="__main__")
        print(f"trace digest: {tray.simtest.trace_digest()}")
        return 0
    parser.error(f"unknown command {args.command}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
