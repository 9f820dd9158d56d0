"""The PNG chart of a results record: one small panel per table row, a bar per
runtime (the median, with the min-max spread as an error bar) and the ratio
tray/peer above each peer's bar; the scaling curves are line panels (tasks per
second against workers, one line per runtime)."""

from __future__ import annotations

import math

COLORS = {"tray": "#2a7ab0", "ray": "#e0803a", "dask": "#5a9e4b"}


def write(record: dict, path: str) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runtimes = record["runtimes"]
    panels: list = []
    curves: dict = {}
    for row in record["rows"]:
        if row["metric"].startswith("scaling"):
            if row["metric"] not in curves:
                curves[row["metric"]] = []
                panels.append(("curve", curves[row["metric"]]))
            curves[row["metric"]].append(row)
        else:
            panels.append(("bars", row))
    columns = 5
    lines = max(1, math.ceil(len(panels) / columns))
    figure, axes = plt.subplots(lines, columns, figsize=(columns * 3.4, lines * 2.6),
                                squeeze=False)
    for index, (kind, content) in enumerate(panels):
        ax = axes[index // columns][index % columns]
        (_curve if kind == "curve" else _bars)(ax, content, runtimes)
    for index in range(len(panels), lines * columns):
        axes[index // columns][index % columns].axis("off")
    load = "/".join(f"{x:.1f}" for x in record.get("loadavg_before", ()))
    versions = ", ".join(f"{k} {v}" for k, v in record.get("versions", {}).items())
    figure.suptitle(f"{record['date']}  {record['machine']['cpus']} CPUs, "
                    f"Python {record['machine']['python']}  {versions}  load {load}",
                    fontsize=10)
    figure.tight_layout(rect=(0, 0, 1, 0.98))
    figure.savefig(path, dpi=80)
    plt.close(figure)
    return path


def _bars(ax, row: dict, runtimes: list[str]) -> None:
    medians, lows, highs, notes = [], [], [], []
    for runtime in runtimes:
        cell = row["results"].get(runtime) or {}
        if "median" in cell:
            medians.append(cell["median"])
            lows.append(cell["median"] - cell["min"])
            highs.append(cell["max"] - cell["median"])
            notes.append("")
        else:
            medians.append(0.0)
            lows.append(0.0)
            highs.append(0.0)
            notes.append("n/a" if "na" in cell else ("failed" if cell else ""))
    positions = list(range(len(runtimes)))
    ax.bar(positions, medians, yerr=[lows, highs], capsize=3,
           color=[COLORS.get(r, "grey") for r in runtimes])
    ax.set_xticks(positions, runtimes, fontsize=8)
    ax.tick_params(axis="y", labelsize=7)
    title = row["name"] if len(row["name"]) <= 42 else row["name"][:40] + "…"
    better = "" if row["higher_is_better"] else ", lower is better"
    ax.set_title(f"{title}\n({row['unit']}{better})", fontsize=8)
    top = max(m + h for m, h in zip(medians, highs, strict=True))
    if top <= 0:
        ax.set_yticks([])
        top = 1.0
    ax.set_ylim(0, top * 1.3)
    tray_cell = row["results"].get("tray") or {}
    for position, runtime, median, note in zip(positions, runtimes, medians, notes,
                                               strict=True):
        if note:
            ax.text(position, top * 0.05, note, ha="center", fontsize=8)
        elif runtime != "tray" and "median" in tray_cell and median:
            ax.text(position, median + highs[position] + top * 0.03,
                    f"tray/{runtime}\n{tray_cell['median'] / median:.2f}",
                    ha="center", fontsize=6)


def _curve(ax, rows: list[dict], runtimes: list[str]) -> None:
    workers = [int(row["name"].rsplit(", ", 1)[1].split()[0]) for row in rows]
    for runtime in runtimes:
        points = [(w, (row["results"].get(runtime) or {}).get("median"))
                  for w, row in zip(workers, rows, strict=True)]
        points = [(w, v) for w, v in points if v is not None]
        if points:
            ax.plot([w for w, _ in points], [v for _, v in points], marker="o",
                    label=runtime, color=COLORS.get(runtime, "grey"))
    ax.set_xticks(workers)
    ax.set_xlabel("workers", fontsize=7)
    ax.tick_params(labelsize=7)
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=7)
    ax.set_title(f"{rows[0]['metric']}\n({rows[0]['unit']} against workers)", fontsize=8)
