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


# The scaling curves (bench/scale_curves.py): per curve, the figures a point
# records that are time (or memory) per operation, against N on log axes.
SCALE_PANELS = (
    ("tasks", "submit_us_per_task", "tasks at once: submit, µs/task"),
    ("tasks", "results_us_per_task", "tasks at once: to results, µs/task"),
    ("tasks", "cpu_us_per_task", "tasks at once: CPU (all processes), µs/task"),
    ("tasks", "driver_rss_bytes_per_pending_task", "tasks at once: driver RSS B/pending task"),
    ("objects", "put_us_per_object", "live objects: put, µs/object"),
    ("objects", "put_cpu_us_per_object", "live objects: put CPU (driver), µs/object"),
    ("objects", "get_us_per_object", "live objects: get, µs/object"),
    ("objects", "free_us_per_object", "live objects: free, µs/object"),
    ("actors", "create_and_call_ms_per_actor", "actors: create + call, ms/actor"),
    ("actors", "cpu_ms_per_actor", "actors: CPU, ms/actor"),
    ("actors", "kill_cpu_ms_per_actor", "actors: kill one by one, CPU ms/actor"),
    ("actors", "idle_cpu_ms_per_actor_second", "actors (sim): idle, CPU ms/actor-second"),
    ("sim_cluster", "cpu_us_per_task", "sim cluster: CPU µs/task"),
    ("sim_cluster", "idle_cpu_ms_per_node_second", "sim cluster: idle CPU ms/node-second"),
    ("sim_cluster", "start_cpu_s", "sim cluster: start CPU s"),
)


def write_scale(record: dict, path: str) -> str:
    """One panel per figure of SCALE_PANELS, a line per backend (local: tray's
    real processes, sim: the simulator, sim1: the simulator with every actor
    on one node, ray: Ray on the same curve); flat is good (start_cpu_s
    excepted)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [(curve, key, title) for curve, key, title in SCALE_PANELS
              if any(key in row for row in record["curves"].get(curve, ()))]
    columns = 4
    lines = max(1, math.ceil(len(panels) / columns))
    figure, axes = plt.subplots(lines, columns, figsize=(columns * 3.6, lines * 2.8),
                                squeeze=False)
    for index, (curve, key, title) in enumerate(panels):
        ax = axes[index // columns][index % columns]
        rows = record["curves"][curve]
        for backend, color in (("local", COLORS["tray"]), ("sim", "#7a4fb0"),
                               ("sim1", "#b04f8a"), ("ray", COLORS["ray"])):
            points = sorted((row["n"], row[key]) for row in rows
                            if row["backend"] == backend and
                            isinstance(row.get(key), (int, float)))
            if points:
                ax.plot([n for n, _ in points], [v for _, v in points], marker="o",
                        color=color, label=backend)
        ax.set_xscale("log")
        ax.set_ylim(bottom=0)
        ax.set_title(title, fontsize=8)
        ax.tick_params(labelsize=7)
        ax.legend(fontsize=6)
    for index in range(len(panels), lines * columns):
        axes[index // columns][index % columns].axis("off")
    peers = " and Ray" if any(row.get("backend") == "ray" for rows in record["curves"].values()
                              for row in rows) else ""
    figure.suptitle(f"tray{peers} scaling curves, {record['date']}  {record['machine']['cpus']} CPUs, "
                    f"Python {record['machine']['python']}" +
                    ("  (quick)" if record.get("quick") else ""), fontsize=10)
    figure.tight_layout(rect=(0, 0, 1, 0.96))
    figure.savefig(path, dpi=80)
    plt.close(figure)
    return path
