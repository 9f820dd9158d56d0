"""Tunables of the runtime, each with its unit in its name.

The limits here bound what grows with load (TigerBeetle's "put a limit on
everything"); what is bounded otherwise, and why, is listed in
docs/architecture.md ("Limits")."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Config:
    # Objects at most this large travel inside messages and live in the
    # owner's in-process memory store; larger ones go to the node's store.
    inline_object_max_bytes: int = 100 * 1024
    # Objects move between node stores in chunks of at most this size.
    object_chunk_bytes: int = 4 * 1024 * 1024
    heartbeat_period_s: float = 0.5
    # A node that has not heartbeated for this long is declared dead.
    node_death_timeout_s: float = 10.0
    # Calls to the GCS keep retrying this long while it restarts.
    gcs_reconnect_timeout_s: float = 60.0
    # Pack tasks on the local node until it is this busy, then spread.
    local_utilization_threshold: float = 0.5
    # Lease requests an owner keeps outstanding per scheduling class.
    pending_lease_requests_max: int = 16
    # How often an owner re-asks for a lease that no node can satisfy.
    infeasible_retry_period_s: float = 1.0
    # Spillback hops before a node queues a request locally.
    spillback_hops_max: int = 1
    # Worker processes that may fail to start in a row before lease
    # requests fail with the reason.
    worker_start_failures_max: int = 5
    # Idle workers beyond one per CPU are stopped after this long.
    idle_worker_timeout_s: float = 10.0
    # Workers per node, whatever the requests say.
    workers_per_node_max: int = 256
    # Calls held per caller at an actor: waiting for an earlier call to
    # arrive, or finished but above the caller's floor (their replies are
    # kept for a re-send). A call beyond it fails with ActorError.
    actor_pending_calls_max: int = 100_000
    # Finished tasks kept to re-create their lost results (the oldest go
    # first, and their results can no longer be re-created).
    lineage_tasks_max: int = 100_000
    default_max_concurrency_async: int = 1000
    # A request on a connection waiting longer than this is a bug or a hang.
    rpc_pending_calls_max: int = 1_000_000
    # How often a node asks the owners of the objects in its store whether
    # they still know those copies (a copy made by a task attempt whose reply
    # was lost, and re-run elsewhere, is known to nobody and would leak).
    object_reconcile_period_s: float = 2.0
    # Reliable one-way messages waiting for one destination's acknowledgment
    # (it is unreachable): beyond this the oldest are dropped, with an error.
    reliable_unacked_max: int = 100_000
    # How long reliable messages wait for a peer that stopped answering.
    reliable_retention_s: float = 30.0
    # The memory monitor (Ray's): every ``memory_monitor_refresh_s`` a node
    # reads its machine's memory use, and above ``memory_usage_threshold``
    # (a fraction of the total) kills one worker, retriable tasks first.
    # A refresh period of 0 turns the monitor off.
    memory_usage_threshold: float = 0.95
    memory_monitor_refresh_s: float = 0.25
    # Why the node killed workers (lease id -> cause), kept for their owners
    # to ask: the oldest go beyond this many.
    worker_kill_causes_max: int = 10_000
    # How long an owner waits for a node to say why a worker died before it
    # treats the death as a plain crash.
    worker_failure_cause_timeout_s: float = 5.0
    # A retriable task killed for memory is retried this many times, apart
    # from its max_retries (-1: without end, Ray's default), after
    # base * 2**(its kills - 1) seconds, at most the max (Ray's backoff).
    task_oom_retries: int = -1
    oom_retry_delay_base_s: float = 1.0
    oom_retry_delay_max_s: float = 60.0
    # Task events (worker/task_events.py, gcs/task_event_table.py): what the
    # state API and the timeline show. Each process sends its buffer to the
    # GCS every flush period; a buffer holds at most buffer_max task
    # attempts (further ones are dropped and counted), the GCS keeps the
    # newest gcs_max (Ray's defaults: 1 s, 100k). TRAY_TASK_EVENTS=0 in the
    # processes' environment turns them off too.
    task_events_enabled: bool = True
    task_events_flush_period_s: float = 1.0
    task_events_buffer_max: int = 100_000
    task_events_gcs_max: int = 100_000
    # tray.experimental.internal_kv: keys the GCS keeps for users, and the
    # largest value it takes.
    user_kv_keys_max: int = 100_000
    user_kv_value_bytes_max: int = 64 * 1024 * 1024


DEFAULT_CONFIG = Config()
