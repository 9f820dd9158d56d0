"""Progress on the driver's stdout (``RunConfig.verbose=1``): a header
when the run starts, a table row per report (its iteration, rank 0's
scalar metrics, the run's time, the checkpoint it made), a line per
failure and restart, and a summary at the end.

Columns are fixed by the first report (up to ``METRIC_COLUMNS_MAX`` scalar
metrics, in the order reported), so rows line up as they stream; the full
record of every report is ``result.json`` / ``Result.metrics_dataframe``.
Times come from the report collector's clock: virtual in the simulator,
so the same seed prints the same table.
"""

from __future__ import annotations

import sys

METRIC_COLUMNS_MAX = 6
COLUMN_WIDTH_MIN = 9


def _cell(value) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _scalar(value) -> bool:
    return isinstance(value, (int, float, str, bool)) and not (
        isinstance(value, str) and len(value) > 24)


class Progress:
    def __init__(self, verbose: int, stream=None) -> None:
        self.verbose = verbose
        self.stream = stream
        self.columns: list[str] | None = None
        self.widths: list[int] = []

    def _print(self, text: str) -> None:
        if self.verbose >= 1:
            print(text, file=self.stream or sys.stdout, flush=True)

    def started(self, trainer: str, name: str, num_workers: int, path: str) -> None:
        self._print(f"== {trainer} {name!r}: {num_workers} worker(s); results in {path}")

    def _header(self, metrics: dict) -> None:
        keys = [k for k, v in metrics.items() if _scalar(v)][:METRIC_COLUMNS_MAX]
        self.columns = ["iter", *keys, "time_s", "checkpoint"]
        self.widths = [max(COLUMN_WIDTH_MIN, len(c)) for c in self.columns]
        self.widths[-1] = max(self.widths[-1], len("checkpoint_000000"))
        self.widths[0] = 6
        rule = "+" + "+".join("-" * (w + 2) for w in self.widths) + "+"
        self._print(rule)
        self._print("| " + " | ".join(c.ljust(w) for c, w in zip(self.columns, self.widths,
                                                                  strict=True)) + " |")
        self._print(rule)

    def report(self, row: dict, metrics: dict) -> None:
        if self.verbose < 1:
            return
        if self.columns is None:
            self._header(metrics)
        values = [row["training_iteration"],
                  *[metrics.get(k) for k in self.columns[1:-2]],
                  row["time_total_s"], row.get("checkpoint_dir_name")]
        cells = [_cell(v) for v in values]
        self._print("| " + " | ".join(c.ljust(w) for c, w in zip(cells, self.widths,
                                                                  strict=True)) + " |")

    def failure(self, summary: str, restart: int | None, max_failures: int,
                restore: str | None) -> None:
        if restart is None:
            self._print(f"!! {summary}\n!! no restarts left (FailureConfig(max_failures="
                        f"{max_failures}))")
            return
        budget = "unlimited" if max_failures == -1 else f"of {max_failures}"
        start = f"from {restore}" if restore else "from scratch"
        self._print(f"!! {summary}\n!! restart {restart} ({budget}) {start}")

    def waiting(self, text: str) -> None:
        self._print(f".. {text}")

    def finished(self, reports: int, restarts: int, checkpoint: str | None,
                 failed: bool) -> None:
        outcome = "failed" if failed else "finished"
        latest = f"; latest checkpoint {checkpoint}" if checkpoint else ""
        self._print(f"== training {outcome}: {reports} report(s), {restarts} restart(s)"
                    f"{latest}")
