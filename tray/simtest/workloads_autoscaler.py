"""The autoscaler workload: bursts of work onto a cluster that must grow
for it, under the seed's faults, with boot failures injected.

The work needs the resource ``scaled``, which only autoscaled node types
have, so every unit of it runs on nodes the autoscaler launched: bursts of
tasks (with the seed's retry budget), a few actors, a placement group
whose bundles need ``scaled`` too (PACK, SPREAD, STRICT_PACK or
STRICT_SPREAD), and in some seeds tasks that need the GPU (and ``accel``)
only the ``gpu`` type has, and a ``request_resources`` floor (with an infeasible bundle in
some) standing while the work runs. The config (``max_workers``, the
period, the idle timeout, ``small``'s ``min_workers``) is drawn per seed. The simulated provider boots nodes
after a seeded delay and fails a seeded share of the boots; when the
seed's faults kill processes, the workload also crashes one autoscaled node
while it runs work.

Reference models and invariants (``model_autoscaler`` holds the policy's
model, checked at every round the monitor plays: launches for demand, only
for demand, infeasible shapes reported, idle nodes terminated and only
they):

* every task returns its input doubled, every actor call its running sum,
  the placement group's task its value (or an error the faults permit): the
  runner checks them like any workload's;
* ``autoscaler-node-bounds``: after every autoscaler round, no node type
  has more nodes (booting or running) than its ``max_workers``, nor the
  cluster more than ``max_workers``;
* ``autoscaler-scales-down``: once the work is done, its actors killed and
  its group removed, and ``idle_timeout + one period`` (plus a heartbeat
  and a period for the last lease's return to be reported and read) have
  passed, no node beyond ``min_workers`` remains that is busy or has been
  idle longer than ``idle_timeout + one period`` (a node launched for
  demand reported just before the work ended may still be counting down;
  a node whose store holds objects stays: the results the runner reads
  later may live there);
* ``autoscaler-terminates-only-idle-nodes``: the provider saw no node
  terminated with a lease or an object in its store;
* ``autoscaler-scaled-up``: the work ran, so at least one node was launched;
* ``autoscaler-runs-every-period``: a round starts one period after the
  last one ended;
* the model's invariants, each round (see ``model_autoscaler``).
"""

from __future__ import annotations

import time

import tray

WORK_TIMEOUT_S = 200.0
# A bundle no node type holds: request_resources of it is reported infeasible.
INFEASIBLE_BUNDLE = {"scaled": 64.0}


def make_config(rng) -> dict:
    """The seed's cluster config: the bounds and timers vary, the node types
    stay (``small``'s min_workers varies)."""
    return {
        "cluster_name": "simtest",
        "max_workers": rng.choice([5, 6, 8]),
        "upscaling_speed": rng.choice([0.5, 1.0]),
        "idle_timeout_minutes": rng.choice([8.0, 12.0]) / 60.0,
        "autoscaler_period_s": rng.choice([1.0, 1.0, 2.0]),
        "head_node_type": "head",
        "available_node_types": {
            "head": {"resources": {}, "max_workers": 0},
            "small": {"resources": {"CPU": 2, "scaled": 2}, "min_workers": rng.choice([0, 1]),
                      "max_workers": 4},
            "large": {"resources": {"CPU": 4, "scaled": 4}, "min_workers": 0, "max_workers": 2},
            # "accel": the GPU tasks need it, so a GPU on a cluster node of
            # the seed's shape does not serve them; they need no "scaled" nor
            # CPU, which the actors and the placement group (on any scaled
            # node) may hold until the end.
            "gpu": {"resources": {"CPU": 2, "GPU": 1, "accel": 1, "scaled": 2},
                    "min_workers": 0, "max_workers": 1},
        },
        "provider": {"type": "sim", "boot_delay_s": [0.5, 3.0],
                     "boot_failure_probability": 0.2},
    }


def _violation(invariant: str, message: str):
    from .invariants import InvariantViolation

    return InvariantViolation(invariant, message)


@tray.remote(resources={"scaled": 1})
def _scaled_double(value: int, sleep_s: float) -> int:
    time.sleep(sleep_s)
    return 2 * value


@tray.remote(resources={"accel": 1}, num_gpus=1, num_cpus=0)
def _scaled_gpu(value: int) -> int:
    time.sleep(0.3)
    return 3 * value


@tray.remote(resources={"scaled": 1})
class _ScaledSum:
    def __init__(self) -> None:
        self.total = 0

    def add(self, value: int) -> int:
        time.sleep(0.2)
        self.total += value
        return self.total


def autoscaler_bursts(program) -> None:
    import random

    import tray.autoscaler as autoscaler
    from tray.autoscaler.sdk import request_resources
    from tray.simtest import cluster as current_cluster
    from tray.util.placement_group import placement_group, remove_placement_group
    from tray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    from .model_autoscaler import DemandTruth, PolicyModel

    rng = program.rng
    # What this workload added later draws from an RNG of its own, so that
    # the original draws (and the seeds pinned by them) stay as they were.
    cluster = current_cluster()
    extra = random.Random(f"{cluster.seed}:autoscaler-variations")
    config = make_config(extra)
    monitor = autoscaler.start(config)
    model = PolicyModel(monitor.config)
    # The demand that really waits, read from the components (never from
    # what they report), for autoscaler-launches-only-for-real-demand.
    truth = DemandTruth(cluster)
    truth.install()
    model.truth = truth
    counts_seen: list = []
    rounds: list = []  # (start, end) of each round, virtual time
    original_round = monitor.run_once
    policy = monitor.autoscaler
    original_update = policy.update

    def provider_nodes() -> list:
        # The provider's own record: its nodes() reports a failed boot once
        # and forgets it, which would take the report from the policy.
        return [node for _, node in sorted(monitor.provider._nodes.items())]

    def checked_update(load, nodes, now, objects_held=None):
        decisions = original_update(load, nodes, now, objects_held)
        try:
            truth.sample(cluster.clock.current_time())
            model.check_round(load, nodes, now, objects_held, decisions, policy.status)
        except Exception as error:  # noqa: BLE001 - the model's own bug: never the round's
            model.violations.append(("simtest-model-runs", f"the policy's model raised "
                                     f"{type(error).__name__}: {error}"))
        return decisions
    policy.update = checked_update

    idle_since: dict = {}  # provider id -> since when this workload saw it idle

    async def checked_round():
        started = cluster.clock.current_time()
        model.load_read_at = started  # (the round reads the load first)
        try:
            decisions = await original_round()
        finally:
            rounds.append((started, cluster.clock.current_time()))
            del rounds[:-2000]
        now = cluster.clock.current_time()
        nodes = provider_nodes()
        by_type: dict = {}
        for node in nodes:
            by_type[node.node_type] = by_type.get(node.node_type, 0) + 1
        counts_seen.append((now, len(nodes), by_type))
        del counts_seen[:-2000]
        # Idleness judged here from the round's reading, not from the
        # policy's own timers (a policy that resets them would hide itself).
        load, objects = monitor.last_load
        loads = {node.node_id: node for node in load.nodes}
        for node in nodes:
            seen = loads.get(node.node_id)
            idle = seen is not None and seen.leases == 0 and seen.bundles == 0 and \
                objects.get(node.node_id, 0) == 0 and \
                all(seen.available.get(name, 0.0) + 1e-9 >= amount
                    for name, amount in seen.total.items())
            if idle:
                idle_since.setdefault(node.provider_id, now)
            else:
                idle_since.pop(node.provider_id, None)
        return decisions
    monitor.run_once = checked_round

    requested = []
    if extra.random() < 0.5:
        requested = [{"CPU": 1, "scaled": 1}] * extra.randint(1, 6)
        if extra.random() < 0.5:
            requested.append(dict(INFEASIBLE_BUNDLE))
        request_resources(bundles=requested)
    retries = program.task_retries()
    refs, labels = [], []
    for burst in range(rng.randint(2, 3)):
        for i in range(rng.randint(4, 16)):
            value = rng.randint(0, 1000)
            ref = _scaled_double.options(max_retries=retries).remote(
                value, rng.choice([0.2, 0.5, 1.5]))
            program.expect(ref, 2 * value, label=f"burst {burst} task {i}", retries=retries)
            refs.append(ref)
            labels.append(f"burst {burst} task {i}")
        time.sleep(rng.choice([0.5, 2.0]))
    actors = [_ScaledSum.options(max_restarts=-1, max_task_retries=-1).remote()
              for _ in range(rng.randint(1, 3))]
    for index, actor in enumerate(actors):
        ref = actor.add.remote(index + 1)
        program.expect(ref, index + 1, label=f"actor {index} first call", actor_call=True,
                       unlimited=True)
        refs.append(ref)
        labels.append(f"actor {index}")
    gpu_refs = []
    for i in range(extra.choice([0, 0, 1, 3])):
        value = extra.randint(0, 1000)
        ref = _scaled_gpu.options(max_retries=-1).remote(value)
        program.expect(ref, 3 * value, label=f"GPU task {i}", unlimited=True)
        gpu_refs.append(ref)
        refs.append(ref)
        labels.append(f"GPU task {i}")
    strategy = rng.choice(["PACK", "SPREAD"])
    if extra.random() < 0.5:
        strategy = extra.choice(["STRICT_PACK", "STRICT_SPREAD"])
    group = placement_group([{"CPU": 1, "scaled": 1}] * 2, strategy=strategy)
    group_ref = _scaled_double.options(
        max_retries=-1, scheduling_strategy=PlacementGroupSchedulingStrategy(group)).remote(
        21, 0.3)
    program.expect(group_ref, 42, label=f"task in a {strategy} placement group", unlimited=True)
    refs.append(group_ref)
    labels.append("placement group task")

    if program.kills:
        def crash_one() -> None:
            running = [node for _, node in sorted(monitor.provider._nodes.items())
                       if node.node_id and cluster.is_alive(node.node_id)]
            if running:
                program.kill_node(running[0].node_id, restart_after_s=None)
        cluster.at(rng.uniform(2.0, 5.0), crash_one)

    def scale_down() -> None:
        ready, _ = tray.wait(refs, num_returns=len(refs), timeout=WORK_TIMEOUT_S,
                             fetch_local=False)
        if len(ready) < len(refs):
            # A round that broke the policy's model explains the hang.
            _check_model(model, rounds, monitor.config.autoscaler_period_s, [])
            stuck = [labels[i] for i, ref in enumerate(refs) if ref not in ready]
            gcs = cluster.processes.get(cluster.gcs_address)
            if gcs is not None and gcs.component is not None:
                table = gcs.component.actor_manager.actors
                stuck += [(table[a._actor_id].state, table[a._actor_id].node_id,
                           table[a._actor_id].restarts) for a in actors
                          if a._actor_id in table]
            for address, process in sorted(cluster.processes.items()):
                if address.endswith("/raylet") and process.component is not None:
                    leases = process.component.leases
                    stuck.append((address, dict(leases.available), [
                        (w.request.owner, w.request.for_actor and w.request.for_actor[:8])
                        for w in leases.waiting], len(leases.leases)))
            raise _violation("no-hang", f"{stuck} of {len(refs)} units of "
                             f"work did not finish within {WORK_TIMEOUT_S} s of virtual time; "
                             f"autoscaler status: {monitor.status}; decisions: "
                             f"{monitor.decisions[-10:]}")
        # Read the group's task's result before removing its group: the
        # read pulls a copy to the driver's node. Its only copy may live on
        # the node crash_one crashes (when the seed stores small results in
        # the node's store), and a task whose group is gone cannot be
        # re-executed: its reconstruction would fail with
        # TaskPlacementGroupRemoved, as in Ray (chaos seed 3: the group was
        # removed at 6.1 s, its task's node crashed at 6.4 s, the runner's
        # read at 22 s found the object lost). An error here is the
        # runner's to judge when it reads the ref again.
        # The GPU tasks' results too, while the autoscaler runs: only a
        # scaled ``gpu`` node can re-run them, and crash_one may take the
        # node that holds them; read after the monitor stopped, a lost one
        # waited for a GPU node nobody would launch (chaos seeds 109, 315).
        for ref in [group_ref, *gpu_refs]:
            try:
                tray.get(ref, timeout=WORK_TIMEOUT_S)
            except Exception:  # noqa: BLE001 - judged by the runner's read
                pass
        for actor in actors:
            tray.kill(actor)
        remove_placement_group(group)
        if requested:
            request_resources(bundles=[])
        queue_draw = random.Random(f"{cluster.seed}:autoscaler-group-queue")
        if queue_draw.random() < 0.5:
            _queue_in_placed_group(program, cluster, monitor, truth, queue_draw)
        done_at = cluster.clock.current_time()
        # Idle timeout + one period, + a heartbeat and a period for the last
        # lease's return to be reported and read.
        period_s = monitor.config.autoscaler_period_s
        cluster.advance(monitor.config.idle_timeout_s + 2 * period_s
                        + 2 * cluster.config.heartbeat_period_s + 1.0)
        monitor.stop()
        truth.uninstall()
        _check(monitor, cluster, counts_seen, done_at, idle_since)
        _check_model(model, rounds, period_s, requested)
    program.later(scale_down)


def _queue_in_placed_group(program, cluster, monitor, truth, draw) -> None:
    """A placed group whose two bundles are busy, with more of its tasks
    queued for them, while nothing else waits: the queue is no demand for a
    new node (the group holds its resources; Ray), so no round may launch
    for it (autoscaler-launches-only-for-real-demand). The idle nodes go
    first, leaving the queue little free room to be packed into. The
    group's bundles stop counting as demand a window after it is placed;
    only then do its tasks come."""
    from tray.util.placement_group import placement_group, remove_placement_group
    from tray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    config = monitor.config
    cluster.advance(config.idle_timeout_s + 2 * config.autoscaler_period_s +
                    2 * cluster.config.heartbeat_period_s + 1.0)
    strategy = draw.choice(["PACK", "SPREAD", "STRICT_PACK"])
    group = placement_group([{"CPU": 1, "scaled": 1}] * 2, strategy=strategy)
    if not group.wait(timeout_seconds=WORK_TIMEOUT_S):
        raise _violation("no-hang", f"a {strategy} group of two bundles was not placed "
                         f"within {WORK_TIMEOUT_S} s; autoscaler status: {monitor.status}")
    cluster.advance(truth.window_s + config.autoscaler_period_s)
    scheduling = PlacementGroupSchedulingStrategy(group)
    refs = []
    for i in range(2 + draw.randint(3, 8)):
        value = draw.randint(0, 1000)
        ref = _scaled_double.options(max_retries=-1, scheduling_strategy=scheduling).remote(
            value, 2.0)
        program.expect(ref, 2 * value, label=f"queued {strategy} group task {i}",
                       unlimited=True)
        refs.append(ref)
    ready, _ = tray.wait(refs, num_returns=len(refs), timeout=WORK_TIMEOUT_S,
                         fetch_local=False)
    if len(ready) < len(refs):
        raise _violation("no-hang", f"{len(refs) - len(ready)} of {len(refs)} tasks queued "
                         f"in a placed {strategy} group did not finish within "
                         f"{WORK_TIMEOUT_S} s; autoscaler status: {monitor.status}")
    for ref in refs:  # a copy at the driver before the group goes (see scale_down)
        try:
            tray.get(ref, timeout=WORK_TIMEOUT_S)
        except Exception:  # noqa: BLE001 - judged by the runner's read
            pass
    remove_placement_group(group)


def _check(monitor, cluster, counts_seen: list, done_at: float, idle_since: dict) -> None:
    config = monitor.config
    for at_s, total, by_type in counts_seen:
        if total > config.max_workers:
            raise _violation("autoscaler-node-bounds",
                             f"{total} worker nodes at t={at_s:.3f}, max_workers is "
                             f"{config.max_workers}")
        for name, count in sorted(by_type.items()):
            if count > config.node_types[name].max_workers:
                raise _violation("autoscaler-node-bounds",
                                 f"{count} {name} nodes at t={at_s:.3f}, its max_workers is "
                                 f"{config.node_types[name].max_workers}")
    if monitor.provider.violations:
        raise _violation("autoscaler-terminates-only-idle-nodes",
                         "; ".join(monitor.provider.violations[:5]))
    launched = sum(d.count for d in monitor.decisions if d.action == "launch")
    if launched == 0:
        raise _violation("autoscaler-scaled-up", "no node was launched for the work")
    # A node launched late (for demand reported just before the work
    # ended) may be idle for less than the timeout yet: it may stay. Any
    # other node beyond min_workers must be gone.
    now = cluster.clock.current_time()
    idle_s = {provider_id: now - since for provider_id, since in idle_since.items()}
    limit_s = config.idle_timeout_s + config.autoscaler_period_s
    left: dict = {}
    for node in sorted(monitor.provider._nodes.values(), key=lambda n: n.provider_id):
        if node.state != "running":  # a replacement may be booting: not idle yet
            continue
        if node.node_id and not cluster.is_alive(node.node_id):
            # Crashed (a fault): its last reading stands until the GCS
            # declares it dead (node_death_timeout_s), then it is lost.
            continue
        left.setdefault(node.node_type, []).append(node.provider_id)
    for name, node_type in sorted(config.node_types.items()):
        if name == config.head_node_type or len(left.get(name, [])) <= node_type.min_workers:
            continue
        overdue = [provider_id for provider_id in left[name]
                   if idle_s.get(provider_id, float("inf")) >= limit_s and
                   not _holds_objects(monitor, provider_id)]
        if len(left[name]) - len(overdue) < node_type.min_workers:
            overdue = overdue[node_type.min_workers - (len(left[name]) - len(overdue)):]
        if overdue:
            after_s = cluster.clock.current_time() - done_at
            raise _violation("autoscaler-scales-down",
                             f"{name} node(s) {overdue} remain {after_s:.1f} s after the work ended, not idle or idle longer "
                             f"than the idle timeout ({config.idle_timeout_s:g} s) + one "
                             f"period ({config.autoscaler_period_s:g} s) (min_workers "
                             f"{node_type.min_workers}); their last reading: "
                             f"{_readings(monitor, left[name])}; status: {monitor.status}")


def _check_model(model, rounds: list, period_s: float, requested: list) -> None:
    from .model_autoscaler import _shape, period_gaps

    found = model.first_violation()
    if found is not None:
        invariant, message = found
        more = len(model.violations) - 1
        raise _violation(invariant, message + (f" (and {more} more)" if more else ""))
    gap = period_gaps(rounds, period_s)
    if gap is not None:
        raise _violation("autoscaler-runs-every-period", gap)
    if INFEASIBLE_BUNDLE in requested and _shape(INFEASIBLE_BUNDLE) not in model.infeasible_seen:
        raise _violation("autoscaler-reports-infeasible",
                         f"request_resources asked for {INFEASIBLE_BUNDLE} while "
                         f"{model.rounds} rounds ran, and no round's load held it")


def _holds_objects(monitor, provider_id: str) -> bool:
    """Whether the last reading saw objects in the node's store: the
    workload's results are still referenced (the runner reads them after
    this check), so such a node is rightly kept (when the seed's knobs
    store small results in the node's store rather than inline)."""
    load, objects = monitor.last_load
    by_id = {node.provider_id: node.node_id for node in monitor.provider._nodes.values()}
    return objects.get(by_id.get(provider_id), 0) > 0


def _readings(monitor, provider_ids: list) -> list:
    """What the last round read of these nodes (for a failure's message)."""
    load, objects = monitor.last_load
    by_id = {node.provider_id: node.node_id for node in monitor.provider._nodes.values()}
    loads = {node.node_id: node for node in load.nodes}
    found = []
    for provider_id in provider_ids:
        node = loads.get(by_id.get(provider_id))
        found.append((provider_id, None if node is None else
                      (f"leases={node.leases}", f"bundles={node.bundles}",
                       f"store_bytes={objects.get(node.node_id)}",
                       f"free={node.available}", f"total={node.total}")))
    return found


WORKLOADS = {"autoscaler": autoscaler_bursts}
