"""The live progress table (Ray's CLI reporter): trial, status, sampled
parameters, latest metrics; printed by the driver every
``RunConfig.progress_interval_s`` of experiment time and once at the end.

The cadence follows the controller's clock, not the driver's: in the
simulator that clock is virtual, so the same seed prints the same tables.
"""

from __future__ import annotations

import sys
from typing import Any


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.5g}"
    return str(value)


def render(progress: dict, *, name: str, final: bool = False) -> str:
    counts = progress["counts"]
    summary = ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))
    lines = [f"== Status ({'done' if final else 'running'}) ==",
             f"Experiment {name}: {progress['elapsed_s']:.1f} s, "
             f"{progress['total']} trials ({summary or 'none yet'})",
             progress.get("scheduler", "")]
    rows = progress["rows"]
    if rows:
        params = []
        for row in rows:
            for key in row["params"]:
                if key not in params:
                    params.append(key)
        metrics = [k for k in rows[0] if k not in ("trial", "status", "params")]
        header = ["Trial name", "status", *params, *metrics]
        table = [[row["trial"], row["status"], *[_cell(row["params"].get(p)) for p in params],
                  *[_cell(row.get(m)) for m in metrics]] for row in rows]
        widths = [max(len(str(h)), *(len(r[i]) for r in table)) for i, h in enumerate(header)]
        rule = "+" + "+".join("-" * (w + 2) for w in widths) + "+"
        lines.append(rule)
        lines.append("| " + " | ".join(h.ljust(w) for h, w in zip(header, widths,
                                                                   strict=True)) + " |")
        lines.append(rule)
        for r in table:
            lines.append("| " + " | ".join(c.ljust(w) for c, w in zip(r, widths,
                                                                      strict=True)) + " |")
        lines.append(rule)
        if progress.get("hidden"):
            lines.append(f"... {progress['hidden']} more trials not shown")
    return "\n".join(line for line in lines if line is not None)


class ProgressReporter:
    def __init__(self, name: str, verbose: int, interval_s: float, stream=None) -> None:
        self.name = name
        self.verbose = verbose
        self.interval_s = interval_s
        self.stream = stream or sys.stdout
        self._last_printed_s: float | None = None
        self._finished_seen: dict[str, None] = {}

    def update(self, progress: dict) -> None:
        if self.verbose < 1:
            return
        elapsed = progress["elapsed_s"]
        if self._last_printed_s is None or elapsed - self._last_printed_s >= self.interval_s:
            self._last_printed_s = elapsed
            print(render(progress, name=self.name), file=self.stream, flush=True)

    def finish(self, progress: dict) -> None:
        if self.verbose >= 1:
            print(render(progress, name=self.name, final=True), file=self.stream, flush=True)
