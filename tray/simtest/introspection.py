"""Introspection of a running simulated cluster, for the reports of a
failing seed: who waits on whom (``wait_for_graph``, shown when work hangs)
and what is still held at quiescence (``leaks``). Both read the frozen
``statistics()`` records of the live core workers and node managers (the
processes that hold work; the GCS's record is read too and passed over)
and the node stores, never their private fields."""

from __future__ import annotations


def _components(cluster) -> list:
    return [(address, process.component)
            for address, process in sorted(cluster.processes.items())
            if process.alive and process.component is not None]


DEAD_OWNER = " (DEAD owner)"


def _dead(cluster, address) -> str:
    if not address or address == cluster.gcs_address:
        return ""
    process = cluster.processes.get(address)
    return "" if process is not None and process.alive else DEAD_OWNER


def _statistics(cluster) -> list:
    """(address, statistics) of every live simulated process's core
    component: core workers, node managers and the GCS (whose record the
    reports below pass over: it holds no task)."""
    found = []
    for address, component in _components(cluster):
        statistics = getattr(component, "statistics", None)
        if statistics is not None:
            found.append((address, statistics()))
    return found


def wait_for_graph(cluster) -> str:
    """Who waits on whom: pending tasks and where they are, queued lease
    requests, actor calls held back for a sequence gap."""
    from ..core.node.node_manager import NodeManagerStatistics
    from ..core.worker.core_worker import CoreWorkerStatistics

    lines = []
    for address, stats in _statistics(cluster):
        if isinstance(stats, CoreWorkerStatistics):
            for task in stats.tasks.pending:
                where = f"running on {task.pushed_to}" if task.pushed_to else \
                    "waiting for its arguments or a lease"
                if task.actor_id:
                    where = f"call #{task.seq} to actor {task.actor_id[:8]}"
                lines.append(f"{address} waits for task {task.name} {task.task_id[:12]} "
                             f"(attempt {task.attempt}): {where}")
            for queue in stats.submitter.queues:
                if queue.queued or queue.lease_requests:
                    lines.append(f"{address} has {queue.queued} queued task(s), "
                                 f"{queue.lease_requests} lease request(s) outstanding, "
                                 f"{queue.leases} lease(s)")
            for caller in stats.actor_host.callers:
                if caller.waiting:
                    lines.append(f"{address} (actor {str(stats.actor_host.actor_id)[:8]}) holds "
                                 f"calls #{list(caller.waiting)} from {caller.caller} until "
                                 f"call #{caller.next_seq} arrives")
        elif isinstance(stats, NodeManagerStatistics):
            for owner, resources in stats.leases.waiting:
                lines.append(f"{address} queues a lease for {owner}{_dead(cluster, owner)} "
                             f"needing {resources} (available {stats.leases.available})")
            for lease in stats.leases.leases:
                lines.append(f"{address} lease {lease.lease_id} (worker {lease.worker_id[:8]}, "
                             f"{lease.resources}) is held by {lease.owner}"
                             f"{_dead(cluster, lease.owner)}"
                             + (f" for actor {lease.for_actor[:8]}" if lease.for_actor else ""))
    return "\n".join(lines) or "(nothing is waiting: the work was lost)"


def leaks(cluster) -> list[str]:
    """What is still held at quiescence and should not be."""
    from ..core.node.node_manager import NodeManagerStatistics
    from ..core.worker.core_worker import CoreWorkerStatistics

    found = []
    for address, stats in _statistics(cluster):
        if isinstance(stats, CoreWorkerStatistics):
            if stats.tasks.pending:
                found.append(f"{address} still tracks {len(stats.tasks.pending)} task(s)")
            owned = [oid[:12] + (f" (borrowers {list(borrowers)})" if borrowers else "")
                     for oid, borrowers in stats.references.owned_objects]
            if owned:
                found.append(f"{address} still owns object(s) nobody references: "
                             f"{owned[:5]}")
        elif isinstance(stats, NodeManagerStatistics):
            if stats.leases.leases:
                found.append(f"{address} has lease(s) not returned: "
                             f"{[lease.lease_id for lease in stats.leases.leases]} (owners "
                             f"{sorted({lease.owner for lease in stats.leases.leases})})")
            for name, total in sorted(stats.leases.total.items()):
                available = stats.leases.available.get(name, 0.0)
                if abs(available - total) > 1e-9:
                    found.append(f"{address} has {available} of {total} {name} available")
            busy = [worker_id[:8] for worker_id in stats.workers.busy_workers]
            if busy:
                found.append(f"{address} has workers still busy: {busy}")
    for index, store in enumerate(cluster.stores):
        if f"n{index}/raylet" not in cluster.processes:
            continue
        left = store.statistics().object_ids
        if left:
            found.append(f"node {index}'s object store still holds {len(left)} object(s) "
                         f"({', '.join(o.hex()[:12] for o in left[:5])})")
    return found


def public_resource_view(cluster) -> list[str]:
    """What the public API says of the cluster's resources at quiescence:
    ``cluster_resources()`` the alive node managers' totals summed, and
    ``available_resources()`` all of it (nothing is held); the object
    store's capacity, which no lease holds, aside."""
    import tray

    from ..core.node.node_manager import NodeManagerStatistics

    truth: dict = {}
    for _address, stats in _statistics(cluster):
        if isinstance(stats, NodeManagerStatistics):
            for name, amount in stats.leases.total.items():  # (no object_store_memory)
                truth[name] = truth.get(name, 0.0) + amount
    total, available = tray.cluster_resources(), tray.available_resources()
    found = []
    for what, view in (("cluster_resources()", total), ("available_resources()", available)):
        wrong = {name: (view.get(name, 0.0), truth.get(name, 0.0))
                 for name in sorted(set(view) | set(truth)) if name != "object_store_memory"
                 and abs(view.get(name, 0.0) - truth.get(name, 0.0)) > 1e-6}
        if wrong:
            found.append(f"{what} disagrees with the alive nodes' totals at quiescence "
                         f"(name: (said, true)): {wrong}")
    return found
