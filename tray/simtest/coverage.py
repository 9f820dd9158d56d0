"""Coverage as a simtest output: which lines and branches of tray a sweep
reached (``tray simtest run ... --coverage``, ``tray simtest coverage FILE``).

coverage.py measures every process of a sweep (``branch=True``, the package
``tray``): the sweep's own process when it runs the seeds, or each
``--jobs`` process, each writing a data file of its own; ``Session.finish``
combines them, and appends to ``--coverage-data FILE`` when one is named, so
that several runs (one per workload, say) add up to the union of their
sweeps. ``report`` reads a data file into per-file numbers grouped by
component, with the goals of issue 37: ``tray/core`` at least 90% of its
lines and 80% of its branches, each library's control loop at least 85% of
its lines.

A process imports tray before it can start measuring (``python -m
tray.simtest`` imports the package to find its ``__main__``; a ``--jobs``
process imports this module to start), so the lines a module runs when it
is imported (its ``def`` and ``class`` statements, its constants) ran
unmeasured. ``finish`` measures them in a fresh interpreter that imports the
same modules under coverage, and adds them: import-time code is the same in
any process. Modules the sweep imported only later (lazily) were measured as
they were imported; a module no seed imported counts nothing.

Measuring observes the simulation and changes none of it: a seed's digest is
the same with and without ``--coverage`` (tests/test_simtest_coverage.py).
Coverage is a test dependency (``pip install 'tray[simtest]'``)."""

from __future__ import annotations

import fnmatch
import glob
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile

import tray

# The package's parent directory: file names in the report are relative to it
# ("tray/core/rpc.py"), wherever tray is installed.
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(tray.__file__)))

CORE = "tray/core"
CORE_LINE_GOAL = 90.0
CORE_BRANCH_GOAL = 80.0
LOOP_LINE_GOAL = 85.0
# The libraries' control loops (issue 37): name, file patterns. A file may
# match one group only; what no group names is summed per package below.
CONTROL_LOOPS = (
    ("Tune controller", ("tray/tune/_controller.py", "tray/tune/_runner.py")),
    ("Serve controller", ("tray/serve/_controller.py", "tray/serve/_*_state.py")),
    ("Data executor", ("tray/data/_executor.py",)),
    ("Train worker group", ("tray/train/_worker_group.py",)),
    ("Autoscaler policy", ("tray/autoscaler/policy.py", "tray/autoscaler/monitor.py")),
)

# Core files of the driver's thread path: user threads handing work to a
# loop in a thread of its own, as the local backend's driver runs. The
# simulator takes it in the seeds that draw it (about half:
# runner.driver_thread_path); the table also shows the core's total without
# these files, which a sweep of few seeds may reach little.
REAL_BACKEND_ONLY = ("tray/core/worker/thread_inbox.py", "tray/core/worker/thread_waits.py")

_DATA_NAME = "simtest"  # data files in a session's folder: simtest.<suffix>


def available() -> bool:
    return importlib.util.find_spec("coverage") is not None


def require() -> None:
    """Raise a SystemExit that says how to install coverage.py if it is missing."""
    if not available():
        raise SystemExit("tray simtest: --coverage needs coverage.py (pip install 'coverage>=7', "
                         "or pip install 'tray[simtest]')")


def _coverage(data_file: str | None, suffix: bool | str | None = None):
    import coverage

    concurrency = ["thread"]
    if importlib.util.find_spec("greenlet") is not None:
        # greenback switches greenlets under a blocking call in a task:
        # coverage must follow them, or it pins lines to the wrong frames.
        concurrency.insert(0, "greenlet")
    measuring = coverage.Coverage(data_file=data_file, data_suffix=suffix, branch=True,
                                  source_pkgs=["tray"], concurrency=concurrency,
                                  config_file=False, messages=False)
    # Expected here: tray was imported before measuring (its import-time
    # lines come from the import pass); a --jobs process that ran no seed.
    measuring.set_option("run:disable_warnings", ["module-not-measured", "no-data-collected"])
    return measuring


def _tray_modules() -> list[str]:
    """The tray modules this process has imported (from files)."""
    return sorted(name for name, module in list(sys.modules.items())
                  if (name == "tray" or name.startswith("tray."))
                  and getattr(module, "__file__", None))


def _save_imported(folder: str, names) -> None:
    path = os.path.join(folder, f"imported.{os.getpid()}.json")
    with open(path, "w", encoding="utf-8") as out:
        json.dump(sorted(names), out)


class Session:
    """The coverage of one ``run --coverage``: every sweep it runs, in this
    process (``start``/``stop``) or in ``--jobs`` processes (``pool_options``),
    combined by ``finish`` into one data file."""

    def __init__(self, data_file: str | None = None) -> None:
        require()
        self.folder = tempfile.mkdtemp(prefix="tray-simtest-coverage-")
        self.data_file = os.path.abspath(data_file) if data_file else None
        self._measuring = None

    # ------------------------------------------------------------ this process

    def start(self) -> None:
        """Measure this process (the seeds run here) until ``stop``."""
        _save_imported(self.folder, _tray_modules())
        self._measuring = _coverage(os.path.join(self.folder, _DATA_NAME), True)
        self._measuring.start()

    def stop(self) -> None:
        if self._measuring is not None:
            self._measuring.stop()
            self._measuring.save()
            self._measuring = None

    # ----------------------------------------------------------- --jobs processes

    def pool_options(self) -> dict:
        """``ProcessPoolExecutor`` arguments that measure each of its processes;
        a process's unit of work ends with ``save_worker()``."""
        return {"initializer": start_worker, "initargs": (self.folder,)}

    # ------------------------------------------------------------------ the end

    def finish(self) -> str:
        """Combine what every process measured, with the import-time lines of
        the modules they imported before measuring; return the data file
        (``data_file``, appended to, or one in the session's folder)."""
        self.stop()
        imported: set = set()
        for path in glob.glob(os.path.join(self.folder, "imported.*.json")):
            with open(path, encoding="utf-8") as lines:
                imported.update(json.load(lines))
        if imported:
            _measure_imports(sorted(imported), os.path.join(self.folder, f"{_DATA_NAME}.imports"))
        target = self.data_file or os.path.join(self.folder, "combined")
        combined = _coverage(target)
        if os.path.exists(target):
            combined.load()
        parts = sorted(glob.glob(os.path.join(self.folder, f"{_DATA_NAME}.*")))
        if parts:
            combined.combine(parts, keep=True)
        combined.save()
        return target

    def close(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)


_worker = {"coverage": None}


def start_worker(folder: str) -> None:
    """A ``--jobs`` process's initializer: measure this process."""
    _save_imported(folder, _tray_modules())
    measuring = _coverage(os.path.join(folder, _DATA_NAME), True)
    measuring.start()
    _worker["coverage"] = measuring


def save_worker() -> None:
    """Write what this ``--jobs`` process measured so far (after each unit of
    work: a pool's processes end without running exit handlers)."""
    if _worker["coverage"] is not None:
        _worker["coverage"].save()


_IMPORT_PASS = """\
import importlib, sys
import coverage
cov = coverage.Coverage(data_file=sys.argv[1], branch=True, source_pkgs=["tray"],
                        config_file=False, messages=False)
cov.set_option("run:disable_warnings", ["module-not-measured"])
cov.start()
for name in sys.argv[2:]:
    try:
        importlib.import_module(name)
    except BaseException:
        pass
cov.stop()
cov.save()
"""


def _measure_imports(modules: list[str], data_file: str) -> None:
    """The lines ``modules`` run when imported, measured in a fresh interpreter."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([_ROOT, *filter(None, [env.get("PYTHONPATH")])])
    subprocess.run([sys.executable, "-c", _IMPORT_PASS, data_file, *modules], env=env,
                   check=True, stdout=subprocess.DEVNULL, cwd=_ROOT)


# ================================================================ the report


def combine_files(paths: list[str], target: str) -> str:
    """Union of several data files (``tray simtest coverage A B``) into ``target``."""
    require()
    combined = _coverage(target)
    combined.combine([os.path.abspath(path) for path in paths], keep=True)
    combined.save()
    return target


def _relative(name: str) -> str:
    return os.path.relpath(os.path.abspath(os.path.join(_ROOT, name) if not os.path.isabs(name)
                                           else name), _ROOT).replace(os.sep, "/")


def _file_numbers(entry: dict) -> dict:
    summary = entry["summary"]
    functions = []
    for name, function in entry.get("functions", {}).items():
        if not name:
            continue  # module level
        numbers = function["summary"]
        functions.append({"name": name, "line": function.get("start_line", 0),
                          "statements": numbers["num_statements"],
                          "missed": numbers["missing_lines"],
                          "branches": numbers["num_branches"],
                          "missed_branches": numbers["missing_branches"]})
    return {"lines": summary["num_statements"], "lines_hit": summary["covered_lines"],
            "branches": summary["num_branches"], "branches_hit": summary["covered_branches"],
            "missing_lines": entry["missing_lines"],
            "missing_branches": entry.get("missing_branches", []),
            "functions": functions}


def _group_of(path: str) -> str:
    if path.startswith(CORE + "/"):
        return CORE
    for name, patterns in CONTROL_LOOPS:
        if any(fnmatch.fnmatch(path, pattern) for pattern in patterns):
            return name
    parts = path.split("/")
    if parts[:2] == ["tray", "backends"] and len(parts) > 3:
        return "/".join(parts[:3])  # the simulator apart from the real backend
    return "/".join(parts[:2]) if len(parts) > 2 else "tray"


def _percent(hit: int, total: int) -> float:
    return 100.0 * hit / total if total else 100.0


def report(data_file: str, *, rest: bool = True) -> dict:
    """Per-file and per-component coverage of ``data_file``, with the goals;
    ``rest=False`` leaves out the files no goal covers (a few seconds less:
    coverage.py parses every file it reports)."""
    require()
    measured = _coverage(data_file)
    measured.load()
    include = None
    if not rest:
        include = [os.path.join(_ROOT, CORE, "*")] + [
            os.path.join(_ROOT, pattern) for _, patterns in CONTROL_LOOPS for pattern in patterns]
    handle, scratch = tempfile.mkstemp(suffix=".json")
    os.close(handle)
    try:
        measured.json_report(outfile=scratch, ignore_errors=True, include=include)
        with open(scratch, encoding="utf-8") as text:
            raw = json.load(text)
    finally:
        os.unlink(scratch)
    files = {}
    for name, entry in raw["files"].items():
        path = _relative(name)
        if path.startswith("tray/"):
            files[path] = _file_numbers(entry)
    groups = {}
    for path in sorted(files):
        groups.setdefault(_group_of(path), []).append(path)
    summaries = []
    order = [CORE] + [name for name, _ in CONTROL_LOOPS]
    others = sorted(name for name in groups if name not in order)
    for name in order + others:
        members = groups.get(name, [])
        lines = sum(files[p]["lines"] for p in members)
        lines_hit = sum(files[p]["lines_hit"] for p in members)
        branches = sum(files[p]["branches"] for p in members)
        branches_hit = sum(files[p]["branches_hit"] for p in members)
        group = {"name": name, "files": members, "lines": lines, "lines_hit": lines_hit,
                 "branches": branches, "branches_hit": branches_hit,
                 "line_percent": round(_percent(lines_hit, lines), 1),
                 "branch_percent": round(_percent(branches_hit, branches), 1),
                 "goal": None, "met": None}
        if name == CORE:
            group["goal"] = {"lines": CORE_LINE_GOAL, "branches": CORE_BRANCH_GOAL}
            simulated = [p for p in members if p not in REAL_BACKEND_ONLY]
            group["simulated"] = {kind: sum(files[p][kind] for p in simulated) for kind in
                                  ("lines", "lines_hit", "branches", "branches_hit")}
        elif name in order:
            group["goal"] = {"lines": LOOP_LINE_GOAL}
        if group["goal"] is not None:
            group["met"] = bool(members) and all(
                _percent(group[f"{kind}_hit"], group[kind]) >= goal
                for kind, goal in group["goal"].items())
        summaries.append(group)
    goals = [g for g in summaries if g["goal"] is not None]
    return {"files": files, "groups": summaries,
            "goals_met": sum(1 for g in goals if g["met"]), "goals": len(goals)}


def _cell(hit: int, total: int) -> str:
    if not total:
        return f"{'-':>17}"
    return f"{hit:>5}/{total:<5} {_percent(hit, total):5.1f}%"


def _row(label: str, numbers: dict, width: int) -> str:
    """A row: lines, branches, and both together (coverage.py's "Cover")."""
    both = _percent(numbers["lines_hit"] + numbers["branches_hit"],
                    numbers["lines"] + numbers["branches"])
    return (f"  {label:<{width - 2}} {_cell(numbers['lines_hit'], numbers['lines'])}"
            f"  {_cell(numbers['branches_hit'], numbers['branches'])}  {both:5.1f}%")


def _goal_text(group: dict) -> str:
    goal = group["goal"]
    wanted = ", ".join(f"{kind} >= {value:.0f}%" for kind, value in goal.items())
    return f"goal {wanted}: {'met' if group['met'] else 'NOT MET'}"


def format_table(result: dict, *, missing: bool = False) -> str:
    """The coverage table (and with ``missing`` what each goal file missed)."""
    width = 48
    lines = ["coverage (coverage.py, branch=True, package tray): lines and branches reached",
             f"{'component / file':<{width}} {'lines':>17}  {'branches':>17}  {'both':>6}"]
    files = result["files"]
    for group in result["groups"]:
        if group["goal"] is None:
            continue
        lines.append(f"{group['name']}")
        prefix = CORE + "/" if group["name"] == CORE else ""
        for path in group["files"]:
            if files[path]["lines"] or files[path]["branches"]:  # (not an empty __init__)
                lines.append(_row(path[len(prefix):], files[path], width))
        lines.append(_row("total", group, width) + f"  {_goal_text(group)}")
        if "simulated" in group:
            # (what the simulator can reach: REAL_BACKEND_ONLY left out)
            lines.append(_row("total without thread_inbox, thread_waits", group["simulated"],
                              width) + "  (the driver's thread path)")
    rest = [group for group in result["groups"] if group["goal"] is None]
    if rest:
        lines.append("the rest of tray (no goal), per package")
    for group in rest:
        lines.append(_row(group["name"], group, width))
    lines.append(f"goals met: {result['goals_met']} of {result['goals']}")
    if missing:
        lines.extend(format_missing(result))
    return "\n".join(lines)


def _ranges(numbers: list[int]) -> str:
    spans, start, last = [], None, None
    for number in sorted(numbers):
        if start is None:
            start = last = number
        elif number == last + 1:
            last = number
        else:
            spans.append((start, last))
            start = last = number
    if start is not None:
        spans.append((start, last))
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


def format_missing(result: dict) -> list[str]:
    """For each file of a goal group below its goal: the functions never run,
    those run in part, and the lines and branches missed."""
    lines = ["", "missed, in the files under their goal (functions never run; run in part; "
                 "lines; branches as line->line, -N: leaving the function of line N)"]
    files = result["files"]
    for group in result["groups"]:
        if group["goal"] is None:
            continue
        line_goal = group["goal"]["lines"]
        branch_goal = group["goal"].get("branches", 0.0)
        for path in group["files"]:
            numbers = files[path]
            if (_percent(numbers["lines_hit"], numbers["lines"]) >= line_goal
                    and _percent(numbers["branches_hit"], numbers["branches"]) >= branch_goal):
                continue
            lines.append(f"{path}: {numbers['lines'] - numbers['lines_hit']} lines, "
                         f"{numbers['branches'] - numbers['branches_hit']} branches missed")
            never = [f for f in numbers["functions"]
                     if f["statements"] and f["missed"] == f["statements"]]
            part = sorted((f for f in numbers["functions"] if 0 < f["missed"] < f["statements"]
                           or (f["missed_branches"] and f["missed"] < f["statements"])),
                          key=lambda f: (-f["missed"], -f["missed_branches"], f["line"]))
            if never:
                lines.append("    never run: " + ", ".join(
                    f"{f['name']} (l.{f['line']}, {f['statements']})" for f in never))
            if part:
                lines.append("    in part: " + ", ".join(
                    f"{f['name']} (l.{f['line']}, {f['missed']}/{f['statements']} lines, "
                    f"{f['missed_branches']}/{f['branches']} branches missed)" for f in part))
            lines.append(f"    lines: {_ranges(numbers['missing_lines'])}")
            lines.append("    branches: " + ", ".join(
                f"{a}->{b}" for a, b in numbers["missing_branches"]))
    return lines


def html(data_file: str, directory: str) -> str:
    """coverage.py's HTML report of ``data_file`` in ``directory``."""
    require()
    measured = _coverage(data_file)
    measured.load()
    measured.html_report(directory=directory, ignore_errors=True)
    return os.path.join(directory, "index.html")


def summary_dict(result: dict) -> dict:
    """The JSON ``run --json --coverage`` adds: per group and per file, without
    the missed lines (``tray simtest coverage FILE --json`` has those)."""
    return {"goals_met": result["goals_met"], "goals": result["goals"],
            "groups": [{key: group[key] for key in ("name", "lines", "lines_hit", "branches",
                                                     "branches_hit", "line_percent",
                                                     "branch_percent", "goal", "met", "simulated")
                        if key in group}
                       for group in result["groups"]],
            "files": {path: {key: numbers[key] for key in ("lines", "lines_hit", "branches",
                                                            "branches_hit")}
                      for path, numbers in result["files"].items()}}
