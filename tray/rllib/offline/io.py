"""Transitions to and from files: JSON lines or Parquet (through pyarrow).

Every row is one transition, with RLlib's column names: ``eps_id``,
``agent_id``, ``module_id``, ``t``, ``obs``, ``actions``, ``rewards``,
``new_obs``, ``terminateds``, ``truncateds``, ``action_logp``. Each env
runner writes the transitions of each ``sample()`` call to a file of its
own (``<output>/output-runner<index>-<seq>.<ext>``), so concurrent runners
never share a file, names are deterministic, and a restarted runner
continues in new files instead of appending to a half-written one.

The reader loads files into memory as numpy columns, up to
``max_rows`` (a limit, not a sampler: behaviour cloning on more data than
fits belongs on tray.data when it exists)."""

from __future__ import annotations

import json
import os

import numpy as np

FORMATS = ("json", "parquet")
COLUMNS = ("eps_id", "agent_id", "module_id", "t", "obs", "actions", "rewards", "new_obs",
           "terminateds", "truncateds", "action_logp")
MAX_ROWS_DEFAULT = 2_000_000


def chunk_transitions(chunk: dict, module_id: str) -> dict:
    """Columns of one trajectory chunk's transitions."""
    steps = len(chunk["rewards"])
    obs = np.asarray(chunk["obs"])
    terminateds = np.zeros(steps, dtype=bool)
    truncateds = np.zeros(steps, dtype=bool)
    if steps:
        terminateds[-1] = bool(chunk["terminated"])
        truncateds[-1] = bool(chunk["truncated"])
    return {
        "eps_id": [chunk["eps_id"]] * steps,
        "agent_id": [str(chunk.get("agent_id", ""))] * steps,
        "module_id": [module_id] * steps,
        "t": list(range(chunk["t_started"], chunk["t_started"] + steps)),
        "obs": obs[:-1].tolist(),
        "actions": np.asarray(chunk["actions"]).tolist(),
        "rewards": np.asarray(chunk["rewards"], dtype=np.float64).tolist(),
        "new_obs": obs[1:].tolist(),
        "terminateds": terminateds.tolist(),
        "truncateds": truncateds.tolist(),
        "action_logp": np.asarray(chunk["action_logp"], dtype=np.float64).tolist(),
    }


def write_transitions(path: str, columns: dict, output_format: str) -> None:
    if output_format not in FORMATS:
        raise ValueError(f"output format must be one of {FORMATS}, got {output_format!r}")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    temporary = path + ".tmp"
    if output_format == "json":
        rows = len(columns["rewards"])
        with open(temporary, "w", encoding="utf-8") as out:
            for index in range(rows):
                out.write(json.dumps({name: columns[name][index] for name in COLUMNS}))
                out.write("\n")
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.table({name: columns[name] for name in COLUMNS}), temporary)
    os.replace(temporary, path)  # readers never see a half-written file


class OfflineWriter:
    """An env runner's output: one file per sample() call."""

    def __init__(self, output: str, output_format: str, runner_index: int,
                 incarnation: str = "") -> None:
        if output_format not in FORMATS:
            raise ValueError(f"output_format must be one of {FORMATS}, got {output_format!r}")
        self.output = output
        self.output_format = output_format
        self.runner_index = runner_index
        self.incarnation = incarnation
        self.files_written = 0

    def write(self, chunks_by_module: dict) -> str | None:
        merged: dict = {name: [] for name in COLUMNS}
        for module_id in sorted(chunks_by_module):
            for chunk in chunks_by_module[module_id]:
                for name, values in chunk_transitions(chunk, module_id).items():
                    merged[name].extend(values)
        if not merged["rewards"]:
            return None
        extension = "json" if self.output_format == "json" else "parquet"
        path = os.path.join(self.output, f"output-runner{self.runner_index}{self.incarnation}-"
                                         f"{self.files_written:06d}.{extension}")
        write_transitions(path, merged, self.output_format)
        self.files_written += 1
        return path


def _files(input_) -> list[str]:
    paths = [input_] if isinstance(input_, str) else list(input_)
    found = []
    for path in paths:
        if os.path.isdir(path):
            found.extend(os.path.join(path, name) for name in sorted(os.listdir(path))
                         if name.endswith((".json", ".parquet")))
        elif os.path.exists(path):
            found.append(path)
        else:
            raise FileNotFoundError(f"offline input {path!r} does not exist")
    if not found:
        raise ValueError(f"offline input {input_!r} holds no .json or .parquet files")
    return found


def read_transitions(input_, max_rows: int = MAX_ROWS_DEFAULT) -> dict:
    """All transitions under ``input_`` (a file, a directory or a list of
    them) as numpy columns, in file order."""
    columns: dict = {name: [] for name in COLUMNS}
    rows = 0
    for path in _files(input_):
        if path.endswith(".json"):
            with open(path, encoding="utf-8") as source:
                records = [json.loads(line) for line in source if line.strip()]
            part = {name: [record[name] for record in records] for name in COLUMNS}
        else:
            import pyarrow.parquet as pq

            part = pq.read_table(path).to_pydict()
        rows += len(part["rewards"])
        if rows > max_rows:
            raise ValueError(f"offline input {input_!r} has more than {max_rows} transitions "
                             f"(the reader's limit, offline_data(max_rows=...))")
        for name in COLUMNS:
            columns[name].extend(part[name])
    out = {name: np.asarray(values) for name, values in columns.items()}
    out["obs"] = out["obs"].astype(np.float32)
    out["new_obs"] = out["new_obs"].astype(np.float32)
    out["rewards"] = out["rewards"].astype(np.float32)
    return out
