"""Developer and CI entry points: `python3 -m nox -s tests` (the default), `simtest`, `bench`, `lint`.

Every session runs in its own virtualenv built from the interpreter that runs nox,
so the result does not depend on what happens to be installed globally.
"""

import os

import nox

nox.options.sessions = ["tests"]
nox.options.reuse_existing_virtualenvs = True


@nox.session
def tests(session: nox.Session) -> None:
    """Run the whole test suite in parallel."""
    session.install("-e", ".[test]")
    _install_chromium(session)
    _compile_tray(session)
    session.run("pytest", "-n", "auto", *session.posargs)


def _compile_tray(session: nox.Session) -> None:
    """Compile tray's modules once. An editable install ships no bytecode, and
    where PYTHONDONTWRITEBYTECODE is set every process the suite starts (each
    node, each fresh worker, each job's driver) compiled them again: measured,
    tests/test_tasks.py took 204 s of CPU without, 154 s with."""
    session.run("python", "-m", "compileall", "-q", "-j", "0", "tray")


def _install_chromium(session: nox.Session) -> None:
    """The dashboard's browser test drives Debian's chromium (never a browser
    downloaded at test time): install it when missing and we are root."""
    if os.path.exists("/usr/bin/chromium") or not hasattr(os, "geteuid") or \
            os.geteuid() != 0 or not os.path.exists("/usr/bin/apt-get"):
        return
    env = {"DEBIAN_FRONTEND": "noninteractive"}
    session.run("apt-get", "update", "-q", external=True, env=env)
    session.run("apt-get", "install", "-y", "-q", "chromium", external=True, env=env)


@nox.session
def simtest(session: nox.Session) -> None:
    """Run tray's seeded simulation suite; a failure prints the command that replays it.
    `-- --long` runs 10,000 seeds of every workload under the default and chaos
    profiles, on every CPU (hours to days: not in CI)."""
    session.install("-e", ".[test]")
    if "--long" not in session.posargs:
        session.run("python", "-m", "tray.simtest", *session.posargs)
        return
    names = session.run("python", "-c", "from tray.simtest import workloads; "
                        "print(' '.join(sorted(workloads.WORKLOADS)))", silent=True)
    jobs = str(os.cpu_count() or 1)
    for profile in ("default", "chaos"):
        for workload in names.split():
            session.run("python", "-m", "tray.simtest", "run", "--seeds", "0:10000",
                        "--workload", workload, "--faults", profile, "--jobs", jobs,
                        "--determinism-every", "100")


# Peers for `nox -s bench -- --peers ray,dask`, pinned so that runs compare: the newest
# releases that install on Python 3.11 from PyPI when this was written.
# RLlib's learner and Train's TorchTrainer need torch: the CPU wheel, pinned (another
# version pulls a CUDA build).
BENCH_PEERS = {"ray": ["ray[tune,data,rllib,train,serve]==2.60.0", "torch==2.13.0"],
               "dask": ["dask[distributed]==2026.8.0"]}


def _bench_peers(posargs: list[str]) -> list[str]:
    """The runtimes named by ``--peers a,b`` (or ``--peers=a,b``) in the posargs."""
    peers: list[str] = []
    for index, arg in enumerate(posargs):
        if arg == "--peers" and index + 1 < len(posargs):
            peers += posargs[index + 1].split(",")
        elif arg.startswith("--peers="):
            peers += arg.split("=", 1)[1].split(",")
    return [peer.strip() for peer in peers if peer.strip()]


@nox.session
def bench(session: nox.Session) -> None:
    """Run the benchmarks: tray alone, or side by side with `-- --peers ray,dask`
    (installed here); `-- --only NAME`, `--rounds N`, `--quick`. Results and a chart
    go to bench/results/."""
    session.install("-e", ".[bench,data,serve]")
    for peer in _bench_peers(session.posargs):
        if peer not in BENCH_PEERS:
            session.error(f"unknown peer {peer!r}; known: {', '.join(BENCH_PEERS)}")
        session.install(*BENCH_PEERS[peer])
    session.run("python", "bench/run.py", *session.posargs)


@nox.session
def lint(session: nox.Session) -> None:
    """Static checks with ruff."""
    session.install("ruff>=0.5")
    session.run("ruff", "check", "tray", "tests", *session.posargs)
