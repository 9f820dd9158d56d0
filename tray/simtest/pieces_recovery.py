"""Workload piece: copies of large results on several nodes while the node
that made them dies (``copies``), so that object recovery runs while good
copies live elsewhere: a reader that asked where the object was before
another node's copy was known, and whose pull from the dying node failed,
asks the owner to recover it, and the owner must keep (and point it to)
the copy on the live node, free none of the good copies and re-run
nothing (the simulator's ``recovery-keeps-good-copies`` check,
tray/backends/sim/cluster_checks.py, judges that after every step).

The node that made them is slowed first (its pulls take tens of
milliseconds instead of one), and the crash lands while the readers are
pulling from it."""

from __future__ import annotations

import tray

from .remote_code import array_sum, make_array


def copies(program, *, alone: bool = False) -> None:
    from tray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from . import cluster as current_cluster

    rng = program.rng
    head = tray.get_runtime_context().get_node_id()
    alive = sorted(node["NodeID"] for node in tray.nodes() if node["Alive"])
    others = [node for node in alive if node != head]
    if len(alive) < 3 or not others:
        return
    victim = rng.choice(others)
    readers = [node for node in alive if node != victim]
    rng.shuffle(readers)
    size = 20_000  # 160 KB: past the inline limit, so the values live in node stores
    cluster = current_cluster()
    made = []
    for i in range(rng.randint(2, 4)):
        made.append(make_array.options(
            max_retries=-1, scheduling_strategy=NodeAffinitySchedulingStrategy(
                victim, soft=True)).remote(program.key(f"copies{i}", retries=-1), size,
                                           float(i)))
    tray.wait(made, num_returns=len(made), timeout=program.wait_timeout_s, fetch_local=False)
    kill = (alone or program.kills) and victim in {
        node["NodeID"] for node in tray.nodes() if node["Alive"]}
    if kill:
        cluster.slow_node(victim, float(rng.choice([10, 30, 60])))

    def read_on(node: str, wave: int) -> list:
        where = NodeAffinitySchedulingStrategy(node, soft=True)
        sums = []
        for i, ref in enumerate(made):
            total = array_sum.options(max_retries=-1, scheduling_strategy=where).remote(
                program.key(f"copies{i}-read{wave}-{node[:6]}", retries=-1), ref)
            program.expect(total, float(size * i), label=f"copy {i} read on a node "
                           f"(wave {wave})", unlimited=True)
            sums.append(total)
        return sums

    # Every node reads them at once: a reader whose pull from the dying
    # node fails may have asked where they were before another reader's
    # copy was known (the owner then knows more copies than it lost).
    sums = [total for node in readers for total in read_on(node, 0)]
    if kill:
        # The crash comes once the first copy was pulled from it (a moment
        # later): the other readers' pulls are under way then.
        _until_pulled_from(cluster, victim, sums, deadline_s=0.5)
        tray.wait(sums, num_returns=len(sums), timeout=rng.uniform(0.0, 0.02),
                  fetch_local=False)
        if cluster.is_alive(victim):
            program.kill_node(victim, restart_after_s=round(rng.uniform(0.05, 0.5), 3))
        try:
            cluster.slow_node(victim, 1.0)
        except ValueError:
            pass  # replaced on its machine meanwhile (a restart), and the GCS forgot it
    del sums
    for i, ref in enumerate(made):
        program.expect(ref, ("array", size, float(i)), label=f"copied result {i}",
                       unlimited=True)


def _until_pulled_from(cluster, node_id: str, refs: list, deadline_s: float) -> None:
    """Let the work run until a node pulled a copy from ``node_id`` (by the
    trace), or for ``deadline_s``."""
    trace = cluster.trace
    read = trace.event_count
    waited = 0.0
    while waited < deadline_s:
        tray.wait(refs, num_returns=len(refs), timeout=0.002, fetch_local=False)
        waited += 0.002
        fresh = min(trace.event_count - read, len(trace.events))
        read = trace.event_count
        if any(event["event"] == "object_pulled" and
               node_id.startswith(str(event.get("source", "-")))
               for event in list(trace.events)[len(trace.events) - fresh:]):
            return
