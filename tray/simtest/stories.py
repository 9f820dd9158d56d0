"""The story of one task or object in a simulated run: what happened to it,
from the run's event trace, oldest first (dask's ``story(key)``).

Every component records what it does in the trace (``tray/core/trace.py``),
with the virtual time and the ids involved; the simulator hashes the trace
for the run's digest and keeps its last events (the ``events`` deque, what
``tray simtest replay --trace`` writes as JSON lines). A story is a filter
over those events, so it reads the trace and never adds to it: telling a
story leaves the digest as it was.

Which events make a task's or an object's story:

* every event with a ``task``, ``object`` or ``actor`` field that starts
  with the id asked for (a hex prefix; an object's id begins with the id of
  the task that made it, so a task's story has its results' frees and
  pulls, and a whole object id's story has its task's submission, runs,
  retries and end);
* and what befell a worker while it ran the task: the worker's kill and
  death, its process's, its node's crash (the cause of the retry that
  follows), between the run's ``task_started`` and the run's end.

The alternative, a log kept per task by the components themselves (dask's
transition log), would cost the simulator's hot path for every task of
every seed, where only a failing seed's story is ever read.

A failing seed's report (``SeedResult.report()``) tells the story of the
first task or object its failure message names that the trace knows
(``failure_story``): its last ``REPORT_EVENTS_MAX`` events."""

from __future__ import annotations

import bisect
import json
import os
import re
from collections.abc import Iterable

# A failing seed's report shows at most this many of its story's events (the last).
REPORT_EVENTS_MAX = 20
# The fields of trace events that hold the id of a task, an object or an actor.
ID_FIELDS = ("task", "object", "actor")
# A task id's hex (an object id's hex begins with its task's).
TASK_ID_HEX_CHARS = 32
# The fields every event has, first in its line; the rest follow as recorded.
_SHOWN_FIRST = ("t", "component", "event")
# The events that end a task's run on its worker (from the worker's component).
_RUN_ENDS = frozenset({"task_done", "task_failed", "system_exit", "force_exit"})
# What befalls a worker, its process or its node, by the field naming it.
_WORKER_EVENTS = frozenset({"kill_worker", "worker_died"})
_PROCESS_EVENTS = frozenset({"process_kill", "process_exit", "process_crashed"})
_NODE_EVENTS = frozenset({"kill_node", "node_dead", "node_died", "node_fenced"})
# A hex id, or the prefix of one, in a failure message (8 digits or more).
_HEX_TOKEN = re.compile(r"(?<![0-9a-fA-F])[0-9a-f]{8,40}(?![0-9a-fA-F])")


def hex_of(what) -> str:
    """The hex id (or prefix) of ``what``: a string of hex digits, or an id
    or ref with a ``hex()`` (an ``ObjectRef``, a ``TaskID``, an ``ObjectID``)."""
    text = what.hex() if hasattr(what, "hex") and callable(what.hex) else what
    if not isinstance(text, str):
        raise TypeError(f"a story is told of a hex id, a prefix of one, or an id or ref with "
                        f"hex(); got {type(what).__name__}")
    text = text.strip().lower()
    if not text or any(c not in "0123456789abcdef" for c in text):
        raise ValueError(f"a story is told of a hex id or a prefix of one; got {what!r}")
    return text


def read_trace(path: str | os.PathLike) -> list[dict]:
    """The events of a trace written as JSON lines (``replay --trace``)."""
    with open(path, encoding="utf-8") as lines:
        return [json.loads(line) for line in lines if line.strip()]


def _names(event: dict, prefix: str) -> bool:
    """Whether ``event`` names the task, object or actor ``prefix`` is of."""
    for name in ID_FIELDS:
        value = event.get(name)
        if type(value) is not str:
            continue
        if value.startswith(prefix):
            return True
        # An object's story holds its task's events.
        if name == "task" and len(prefix) > TASK_ID_HEX_CHARS and prefix.startswith(value):
            return True
    return False


def story_of(what, events: Iterable[dict]) -> list[dict]:
    """The events of ``events`` (a run's trace, oldest first) that make the
    story of the task or object ``what`` (its hex id, a prefix of it, or an
    id or ref: ``hex_of``)."""
    prefix = hex_of(what)
    told: list[dict] = []
    worker_ids: dict[str, str] = {}  # a worker id's last 8 hex digits -> the id
    worker_nodes: dict[str, str] = {}  # a worker id -> its node manager's component
    running: dict[str, str] = {}  # "worker:<suffix>" -> the worker id, while it runs the task
    for event in events:
        name = event.get("event")
        if name == "worker_start" and type(event.get("worker")) is str:
            worker_ids[event["worker"][-8:]] = event["worker"]
            worker_nodes[event["worker"]] = str(event.get("component", ""))
        if _names(event, prefix):
            told.append(event)
            component = str(event.get("component", ""))
            if name == "task_started" and component.startswith("worker:"):
                running[component] = worker_ids.get(component.split(":", 1)[1], "")
            elif name in _RUN_ENDS:
                running.pop(component, None)
            continue
        hit = _befalls(event, name, running, worker_nodes) if running else ()
        if hit:
            told.append(event)
            # A worker's death is the last word on its runs (a node's crash
            # records none for its workers: the node's death follows).
            if name == "worker_died":
                for component in hit:
                    running.pop(component, None)
    return told


def _befalls(event: dict, name, running: dict, worker_nodes: dict) -> list[str]:
    """The runs (``running``'s components) whose worker ``event`` kills, by
    killing the worker, its process or its node."""
    if name in _WORKER_EVENTS:
        value = str(event.get("worker", ""))
        return [component for component, worker in running.items()
                if value and worker and (worker.startswith(value) or value.startswith(worker))]
    if name in _PROCESS_EVENTS:
        process = str(event.get("process", ""))
        return [component for component, worker in running.items()
                if worker and process.endswith(f"worker-{worker[:12]}")]
    if name in _NODE_EVENTS:
        # (A fenced node manager records under its node id's first 8 digits.)
        node = str(event.get("node") or (event.get("component", "") if name == "node_fenced"
                                          else ""))
        return [component for component, worker in running.items()
                if node and worker_nodes.get(worker) and node.startswith(worker_nodes[worker])]
    return []


def format_event(event: dict) -> str:
    """One line: the virtual time, the component, the event, then its fields."""
    fields = " ".join(f"{key}={value}" for key, value in event.items()
                      if key not in _SHOWN_FIRST)
    t = event.get("t")
    when = f"t={t:.6f}s" if isinstance(t, (int, float)) else f"t={t}"
    return f"{when} {event.get('component', '?')} {event.get('event', '?')}" + \
        (f" {fields}" if fields else "")


def format_story(events: list[dict], limit: int | None = None) -> list[str]:
    """The story's lines, the last ``limit`` events (None: all)."""
    shown = events if limit is None or len(events) <= limit else events[-limit:]
    return [format_event(event) for event in shown]


def failure_story(message: str, events: Iterable[dict],
                  limit: int = REPORT_EVENTS_MAX) -> tuple[str, int, list[str]]:
    """The story a failing seed's report tells: of the first hex id in its
    failure ``message`` that names a task or object of the trace. Returns
    (that id or prefix, the story's length in events, its last ``limit``
    lines); ("", 0, []) when the message names none."""
    events = list(events)
    known = sorted({value for event in events for name in ("task", "object")
                    if type(value := event.get(name)) is str})
    for match in _HEX_TOKEN.finditer(message):
        token = match.group(0)
        after = bisect.bisect_left(known, token)  # (the first id that may start with it)
        if (after < len(known) and known[after].startswith(token)) or \
                (len(token) > TASK_ID_HEX_CHARS and token[:TASK_ID_HEX_CHARS] in known):
            told = story_of(token, events)
            return token, len(told), format_story(told, limit)
    return "", 0, []
