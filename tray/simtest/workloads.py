"""Randomized tray programs with reference models that know the right answers:
the registry of workloads (``WORKLOADS``) that the CLI, the runner and the
noxfile read.

Each workload is a function ``(program) -> None`` that submits work through
the public API and records, for every ref it will check, what the reference
model expects (``program.expect``). The runner then gets every ref after the
faults stop and checks the value, or that the error is one the injected
faults and the task's options permit.

The pieces live in ``pieces_tasks``, ``pieces_objects``, ``pieces_actors``
and the other ``pieces_<name>`` modules beside them; the code their tasks
and actors run, and the ledger that code counts its executions in, in
``remote_code``; ``mixed`` runs 3 to 6 pieces at random.
The libraries' workloads (tray.data, tray.tune, ...) are found in the
``workloads_<library>.py`` modules beside this one.

Randomness comes only from ``program.rng`` (``random.Random(f"{seed}:workload")``).
"""

from __future__ import annotations

from .pieces_actors import (
    actors,
    groups_removed,
    named,
    removed_group,
    restarts,
    restarts_unretried,
)
from .pieces_edges import edges
from .pieces_lifecycle import inflight, recycle
from .pieces_lifetimes import backlog, lifetimes, waiting_groups
from .pieces_memory import memory
from .pieces_objects import chains, lineage, objects, returns, wait_loop
from .pieces_paths import paths
from .pieces_recovery import copies
from .pieces_tasks import cancellation, dag, gpus, nested, placement_groups, retries

PIECES = {
    "dag": dag, "nested": nested, "objects": objects, "wait": wait_loop, "actors": actors,
    "retries": retries, "cancel": cancellation, "restarts": restarts,
    "groups": placement_groups, "chains": chains, "returns": returns, "named": named,
    "gpus": gpus, "lineage": lineage, "memory": memory,
    "inflight": inflight, "recycle": recycle,
    "lifetimes": lifetimes, "copies": copies, "waiting_groups": waiting_groups, "backlog": backlog,
    "edges": edges, "paths": paths, "removed_group": removed_group,
}
# Pieces that run after every other piece of ``mixed`` (memory pressure:
# the monitor may kill any work on its node, which other pieces' checks do
# not expect, so it waits for theirs to be done first).
LAST = ("memory",)


def mixed(program) -> None:
    names = sorted(PIECES)
    chosen = [program.rng.choice(names) for _ in range(program.rng.randint(3, 6))]
    for name in [name for name in chosen if name not in LAST] + \
            [name for name in chosen if name in LAST]:
        PIECES[name](program)


def _library_workloads() -> dict:
    """The libraries' workloads (tray.data, tray.tune, ...): each library keeps
    its programs and reference models in a module ``workloads_<library>.py``
    beside this one, exporting a ``WORKLOADS`` dict of its own."""
    import importlib
    import os
    import pkgutil

    found: dict = {}
    here = os.path.dirname(__file__)
    for info in sorted(pkgutil.iter_modules([here]), key=lambda info: info.name):
        if info.name.startswith("workloads_"):
            module = importlib.import_module(f"{__package__}.{info.name}")
            found.update(module.WORKLOADS)
    return found


WORKLOADS = {**PIECES, "mixed": mixed, "lineage": lambda program: lineage(program, alone=True),
             "restarts_unretried": restarts_unretried, "groups": groups_removed,
             "memory": lambda program: memory(program, alone=True),
             "copies": lambda program: copies(program, alone=True),
             **_library_workloads()}
