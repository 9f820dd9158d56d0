"""``tray simtest run`` / ``tray simtest replay`` and ``python -m tray.simtest``.

``run`` sweeps seeds in this process, one cluster after another, with a
progress bar on stderr, and ends with a summary: seeds run, failures,
virtual time simulated, seeds per minute. Each failure prints the invariant,
the seed, the fault schedule and the one command that replays it. A share
of the seeds (``--determinism-every``) runs twice and must give the same
digest. ``replay`` runs one seed and prints its digest, which equals the
digest ``run`` printed for it, in any process; ``--story ID`` prints what
happened to one task or object in it."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from . import faults as faults_module
from . import runner, workloads
from .stories import hex_of

DEFAULT_SEEDS = "0:200"
DEFAULT_WORKLOAD = "mixed"
DEFAULT_FAULTS = "default"


def _seed_range(text: str) -> range:
    try:
        if ":" in text:
            start, stop = (int(part) for part in text.split(":", 1))
        else:
            start, stop = 0, int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"seeds must look like START:STOP or COUNT, got {text!r}") from None
    if stop <= start:
        raise argparse.ArgumentTypeError(f"the seed range {text!r} is empty")
    return range(start, stop)


def _story_id(text: str) -> str:
    try:
        return hex_of(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _workload_list(text: str) -> list:
    """``--workload`` of ``run``: one name, a comma list, or ``all``."""
    names = sorted(workloads.WORKLOADS) if text == "all" else \
        [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in workloads.WORKLOADS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown workload {', '.join(unknown) if unknown else repr(text)}; choose from "
            f"{', '.join(sorted(workloads.WORKLOADS))}, a comma list of them, or all")
    return list(dict.fromkeys(names))


def add_arguments(parser: argparse.ArgumentParser, *, replay: bool) -> None:
    if replay:
        parser.add_argument("--workload", default=DEFAULT_WORKLOAD,
                            choices=sorted(workloads.WORKLOADS), help="the program to run")
    else:
        parser.add_argument("--workload", dest="workloads", type=_workload_list,
                            default=[DEFAULT_WORKLOAD], metavar="W[,W...]|all",
                            help="the program to run; a comma list (or all) sweeps each "
                                 "in turn, the same seeds")
    parser.add_argument("--faults", default=DEFAULT_FAULTS,
                        choices=sorted(faults_module.PROFILES), help="the fault profile")
    if replay:
        parser.add_argument("--seed", type=int, required=True, help="the seed to replay")
        parser.add_argument("--trace", metavar="PATH",
                            help="write the run's event trace here as JSON lines")
        parser.add_argument("--timeline", metavar="PATH",
                            help="write the run's timeline here as a Chrome trace (Perfetto, "
                                 "chrome://tracing): tasks per worker per node in virtual "
                                 "time, every injected fault, the failing invariant")
        parser.add_argument("--story", metavar="ID", action="append", default=[],
                            type=_story_id,
                            help="after the run, print the story of this task or object "
                                 "(its hex id or a prefix of one): every event of the trace "
                                 "that names it (repeatable)")
    else:
        parser.add_argument("--seeds", type=_seed_range, default=_seed_range(DEFAULT_SEEDS),
                            help=f"START:STOP or COUNT (default {DEFAULT_SEEDS})")
        parser.add_argument("--json", action="store_true",
                            help="print one JSON object with the results instead of text")
        parser.add_argument("--determinism-every", type=int, default=10, metavar="N",
                            help="re-run every Nth seed in-process and compare digests "
                                 "(0: never; default 10)")
        parser.add_argument("--jobs", type=int, default=1, metavar="N",
                            help="run seeds in N processes at once (default 1); results "
                                 "are the same as in one process, failures print as "
                                 "their chunk of seeds finishes")
        parser.add_argument("--max-failures", type=int, default=0, metavar="N",
                            help="stop after N failures (0: run every seed)")
        parser.add_argument("--coverage", action="store_true",
                            help="measure the lines and branches of tray the sweep reaches "
                                 "(coverage.py) and print them per component, with the goals")
        add_report_arguments(parser, prefix="--coverage-")
        parser.add_argument("--coverage-data", metavar="FILE",
                            help="with --coverage: add what this run measured to FILE (a "
                                 "coverage.py data file; runs append to it: "
                                 "`tray simtest coverage FILE` reports their union)")


def add_report_arguments(parser: argparse.ArgumentParser, *, prefix: str) -> None:
    parser.add_argument(f"{prefix}missing", dest="coverage_missing", action="store_true",
                        help="list what the files under their goal missed: functions "
                             "never run or run in part, lines, branches")
    parser.add_argument(f"{prefix}html", dest="coverage_html", metavar="DIR",
                        help="write coverage.py's HTML report (every file of tray) to DIR")


# ====================================================================== run


class _Progress:
    """A one-line progress bar on stderr (a plain line every 10% when
    stderr is not a terminal)."""

    def __init__(self, total: int, enabled: bool) -> None:
        self.total = total
        self.enabled = enabled
        self.tty = sys.stderr.isatty()
        self.started = time.perf_counter()
        self._last_decile = -1

    def update(self, done: int, failures: int) -> None:
        if not self.enabled:
            return
        elapsed = time.perf_counter() - self.started
        rate = done / elapsed * 60 if elapsed > 0 else 0.0
        if self.tty:
            width = 30
            filled = int(width * done / self.total)
            bar = "#" * filled + "-" * (width - filled)
            sys.stderr.write(f"\r[{bar}] {done}/{self.total} seeds, {failures} failed, "
                             f"{rate:.0f} seeds/min ")
            if done == self.total:
                sys.stderr.write("\n")
            sys.stderr.flush()
            return
        decile = done * 10 // self.total
        if decile != self._last_decile:
            self._last_decile = decile
            print(f"simtest: {done}/{self.total} seeds, {failures} failed, {rate:.0f} seeds/min",
                  file=sys.stderr, flush=True)


def _run_checked(seed: int, workload: str, faults: str,
                 determinism_every: int) -> runner.SeedResult:
    """One seed, re-run in this process every ``determinism_every`` seeds
    to compare digests."""
    result = runner.run_seed(seed, workload, faults)
    if determinism_every and seed % determinism_every == 0:
        again = runner.run_seed(seed, workload, faults)
        if again.digest != result.digest:
            result.ok = False
            result.invariant = "determinism"
            result.message = (f"the same seed gave two digests in one process: "
                              f"{result.digest} then {again.digest}")
    return result


def _run_chunk(seeds: list, workload: str, faults: str,
               determinism_every: int, coverage: bool = False) -> list:
    """A ``--jobs`` worker's share (in a process of its own); with
    ``coverage``, what the process measured is saved after it."""
    results = [_run_checked(seed, workload, faults, determinism_every) for seed in seeds]
    if coverage:
        from . import coverage as coverage_module

        coverage_module.save_worker()
    return results


# Seeds per unit of work handed to a --jobs process: small enough that the
# progress and failures show early, big enough that starting a unit is cheap.
JOB_CHUNK_SEEDS = 5


def _results(seeds: list, workload: str, faults: str, determinism_every: int, jobs: int,
             coverage=None):
    """Yield each seed's result: in order in this process, or as chunks
    finish in ``jobs`` processes (fresh interpreters: a simulation patches
    process-wide state, which a forked copy must not inherit mid-run).
    ``coverage`` (a ``coverage.Session``) measures whichever runs the seeds."""
    if jobs <= 1:
        if coverage is not None:
            coverage.start()
        try:
            for seed in seeds:
                yield _run_checked(seed, workload, faults, determinism_every)
        finally:
            if coverage is not None:
                coverage.stop()
        return
    import concurrent.futures
    import multiprocessing

    chunks = [seeds[i:i + JOB_CHUNK_SEEDS] for i in range(0, len(seeds), JOB_CHUNK_SEEDS)]
    options = coverage.pool_options() if coverage is not None else {}
    with concurrent.futures.ProcessPoolExecutor(
            jobs, mp_context=multiprocessing.get_context("spawn"), **options) as pool:
        futures = [pool.submit(_run_chunk, chunk, workload, faults, determinism_every,
                               coverage is not None)
                   for chunk in chunks]
        try:
            for future in concurrent.futures.as_completed(futures):
                yield from future.result()
        finally:
            for future in futures:
                future.cancel()


def sweep(seeds, workload: str, faults: str, *, determinism_every: int = 10,
          max_failures: int = 0, progress: bool = False, on_failure=None,
          jobs: int = 1, coverage=None) -> dict:
    """Run ``seeds``; returns the summary (the JSON ``run --json`` prints).
    ``coverage``: a ``tray.simtest.coverage.Session`` that measures the sweep."""
    if jobs < 1:
        raise ValueError(f"jobs must be at least 1, not {jobs}")
    seeds = list(seeds)
    bar = _Progress(len(seeds), progress)
    started = time.perf_counter()
    failures, digests, virtual_s, tasks, ran = [], {}, 0.0, 0, 0
    nondeterministic = []
    results = _results(seeds, workload, faults, determinism_every, jobs, coverage)
    try:
        for result in results:
            ran += 1
            digests[str(result.seed)] = result.digest
            virtual_s += result.virtual_time_s
            tasks += result.tasks
            if result.invariant == "determinism":
                nondeterministic.append(result.seed)
            if not result.ok:
                failures.append(result)
                if on_failure is not None:
                    on_failure(result)
            bar.update(ran, len(failures))
            if max_failures and len(failures) >= max_failures:
                break
    finally:
        results.close()  # (this process stops measuring at once)
    failures.sort(key=lambda result: result.seed)
    nondeterministic.sort()
    wall_s = time.perf_counter() - started
    return {
        "seeds": ran, "workload": workload, "faults": faults,
        "failures": [f.failure_dict() for f in failures],
        "digests": digests,
        "virtual_time_s": round(virtual_s, 3),
        "wall_s": round(wall_s, 3),
        "seeds_per_minute": round(ran / wall_s * 60, 1) if wall_s > 0 else 0.0,
        "tasks": tasks,
        "tasks_per_second": round(tasks / wall_s, 1) if wall_s > 0 else 0.0,
        "determinism_checked": sum(1 for s in digests
                                   if determinism_every and int(s) % determinism_every == 0),
        "nondeterministic_seeds": nondeterministic,
    }


def run(args) -> int:
    def show(result: runner.SeedResult) -> None:
        if not args.json:
            sys.stderr.write("\n" if sys.stderr.isatty() else "")
            print(result.report(), flush=True)

    session = None
    if args.coverage:
        from . import coverage as coverage_module

        session = coverage_module.Session(args.coverage_data)
    elif args.coverage_data or args.coverage_missing or args.coverage_html:
        raise SystemExit("tray simtest run: --coverage-data, --coverage-missing and "
                         "--coverage-html go with --coverage")
    summaries, failed = [], 0
    try:
        for workload in args.workloads:
            left = args.max_failures - failed if args.max_failures else 0
            if args.max_failures and left <= 0:
                break
            summary = sweep(args.seeds, workload, args.faults,
                            determinism_every=args.determinism_every, max_failures=left,
                            progress=not args.json, on_failure=show, jobs=args.jobs,
                            coverage=session)
            failed += len(summary["failures"])
            summaries.append(summary)
            if not args.json:
                _print_summary(summary)
        measured = _coverage_output(session, args) if session is not None else None
    finally:
        if session is not None:
            session.close()
    if args.json:
        out = summaries[0] if len(summaries) == 1 else {
            "sweeps": summaries, "failures": [f for s in summaries for f in s["failures"]]}
        if measured is not None:
            out = {**out, "coverage": measured}
        print(json.dumps(out, sort_keys=True))
    return 1 if failed else 0


def _print_summary(summary: dict) -> None:
    print(f"simtest: {summary['seeds']} seeds (workload {summary['workload']}, faults "
          f"{summary['faults']}), {len(summary['failures'])} failed; "
          f"{summary['virtual_time_s']:.1f} s of virtual time simulated in "
          f"{summary['wall_s']:.1f} s; {summary['seeds_per_minute']:.0f} seeds/min, "
          f"{summary['tasks_per_second']:.0f} simulated tasks/s; "
          f"{summary['determinism_checked']} seeds re-run for determinism", flush=True)


def _coverage_output(session, args) -> dict:
    """Combine what the sweeps measured; print the table (or return it for --json)."""
    from . import coverage as coverage_module

    data_file = session.finish()
    result = coverage_module.report(data_file)
    if args.coverage_html:
        where = coverage_module.html(data_file, args.coverage_html)
        print(f"coverage: HTML report written to {where}", file=sys.stderr)
    if args.coverage_data:
        print(f"coverage: data added to {args.coverage_data} (tray simtest coverage "
              f"{args.coverage_data} reports everything it holds)", file=sys.stderr)
    if not args.json:
        print(coverage_module.format_table(result, missing=args.coverage_missing))
    return coverage_module.summary_dict(result)


def coverage_report(args) -> int:
    """``tray simtest coverage FILE [FILE...]``: the table of what the runs
    that wrote FILE (``run --coverage --coverage-data FILE``) reached, together."""
    import tempfile

    from . import coverage as coverage_module

    missing = [path for path in args.files if not os.path.exists(path)]
    if missing:
        raise SystemExit(f"tray simtest coverage: no data file {', '.join(missing)}")
    with tempfile.TemporaryDirectory() as folder:
        data_file = args.files[0] if len(args.files) == 1 else \
            coverage_module.combine_files(args.files, os.path.join(folder, "union"))
        result = coverage_module.report(data_file)
        if args.coverage_html:
            where = coverage_module.html(data_file, args.coverage_html)
            print(f"coverage: HTML report written to {where}", file=sys.stderr)
    if args.json:
        print(json.dumps(result, sort_keys=True))
    else:
        print(coverage_module.format_table(result, missing=args.coverage_missing))
    return 0


def add_coverage_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("files", nargs="+", metavar="FILE",
                        help="coverage data files (run --coverage --coverage-data FILE); "
                             "several are reported together")
    parser.add_argument("--json", action="store_true",
                        help="print the numbers per file and group as JSON (missed lines, "
                             "branches and functions included)")
    add_report_arguments(parser, prefix="--")


def replay(args) -> int:
    timeline = getattr(args, "timeline", None)
    trace_path = args.trace
    scratch = None
    if timeline and not trace_path:
        import tempfile

        scratch = tempfile.NamedTemporaryFile(suffix=".jsonl", delete=False)
        scratch.close()
        trace_path = scratch.name
    try:
        result = runner.run_seed(args.seed, args.workload, args.faults, trace_path=trace_path)
        if timeline:
            _write_timeline(trace_path, timeline, result)
    finally:
        if scratch is not None:
            os.unlink(scratch.name)
    if result.ok:
        print(f"seed {args.seed} passed (workload {args.workload}, faults {args.faults}); "
              f"fault schedule: {'; '.join(result.schedule) or '(no faults)'}")
    else:
        print(result.report())
    if args.trace:
        print(f"trace written to {args.trace}")
    if timeline:
        print(f"timeline written to {timeline} (open it in https://ui.perfetto.dev)")
    for what in getattr(args, "story", []):
        _print_story(what)
    print(f"trace digest: {result.digest}")
    return 0 if result.ok else 1


def _print_story(what: str) -> None:
    """The story of one task or object of the run that just ended."""
    from . import story
    from .stories import format_story

    told = story(what)
    print(f"the story of {what} ({len(told)} events):")
    for line in format_story(told) or ["(no event of the trace names it)"]:
        print("    " + line)


def _write_timeline(trace_path: str, timeline_path: str, result) -> None:
    """The seed's timeline from its trace: faults as instants, the broken
    invariant marked (see ``tray/_timeline.py``)."""
    from .._timeline import write_sim_timeline

    if not os.path.exists(trace_path):
        return  # the run broke before it had a trace
    with open(trace_path, encoding="utf-8") as lines:
        trace = [json.loads(line) for line in lines if line.strip()]
    write_sim_timeline(trace, timeline_path, invariant=result.invariant,
                       message=result.message, seed=result.seed)


def add_parsers(commands) -> None:
    """The ``simtest`` subcommand of the ``tray`` CLI."""
    simtest = commands.add_parser("simtest", help="seeded fault-injection sweeps and replay "
                                                  "on the simulated cluster")
    sub = simtest.add_subparsers(dest="simtest_command", required=True)
    run_parser = sub.add_parser("run", help="sweep seeds; print failures and a summary")
    add_arguments(run_parser, replay=False)
    replay_parser = sub.add_parser("replay", help="re-run one seed; print its trace digest")
    add_arguments(replay_parser, replay=True)
    coverage_parser = sub.add_parser("coverage", help="report the coverage that runs with "
                                                      "--coverage-data FILE gathered")
    add_coverage_arguments(coverage_parser)


def dispatch(args) -> int:
    return {"run": run, "replay": replay,
            "coverage": coverage_report}[args.simtest_command](args)


def main(argv: list[str] | None = None) -> int:
    """``python -m tray.simtest`` (what ``nox -s simtest`` runs): no
    arguments run the default sweep; ``--seed N`` replays one seed;
    ``coverage FILE`` reports coverage data; anything else is ``tray simtest
    run``'s options."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] in (["run"], ["replay"], ["coverage"]):
        command, argv = argv[0], argv[1:]
    else:
        command = "replay" if any(a == "--seed" or a.startswith("--seed=") for a in argv) \
            else "run"
    parser = argparse.ArgumentParser(prog=f"python -m tray.simtest {command}")
    if command == "coverage":
        add_coverage_arguments(parser)
    else:
        add_arguments(parser, replay=command == "replay")
    args = parser.parse_args(argv)
    return {"run": run, "replay": replay, "coverage": coverage_report}[command](args)
