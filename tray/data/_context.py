"""DataContext: the driver's settings for executing datasets (Ray's names).

Settings are read when a dataset executes, in the process that executes it;
tasks get what they need as arguments, never from a context of their own."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field


@dataclass
class ExecutionResources:
    """Limits on what one execution may use; ``None`` is "detect"."""
    cpu: float | None = None
    gpu: float | None = None
    object_store_memory: int | None = None  # bytes of blocks in flight at once


@dataclass
class ExecutionOptions:
    resource_limits: ExecutionResources = field(default_factory=ExecutionResources)
    # Outputs come out in the dataset's order (tray's default; Ray's is False).
    preserve_order: bool = True
    verbose_progress: bool = False


@dataclass
class DataContext:
    execution_options: ExecutionOptions = field(default_factory=ExecutionOptions)
    # The share of a node's object store (the smallest) that one execution's
    # blocks may take when resource_limits.object_store_memory is not set.
    object_store_memory_fraction: float = 0.5
    # Per-operator progress bars on stderr, shown only when it is a terminal.
    enable_progress_bars: bool = True
    # Rows per batch of map_batches when batch_size="default" (Ray's 1024).
    default_batch_size: int = 1024
    # Retries of a data task whose worker or node died (re-execution through
    # lineage counts too). Bounded, unlike Ray Data's, so a crash loop ends.
    task_max_retries: int = 20
    # Calls queued at once on each actor of an actor pool.
    max_tasks_in_flight_per_actor: int = 2
    # Tasks in flight per operator when no concurrency is given: this many
    # per CPU of the cluster.
    tasks_in_flight_per_cpu: float = 2.0
    # Rows per block that shuffles, sorts and read sampling aim for.
    target_num_rows_per_block: int = 1_000_000
    # Operators an execution may hold; a plan longer than this is a bug.
    operators_max: int = 1000

    _current = None
    _lock = threading.Lock()

    @staticmethod
    def get_current() -> DataContext:
        """The process's context (created on first use)."""
        with DataContext._lock:
            if DataContext._current is None:
                DataContext._current = DataContext()
            return DataContext._current

    @staticmethod
    def _set_current(context: DataContext | None) -> None:
        with DataContext._lock:
            DataContext._current = context
