"""Where a task attempt is in its life: Ray's ``TaskStatus`` names.

Its owner moves a pending task through the first three
(``worker/task_manager``) and ends it ``FINISHED`` or ``FAILED``; the worker
that runs an attempt records ``RUNNING`` and its own end
(``worker/task_events``). The GCS merges both into one row per attempt
whose state is the furthest reached (``gcs/task_event_table``), in the
order the members are listed here.

A ``StrEnum``, valued by the names themselves: the text is what the state
API, the timeline and the dashboards show, and what task events carry. A
member is equal to its text and hashes as it, so rows read back from the
wire (plain strings) look up in tables keyed by members. What leaves the
process is the text (``.value``), never the member: a pickled member names
this class, and a trace renders it differently."""

from __future__ import annotations

import enum


class TaskStatus(enum.StrEnum):
    PENDING_ARGS_AVAIL = "PENDING_ARGS_AVAIL"  # waiting for its by-reference arguments
    # Queued for a lease (an actor call: waiting for its actor to be alive);
    # a retry comes back here.
    PENDING_NODE_ASSIGNMENT = "PENDING_NODE_ASSIGNMENT"
    SUBMITTED_TO_WORKER = "SUBMITTED_TO_WORKER"  # pushed to a worker (sent to its actor)
    RUNNING = "RUNNING"  # the executor's: it began running the attempt
    FINISHED = "FINISHED"  # it returned its results
    FAILED = "FAILED"  # it ended with an error (raised, or without results)


# The order a task goes through them (a row's state is the furthest reached).
STATUS_ORDER = {status: rank for rank, status in enumerate(TaskStatus)}
