"""The ``tray`` command line, on click (as Ray's ``ray`` command).

The top-level group gathers commands from their own modules: ``start``,
``stop`` and ``status`` (``cluster.py``), the state commands ``list``,
``summary``, ``get``, ``memory``, ``logs`` and ``timeline``
(``state_cli.py``), ``job`` (``job_cli.py``, when it exists), ``dashboard``
(``dashboard_cli.py``). ``simtest`` and
``serve`` keep their argparse trees (``tray/simtest/cli.py`` and
``tray/serve/_cli.py``, which ``python -m tray.simtest`` and the tests use
directly): click hands them the rest of the command line untouched, so their
options and ``--help`` are exactly what they were.

``main(argv)`` returns the exit status instead of exiting, so that tests can
call it in-process."""

from __future__ import annotations

import argparse
import importlib
import runpy
import sys

import click

# Arguments click must not parse: they belong to an argparse tree or a script.
_PASS_THROUGH = {"ignore_unknown_options": True, "allow_extra_args": True,
                 "allow_interspersed_args": False, "help_option_names": []}


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def cli() -> None:
    """tray: tasks and actors, real or simulated."""


@cli.command()
def version() -> int:
    """Print tray's version."""
    import tray

    click.echo(tray.__version__)
    return 0


@cli.command(context_settings=_PASS_THROUGH)
@click.argument("script", type=click.Path(dir_okay=False))
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def sim(script: str, args: tuple[str, ...]) -> int:
    """Run a Python script whose tray.init() uses the simulated backend, and
    print the run's trace digest."""
    import tray.simtest

    sys.argv = [script, *args]
    runpy.run_path(script, run_name="__main__")
    click.echo(f"trace digest: {tray.simtest.trace_digest()}")
    return 0


def _argparse_subtree(name: str, module_name: str, help_text: str) -> click.Command:
    """A click command that hands its arguments to the argparse subtree that
    ``module_name``'s ``add_parsers``/``dispatch`` define."""

    @click.command(name=name, help=help_text, context_settings=_PASS_THROUGH,
                   add_help_option=False)
    @click.argument("args", nargs=-1, type=click.UNPROCESSED)
    def command(args: tuple[str, ...]) -> int:
        module = importlib.import_module(module_name, __package__)
        parser = argparse.ArgumentParser(prog="tray")
        module.add_parsers(parser.add_subparsers(dest="command", required=True))
        return module.dispatch(parser.parse_args([name, *args]))

    return command


cli.add_command(_argparse_subtree(
    "simtest", "..simtest.cli",
    "Seeded fault-injection sweeps and replay on the simulated cluster (tray simtest "
    "--help)."))
cli.add_command(_argparse_subtree(
    "serve", "..serve._cli", "Run and manage tray.serve applications (tray serve --help)."))


def _add_commands() -> None:
    from . import cluster

    for command in (cluster.start, cluster.stop, cluster.status):
        cli.add_command(command)
    # Optional command modules: each exposes click commands named in the
    # tuple; a module not (yet) in the tree adds nothing.
    for module_name, names in ((".state_cli", ("list_", "summary", "get", "memory", "logs",
                                                "timeline")),
                               (".job_cli", ("job",)), (".dashboard_cli", ("dashboard",))):
        try:
            module = importlib.import_module(module_name, __package__)
        except ModuleNotFoundError as error:
            if error.name != f"{__package__}{module_name}":
                raise
            continue
        for attribute in names:
            command = getattr(module, attribute, None)
            if isinstance(command, click.Command):
                cli.add_command(command)


_add_commands()


def main(argv: list[str] | None = None) -> int:
    """Run the ``tray`` command line on ``argv`` (default: ``sys.argv[1:]``)
    and return its exit status."""
    try:
        result = cli.main(args=argv, prog_name="tray", standalone_mode=False)
    except click.ClickException as error:
        error.show()
        return error.exit_code
    except click.Abort:
        click.echo("Aborted!", err=True)
        return 1
    return result if isinstance(result, int) else 0


if __name__ == "__main__":
    sys.exit(main())
