"""Developer and CI entry points: `python3 -m nox -s tests` (the default), `simtest`, `bench`, `lint`.

Every session runs in its own virtualenv built from the interpreter that runs nox,
so the result does not depend on what happens to be installed globally.
"""

import nox

nox.options.sessions = ["tests"]
nox.options.reuse_existing_virtualenvs = True


@nox.session
def tests(session: nox.Session) -> None:
    """Run the whole test suite in parallel."""
    session.install("-e", ".[test]")
    session.run("pytest", "-n", "auto", *session.posargs)


@nox.session
def simtest(session: nox.Session) -> None:
    """Run tray's seeded simulation suite; a failure prints the command that replays it."""
    session.install("-e", ".[test]")
    session.run("python", "-m", "tray.simtest", *session.posargs)


@nox.session
def bench(session: nox.Session) -> None:
    """Run the benchmarks (results go to bench/results/)."""
    session.install("-e", ".[test,bench]")
    session.run("python", "bench/run.py", *session.posargs)


@nox.session
def lint(session: nox.Session) -> None:
    """Static checks with ruff."""
    session.install("ruff>=0.5")
    session.run("ruff", "check", "tray", "tests", *session.posargs)
