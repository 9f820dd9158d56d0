"""What the dashboard, ``/metrics`` and the state commands read of a cluster.

The dashboard is not a driver: it registers no job and owns nothing. It
reads the cluster the way ``tray status`` does, with one authenticated call
to the GCS per table (``query_gcs``: nodes, actors, the task event table,
submitted jobs) and, for what only the head's machine knows (logs, the
object store's files), the session directory. Every read returns plain
dicts with Ray's state API field names (``actor_id``, ``state``,
``death_cause``, ``func_or_class_name``...), so that the pages, the JSON
endpoints and ``tray list`` show the same thing.

``ClusterReader`` methods are synchronous: each runs its own short trio
loop, so they are called from worker threads (Starlette runs ``def``
endpoints in its thread pool) or from the CLI."""

from __future__ import annotations

import dataclasses
import json
import os
import time

import trio

from ..backends.local import query_gcs
from ..exceptions import TrayError

# A log page shows at most the end of a file this long; a JSON listing at most
# this many rows (the GCS's tables are bounded; this bounds one response).
LOG_TAIL_BYTES = 256 * 1024
ROWS_MAX = 10_000
LOG_SUFFIXES = (".out", ".err", ".log")


def _directory_bytes(path: str) -> int:
    total = 0
    for directory, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(directory, name)).st_size
            except OSError:
                pass  # removed while we looked
    return total


class ClusterReader:
    """Reads one cluster, given its GCS address (``tcp:host:port``), token
    and, on the head's machine, its session directory."""

    def __init__(self, gcs_address: str, token: bytes, session_dir: str | None = None) -> None:
        self.gcs_address = gcs_address
        self.token = token
        self.session_dir = session_dir

    def call(self, method: str, *args):
        return trio.run(query_gcs, self.gcs_address, self.token, method, *args)

    # ------------------------------------------------------------ nodes

    def nodes(self) -> list[dict]:
        rows = []
        for node in self.call("get_all_nodes"):
            total = {k: v for k, v in node.resources.items()}
            used = {name: total[name] - node.available.get(name, 0) for name in total}
            store_used = spilled = None
            if node.store_directory and os.path.isdir(node.store_directory):
                store_used = _directory_bytes(node.store_directory)
            if node.spill_directory and os.path.isdir(node.spill_directory):
                spilled = _directory_bytes(node.spill_directory)
            rows.append({
                "node_id": node.node_id, "state": "ALIVE" if node.alive else "DEAD",
                "node_ip": node.ip or "127.0.0.1", "node_name": node.hostname,
                "is_head_node": bool(node.session_dir) and node.session_dir == self.session_dir
                and not rows,
                "resources_total": total, "resources_used": used,
                "object_store_bytes_total": node.object_store_bytes,
                "object_store_bytes_used": store_used, "object_store_bytes_spilled": spilled,
                "address": node.address})
        return rows

    # ------------------------------------------------------------ actors

    def actors(self) -> list[dict]:
        rows = []
        for actor in self.call("list_actors"):
            cause = actor.death_cause
            rows.append({
                "actor_id": actor.actor_id, "class_name": actor.class_name,
                "state": actor.state, "name": actor.name or "",
                "ray_namespace": actor.namespace, "node_id": actor.node_id,
                "worker_id": actor.worker_id, "pid": self._worker_pid(actor.worker_id),
                "num_restarts": actor.restarts, "max_restarts": actor.max_restarts,
                "death_cause": None if cause is None else cause.reason})
        return rows[:ROWS_MAX]

    def _worker_pid(self, worker_id: str | None) -> int | None:
        if not worker_id:
            return None
        return self._pids().get(worker_id)

    def _pids(self) -> dict:
        """worker id -> pid, from the task event table's executor records."""
        if getattr(self, "_pid_cache", None) is None:
            self._pid_cache = {row["worker_id"]: row["worker_pid"]
                               for row in self._task_rows()[0]
                               if row.get("worker_id") and row.get("worker_pid")}
        return self._pid_cache

    # ------------------------------------------------------------ tasks

    def _task_rows(self) -> tuple[list[dict], dict]:
        try:
            reply = self.call("get_task_events")
        except TrayError:
            raise
        except Exception as error:  # an older GCS without the table
            return [], {"error": f"task events unavailable: {error}"}
        now_wall = time.time()
        rows = []
        for row in reply["rows"]:
            row = dict(row)

            def wall(at, _now=reply["now"]):
                return None if at is None else now_wall - (_now - at)
            events = row.pop("events", {})
            row["events"] = [{"state": state, "created_ms": int(wall(at) * 1000)}
                             for state, at in sorted(events.items(), key=lambda kv: kv[1])]
            started, ended = events.get("RUNNING"), events.get("FINISHED", events.get("FAILED"))
            row["start_time_ms"] = None if started is None else int(wall(started) * 1000)
            row["end_time_ms"] = None if ended is None else int(wall(ended) * 1000)
            row["duration_s"] = None if started is None or ended is None else \
                max(0.0, ended - started)
            row.pop("spans", None)
            rows.append(row)
        meta = {"dropped_at_gcs": reply.get("dropped_at_gcs", 0),
                "dropped_at_sources": reply.get("dropped_at_sources", 0),
                "stored": reply.get("stored", len(rows))}
        return rows, meta

    def tasks(self) -> tuple[list[dict], dict]:
        rows, meta = self._task_rows()
        return rows[-ROWS_MAX:], meta

    # ------------------------------------------------------------- jobs

    def jobs(self) -> list[dict]:
        try:
            records = self.call("job_submission_list")
        except TrayError:
            raise
        except Exception:
            return []
        jobs = []
        for submission_id, record in records:
            try:
                info = json.loads(record)
            except ValueError:
                continue
            info.setdefault("submission_id", submission_id)
            jobs.append(info)
        return jobs

    # ------------------------------------------------------------- logs

    def log_files(self) -> list[dict]:
        if not self.session_dir:
            return []
        directory = os.path.join(self.session_dir, "logs")
        files = []
        for root in (directory, self.session_dir):
            try:
                names = sorted(os.listdir(root))
            except OSError:
                continue
            for name in names:
                path = os.path.join(root, name)
                if name.endswith(LOG_SUFFIXES) and os.path.isfile(path):
                    rel = os.path.relpath(path, self.session_dir)
                    files.append({"name": rel, "size_bytes": os.path.getsize(path)})
        return files

    def read_log(self, name: str, tail_bytes: int = LOG_TAIL_BYTES) -> str:
        """The end of the log file ``name`` (as ``log_files`` names it); a
        name that leaves the session directory is refused."""
        if not self.session_dir:
            raise FileNotFoundError(name)
        path = os.path.realpath(os.path.join(self.session_dir, name))
        if not path.startswith(os.path.realpath(self.session_dir) + os.sep) or \
                not name.endswith(LOG_SUFFIXES):
            raise FileNotFoundError(name)
        with open(path, "rb") as file:
            file.seek(0, os.SEEK_END)
            size = file.tell()
            file.seek(max(0, size - tail_bytes))
            return file.read().decode("utf-8", "replace")

    def worker_log_names(self, worker_id: str) -> list[str]:
        """The log files of the worker ``worker_id`` (or a prefix of it)."""
        prefix = f"logs/worker-{worker_id[:12]}."
        return [f["name"] for f in self.log_files() if f["name"].startswith(prefix)]


def row_dict(value) -> dict:
    return dataclasses.asdict(value) if dataclasses.is_dataclass(value) else dict(value)
