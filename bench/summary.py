"""The benchmarks' summary, generated from the results: the goals of
bench/README.md against the newest run in bench/results/ (a JSON record as
bench/run.py writes it), and the index of the measurement logs there.

    python bench/summary.py            # print the summary and the index
    python bench/summary.py --write    # put them into bench/README.md and docs/benchmarks.md
    python bench/summary.py --check    # exit 1 if either file is not what --write would make

Each file holds the generated text between two HTML comments,
``<!-- summary.py: NAME -->`` and ``<!-- summary.py: end NAME -->``, NAME
being ``summary`` (both files) or ``index`` (bench/README.md only: its links
point into bench/results/, which the documentation site does not hold)."""

from __future__ import annotations

import argparse
import json
import pathlib
import re
import sys
from dataclasses import dataclass

HERE = pathlib.Path(__file__).resolve().parent
RESULTS = HERE / "results"
README = HERE / "README.md"
DOCS_PAGE = HERE.parent / "docs" / "benchmarks.md"


@dataclass(frozen=True)
class Goal:
    """One goal of bench/README.md on one row of the table: tray's median
    divided by Ray's must reach ``at_least`` (``versus_ray``), or tray's
    median itself must be at least ``at_least`` or at most ``at_most``;
    ``per_row`` divides the row's median by another row's (p99 / p50)."""

    row: str
    target: str
    at_least: float | None = None
    at_most: float | None = None
    versus_ray: bool = False
    per_row: str = ""


GOALS = [
    *(Goal(row, "≥ 3x Ray", at_least=3, versus_ray=True) for row in (
        "single client tasks sync", "single client tasks async", "1:1 actor calls sync",
        "1:1 actor calls async", "n:n actor calls async", "1:1 async-actor calls sync",
        "1:1 async-actor calls async", "nested fan-out (tasks submitting tasks)")),
    *(Goal(row, "≥ 2x Ray", at_least=2, versus_ray=True) for row in (
        "single client get calls (Plasma Store)", "single client put calls (Plasma Store)")),
    *(Goal(row, "≥ Ray", at_least=1, versus_ray=True) for row in (
        "single client wait 1k refs", "single client get object containing 10k refs")),
    Goal("get 80 MB array across two nodes", "≥ 2 GB/s", at_least=2),
    Goal("init to first result", "≤ 0.3 s", at_most=0.3),
    Goal("task round trip latency, p99", "p99 ≤ 2x p50", at_most=2,
         per_row="task round trip latency, p50"),
    Goal("simulated tasks per wall-clock second", "≥ 20,000 tasks/s", at_least=20_000),
    Goal("simtest seeds per minute (mixed workload)", "≥ 2,000 seeds/min", at_least=2_000),
]


def newest_run(results: pathlib.Path = RESULTS) -> pathlib.Path:
    """The newest JSON record: run.py names them ``<date>-<time>.json``."""
    runs = sorted(results.glob("*.json"))
    if not runs:
        raise SystemExit(f"no run in {results} (bench/run.py writes one)")
    return runs[-1]


def _number(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


def _median(record: dict, row: str, runtime: str) -> float | None:
    [found] = [r for r in record["rows"] if r["name"] == row] or [None]
    cell = (found or {}).get("results", {}).get(runtime) or {}
    return cell.get("median")


def evaluate(goal: Goal, record: dict) -> tuple[str, str]:
    """What the run shows for ``goal``, and whether it is met (yes, no, or
    "not measured" when the run lacks a median the goal needs)."""
    tray = _median(record, goal.row, "tray")
    if goal.versus_ray:
        ray = _median(record, goal.row, "ray")
        if tray is None or not ray:
            return "not measured", "not measured"
        value = tray / ray
        met = value >= goal.at_least
        shown = f"{value:.2f}"
        if float(shown) >= goal.at_least and not met:  # 2.997 must not read as 3.00
            shown = f"{value:.3f}"
        return f"{shown}x ({_number(tray)} against {_number(ray)})", "yes" if met else "no"
    if goal.per_row:
        base = _median(record, goal.per_row, "tray")
        if tray is None or not base:
            return "not measured", "not measured"
        value = tray / base
        return (f"{value:.2f}x ({_number(tray)} / {_number(base)} ms)",
                "yes" if value <= goal.at_most else "no")
    if tray is None:
        return "not measured", "not measured"
    [row] = [r for r in record["rows"] if r["name"] == goal.row]
    met = tray >= goal.at_least if goal.at_least is not None else tray <= goal.at_most
    return f"{_number(tray)} {row['unit']}", "yes" if met else "no"


def summary(record: dict, name: str) -> str:
    """The goals table of one run, with a line saying which run it is."""
    versions = ", ".join(f"{runtime} {version}"
                         for runtime, version in record.get("versions", {}).items())
    lines = [f"Run `{name}` ({record['date']}; {versions}; {record['rounds']} rounds"
             + (f"; tray at {record['commit']}" if record.get("commit") else "") + "):",
             "", "| goal | target | this run | met |", "|---|---|---|---|"]
    for goal in GOALS:
        shown, met = evaluate(goal, record)
        lines.append(f"| {goal.row} | {goal.target} | {shown} | {met} |")
    met = sum(evaluate(goal, record)[1] == "yes" for goal in GOALS)
    lines += ["", f"{met} of {len(GOALS)} goals met."]
    return "\n".join(lines)


def index(results: pathlib.Path = RESULTS) -> str:
    """The measurement logs, newest first, each with its title."""
    lines = []
    for path in sorted(results.glob("*.md"), reverse=True):
        title = path.read_text().split("\n", 1)[0].lstrip("# ").strip()
        lines.append(f"* [{path.name}](results/{path.name}): {title}")
    return "\n".join(lines)


def _replace(text: str, name: str, body: str) -> str:
    begin, end = f"<!-- summary.py: {name} -->", f"<!-- summary.py: end {name} -->"
    pattern = re.compile(re.escape(begin) + r"\n.*?" + re.escape(end), re.S)
    if not pattern.search(text):
        raise SystemExit(f"no {begin} ... {end} in the file")
    return pattern.sub(lambda _: f"{begin}\n{body}\n{end}", text, count=1)


def generated(readme: str, docs_page: str, results: pathlib.Path = RESULTS) -> tuple[str, str]:
    """bench/README.md's and docs/benchmarks.md's text with their generated parts made anew."""
    run = newest_run(results)
    table = summary(json.loads(run.read_text()), run.name)
    readme = _replace(_replace(readme, "summary", table), "index", index(results))
    return readme, _replace(docs_page, "summary", table)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    action = parser.add_mutually_exclusive_group()
    action.add_argument("--write", action="store_true", help="update the two files")
    action.add_argument("--check", action="store_true", help="fail if they are stale")
    args = parser.parse_args(argv)
    readme, docs_page = README.read_text(), DOCS_PAGE.read_text()
    new_readme, new_docs_page = generated(readme, docs_page)
    if args.write:
        README.write_text(new_readme)
        DOCS_PAGE.write_text(new_docs_page)
    elif args.check:
        stale = [str(path) for path, old, new in ((README, readme, new_readme),
                                                   (DOCS_PAGE, docs_page, new_docs_page))
                 if old != new]
        if stale:
            print(f"stale: {', '.join(stale)}; run python bench/summary.py --write",
                  file=sys.stderr)
            return 1
    else:
        run = newest_run()
        print(summary(json.loads(run.read_text()), run.name))
        print()
        print(index())
    return 0


if __name__ == "__main__":
    sys.exit(main())
