"""What user code costs in virtual time.

Inside the simulator, user code runs between two steps of the event loop:
without a charge it takes no virtual time at all, and a worker on the
driver's node (20–100 µs away) answers ten times sooner than one on another
machine (0.1–1 ms away), so ``wait`` loops, load balancing and spillback
favour the driver's node far more than on real machines, where the Python
work of a call dominates the wire. So each task and actor call is charged a
cost after its user code returns: the worker stays busy (it holds its lease,
a sync actor runs nothing else) for that much virtual time.

The cost of one execution is ``mean * jitter``, the mean taken per function
name (the name in errors and the state API: ``f`` or ``Class.method``) or
the cluster's default, the jitter in [0.5, 1.5) drawn from a hash of the
seed, the task id and the attempt: the same execution costs the same in
every replay, whatever ran before it, and never wall-clock time. Work that
calls ``time.sleep`` pays its sleep on top.
"""

from __future__ import annotations

import hashlib
from typing import Any

# About a trivial call through a real worker and its share of the work: with
# it, 4 actors on 2 nodes of 0.1-1 ms apart answer a wait loop 70:80, not 14:137.
DEFAULT_TASK_COST_S = 0.005


def _mean_s(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0 or \
            value != value or value == float("inf"):
        raise ValueError(f"{what} must be a finite number of seconds >= 0, got {value!r}")
    return float(value)


class TaskCostModel:
    """``task_cost_s``: a default mean (seconds), or a dict of means by
    function name, with ``"default"`` for the rest (else
    ``DEFAULT_TASK_COST_S``)."""

    def __init__(self, seed: int, task_cost_s: float | dict | None) -> None:
        self._seed = seed
        self._by_name: dict[str, float] = {}
        self.default_s = DEFAULT_TASK_COST_S
        if isinstance(task_cost_s, dict):
            for name, value in task_cost_s.items():
                if not isinstance(name, str):
                    raise ValueError(f"task_cost_s keys are function names, got {name!r}")
                self._by_name[name] = _mean_s(value, f"task_cost_s[{name!r}]")
            self.default_s = self._by_name.pop("default", DEFAULT_TASK_COST_S)
        elif task_cost_s is not None:
            self.default_s = _mean_s(task_cost_s, "task_cost_s")

    def cost_s(self, spec) -> float:
        mean = self._by_name.get(spec.name, self.default_s)
        if mean == 0.0:
            return 0.0
        digest = hashlib.blake2b(f"{self._seed}:{spec.task_id.hex()}:{spec.attempt}".encode(),
                                 digest_size=8).digest()
        return mean * (0.5 + int.from_bytes(digest, "big") / 2 ** 64)
