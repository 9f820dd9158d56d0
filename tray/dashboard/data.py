"""What the dashboard, ``/metrics`` and the state commands read of a cluster.

The dashboard is not a driver: it registers no job and owns nothing. It
reads the cluster through the state API (``tray.util.state``) with the
GCS's address, which connects without joining (short authenticated calls
to the GCS, and to the nodes and workers for objects), and, for what only
the head's machine knows (logs), the session directory. Every read returns
plain dicts with Ray's state API field names (``actor_id``, ``state``,
``death_cause``, ``func_or_class_name``...), so that the pages, the JSON
endpoints and ``/metrics`` show the same thing.

``ClusterReader`` methods are synchronous: each runs its own short trio
loop, so they are called from worker threads (Starlette runs ``def``
endpoints in its thread pool) or from the CLI."""

from __future__ import annotations

import dataclasses
import os
import warnings

import trio

from ..backends.local import query_gcs, session

# A log page shows at most the end of a file this long; a JSON listing at most
# this many rows (the GCS's tables are bounded; this bounds one response).
LOG_TAIL_BYTES = 256 * 1024
ROWS_MAX = 10_000


ROWS_UNLIMITED = 10**9
# The timeline download: the newest this many task attempts (the GCS's whole table).
TIMELINE_TASKS_MAX = 100_000


class ClusterReader:
    """Reads one cluster, given its GCS address (``tcp:host:port``), token
    and, on the head's machine, its session directory. The cluster's tables
    come from the state API (``tray.util.state``, called with the GCS's
    address: no driver, no job); the logs from the session directory."""

    def __init__(self, gcs_address: str, token: bytes, session_dir: str | None = None) -> None:
        self.gcs_address = gcs_address
        self.token = token
        self.session_dir = session_dir
        # What the state API takes: host:port, or a tray.init() cluster's unix: address.
        self.address = gcs_address.removeprefix("tcp:")

    def call(self, method: str, *args):
        return trio.run(query_gcs, self.gcs_address, self.token, method, *args)

    def _state(self, function: str, **options):
        """``tray.util.state.<function>(address=this cluster, **options)``,
        its warnings (dropped task events) silenced: the pages say so. The
        state API takes the token from ``TRAY_CLUSTER_TOKEN``, which the
        dashboard process sets to its cluster's at start."""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return self._state_raw(function, **options)

    # ------------------------------------------------------------ nodes

    def nodes(self) -> list[dict]:
        store = {row["node_id"]: row for row in self._state("memory_summary")["nodes"]}
        rows = []
        for node in self._state("list_nodes", detail=True, limit=ROWS_UNLIMITED):
            total = {k: v for k, v in node.resources_total.items()
                     if k != "object_store_memory"}
            available = node.resources_available or {}
            used = {name: total[name] - available.get(name, total[name]) for name in total}
            usage = store.get(node.node_id, {})
            rows.append({
                "node_id": node.node_id, "state": node.state, "node_ip": node.node_ip,
                "node_name": node.node_name, "is_head_node": node.is_head_node,
                "resources_total": total, "resources_used": used,
                "object_store_bytes_total": node.object_store_total_bytes,
                "object_store_bytes_used": usage.get("store_used_bytes"),
                "object_store_bytes_spilled": usage.get("spilled_bytes"),
                "address": node.address})
        return rows

    # ------------------------------------------------------------ actors

    def actors(self) -> list[dict]:
        rows = []
        for actor in self._state("list_actors", detail=True, limit=ROWS_MAX):
            rows.append({
                "actor_id": actor.actor_id, "class_name": actor.class_name,
                "state": actor.state, "name": actor.name or "",
                "ray_namespace": actor.ray_namespace, "node_id": actor.node_id,
                "worker_id": actor.worker_id, "pid": actor.pid,
                "num_restarts": actor.num_restarts, "max_restarts": actor.max_restarts,
                "death_cause": actor.death_cause, "job_id": actor.job_id})
        return rows

    # ------------------------------------------------------------ tasks

    def tasks(self) -> tuple[list[dict], dict]:
        """Task attempts (the newest ``ROWS_MAX``), oldest first, and what
        the bounded tables dropped."""
        meta = {"dropped_at_gcs": 0, "dropped_at_sources": 0}
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            # The GCS keeps up to 100,000 attempts (~17 MB with details): a
            # page takes the newest ROWS_MAX, and says when there were more.
            records = self._state_raw("list_tasks", detail=True, limit=ROWS_MAX)
        dropped = [str(w.message) for w in caught
                   if "dropped" in str(w.message) or "showing" in str(w.message)]
        if dropped:
            meta["warning"] = dropped[0]
        rows = []
        for task in records[-ROWS_MAX:]:
            row = task.asdict()
            start, end = row.get("start_time_ms"), row.get("end_time_ms")
            row["duration_s"] = None if start is None or end is None else \
                max(0.0, (end - start) / 1000)
            row.pop("profiling_data", None)
            rows.append(row)
        meta["stored"] = len(records)
        return rows, meta

    def _state_raw(self, function: str, **options):
        from ..util import state

        return getattr(state, function)(address=self.address, **options)

    # ---------------------------------------------------------- workers

    def workers(self) -> list[dict]:
        return [worker.asdict() for worker in self._state("list_workers", detail=True,
                                                           limit=ROWS_UNLIMITED)]

    # ------------------------------------------------------------- jobs

    def jobs(self) -> list[dict]:
        return [job.asdict() for job in self._state("list_jobs", detail=True,
                                                     limit=ROWS_MAX)]

    def timeline(self) -> list[dict]:
        from .._timeline import events_from_tasks

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return events_from_tasks(self._state_raw("list_tasks", detail=True,
                                                     limit=TIMELINE_TASKS_MAX))

    # ---------------------------------------------------------- objects

    def memory(self) -> dict:
        return self._state("memory_summary")

    # ------------------------------------------------------------- logs

    def log_files(self) -> list[dict]:
        if not self.session_dir:
            return []
        return [{"name": name, "size_bytes": os.path.getsize(path)}
                for name, path in session.log_files(self.session_dir)]

    def read_log(self, name: str, tail_bytes: int = LOG_TAIL_BYTES) -> str:
        """The end of the log file ``name`` (as ``log_files`` names it); a
        name that leaves the session directory is refused."""
        if not self.session_dir:
            raise FileNotFoundError(name)
        path = os.path.realpath(os.path.join(self.session_dir, name))
        if not path.startswith(os.path.realpath(self.session_dir) + os.sep) or \
                not name.endswith(session.LOG_SUFFIXES):
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
