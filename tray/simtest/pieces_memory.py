"""Workload piece under memory pressure (``memory``): tasks whose simulated
memory rises as they work (``remote_code.memory_hog``), from the driver
and from other owners (``MemoryOwner`` actors), some retried and some not,
several to a node, so the node's memory monitor kills and the owners retry;
and an actor that holds memory (``MemoryActor``), alone on its node at the
end, so the monitor kills it and it restarts.

Judged against tray's documented policy (tray/core/node/memory_monitor.py,
Ray's "Out-Of-Memory Prevention", group-by-owner):

* every kill picks the victim the policy names among the leases the
  monitor saw (each ``memory_kill`` event lists them): retriable tasks
  before non-retriable ones before actors; the largest owner group (equal
  groups: the one whose oldest grant is newest); the newest grant in it;
  and only above the threshold (``memory-monitor-kills-by-policy``);
* above the threshold with work to kill, a kill comes within two refresh
  periods (``memory-monitor-acts-above-threshold``);
* a task killed with others of its owner beside it is retried, out of a
  budget of its own (its ``max_retries`` untouched): ``OutOfMemoryError``
  only for a task not retried (``max_retries=0``) or its owner's last
  there (``out-of-memory-error-only-when-the-policy-gives-up``); such a
  task fails with ``OutOfMemoryError`` and does not run again
  (``memory-kill-without-retry-fails-with-OutOfMemoryError``); runs at most
  ``1 + max_retries`` plus the retried memory kills;
* values exact; an actor call fails only when a kill hit the actor, and
  the restarted actor answers;
* a process that ends gives its memory back
  (``memory-returned-when-process-ends``).

In ``mixed`` the piece runs last, once the other pieces' work is done (the
monitor may kill any work on a node short of memory, and their checks do
not expect that); if that work is not done in time, its tasks allocate
almost nothing."""

from __future__ import annotations

import re

import tray
from tray import exceptions

from . import remote_code
from .invariants import InvariantViolation
from .model import Expectation

QUIET_S = 60.0  # how long the piece waits, in mixed, for the other pieces' work
WAIT_S = 90.0  # how long it watches its own work (sampling memory)
SAMPLE_S = 0.1  # memory sampling period, virtual seconds
LIVENESS_S = 120.0
_KILLED_WORKER = re.compile(r"killed worker ([0-9a-f]+)")
_UNRETRIED_ERRORS = (exceptions.ActorDiedError, exceptions.ActorUnavailableError)


def memory(program, alone: bool = False) -> None:
    rng = program.rng
    sim = tray.simtest.cluster()
    total = sim.memory_usage(sim.node_ids()[0]).total_bytes
    quiet = True
    if not alone:
        refs = [e.ref for e in program.expectations]
        if refs:
            _, pending = tray.wait(refs, num_returns=len(refs), timeout=QUIET_S,
                                   fetch_local=False)
            quiet = not pending
        del refs
    cpus = rng.choice([0.25, 0.5, 0.5, 1])
    owners = [None] + [program.actor(remote_code.MemoryOwner.options(num_cpus=0))
                       for _ in range(rng.randint(0, 2))]
    batches: dict = {index: [] for index in range(len(owners))}
    tasks = []  # (key, x, max_retries, owner index)
    for i in range(rng.randint(6, 16)):
        key = program.key("memory hog", retries=-1)  # counted here, with the memory kills
        fraction = rng.uniform(0.15, 0.45) if quiet else 0.001
        retries = rng.choice([0, 1, 3, -1])
        owner = rng.randrange(len(owners))
        item = (key, i, int(total * fraction), rng.randint(1, 4), rng.uniform(0.05, 0.3),
                retries, cpus)
        batches[owner].append(item)
        tasks.append((key, i, retries, owner))
    refs: dict = {}
    for index, owner in enumerate(owners):
        items = batches[index]
        if owner is None:
            for item in items:
                key, x, size, steps, step_s, retries, task_cpus = item
                refs[key] = remote_code.memory_hog.options(
                    max_retries=retries, num_cpus=task_cpus).remote(key, x, size, steps, step_s)
        elif items:
            try:
                handed = tray.get(owner.submit.remote(items), timeout=WAIT_S)
            except Exception:  # noqa: BLE001 - a fault took the owner: none of these ran
                handed = [None] * len(items)
            for item, ref in zip(items, handed, strict=True):
                refs[item[0]] = ref
    actor = None
    calls = []  # (label, ref, kind)
    if rng.random() < 0.6:
        key = program.key("memory actor", retries=-1)
        actor = program.actor(remote_code.MemoryActor.options(
            max_restarts=1, max_task_retries=0, num_cpus=0), key)
        if quiet and rng.random() < 0.5:  # beside the tasks: they go first
            calls.append(("grab beside tasks", actor.grab.remote(int(total * 0.3), 0.5), "grab"))
    samples = _watch(sim, [ref for ref in refs.values() if ref is not None] +
                     [ref for _, ref, _ in calls])
    if actor is not None:
        if quiet:  # alone on its node (its tasks done): the monitor kills the actor
            calls.append(("grab alone", actor.grab.remote(int(total * 0.97), 0.8), "grab"))
            samples += _watch(sim, [calls[-1][1]])
        x = rng.randint(2, 30)
        calls.append(("ping after the grabs", actor.ping.remote(x), ("ping", x)))
    program.later(lambda: _judge(program, sim, tasks, refs, calls, samples))


def _watch(sim, refs: list) -> list:
    """Wait for ``refs`` (at most WAIT_S), sampling every node's memory:
    [(t, node id, used, total)]."""
    samples = []
    pending = list(refs)
    start = sim.clock.current_time()
    while pending and sim.clock.current_time() - start < WAIT_S:
        _, pending = tray.wait(pending, num_returns=len(pending), timeout=SAMPLE_S,
                               fetch_local=False)
        now = sim.clock.current_time()
        for node in sim.node_ids():
            try:
                reading = sim.memory_usage(node)
            except Exception:  # noqa: BLE001 - a node that is gone
                continue
            samples.append((now, node, reading.used_bytes, reading.total_bytes))
    return samples


# ================================================================ the model


def expected_victim(candidates: list) -> tuple[int, bool] | None:
    """The documented policy, on the leases the monitor saw: (the lease
    whose worker goes, whether its task is retried). ``candidates``:
    (lease, granted, retriable, actor, owner)."""
    tasks = [c for c in candidates if not c[3]]
    tiers = ([c for c in tasks if c[2]], [c for c in tasks if not c[2]],
             [c for c in candidates if c[3]])
    for tier_index, tier in enumerate(tiers):
        if not tier:
            continue
        groups: dict = {}
        for candidate in tier:
            groups.setdefault(candidate[4] if tier_index == 0 else "", []).append(candidate)
        group = max(groups.values(), key=lambda members: (len(members),
                                                          min(m[1] for m in members)))
        victim = max(group, key=lambda member: member[1])
        return victim[0], tier_index == 0 and len(group) > 1
    return None


def _parse(candidates: str) -> list:
    parsed = []
    for entry in candidates.split(";") if candidates else []:
        lease, granted, retriable, actor, owner = entry.split(":", 4)
        parsed.append((int(lease), int(granted), retriable == "1", actor, owner))
    return parsed


def memory_kills(cluster) -> list:
    """The monitor's kills from the trace, each checked against the policy:
    [(t, node prefix, worker id, retried by the policy)]."""
    threshold = cluster.config.memory_usage_threshold
    kills = []
    for event in cluster.trace.events:
        if event["event"] != "memory_kill":
            continue
        where = f"the memory monitor of node {event['component']} at t={event['t']:.6f}"
        if event["used_bytes"] <= threshold * event["total_bytes"]:
            raise InvariantViolation(
                "memory-monitor-kills-by-policy",
                f"{where} killed worker {event['worker'][:8]} with {event['used_bytes']} of "
                f"{event['total_bytes']} bytes used, not above memory_usage_threshold "
                f"{threshold}")
        candidates = _parse(event.get("candidates", ""))
        expected = expected_victim(candidates)
        if expected is None or expected[0] != event["lease"]:
            listing = ", ".join(f"lease {c[0]} (grant #{c[1]}, "
                                f"{'actor' if c[3] else 'retriable' if c[2] else 'not retried'}"
                                f", owner {c[4][-12:]})" for c in candidates)
            raise InvariantViolation(
                "memory-monitor-kills-by-policy",
                f"{where} killed the worker of lease {event['lease']}; the policy (retriable "
                f"tasks, then tasks not retried, then actors; the largest owner group; its "
                f"newest grant) names lease {expected[0] if expected else None} among: "
                f"{listing}")
        kills.append((event["t"], event["component"], event["worker"], expected[1]))
    return kills


# ================================================================ the checks


def _judge(program, sim, tasks, refs, calls, samples) -> None:
    ledger = remote_code.LEDGER
    kills = memory_kills(sim)
    _check_acts(sim, kills, samples)
    # The run of each task that each kill cut off (its body had begun on
    # that worker and not ended).
    starts: dict = {}  # (key, worker) -> [start times]
    ends: dict = {}
    for key, function, worker, _address, t in ledger.runs:
        if function == "memory_hog":
            starts.setdefault((key, worker), []).append(t)
        elif function == "memory_hog:end":
            ends.setdefault((key, worker), []).append(t)
    # key -> [(kill time, retried by the policy, its body had ended)]: the
    # last run on the killed worker before the kill was this task's (a run
    # whose body ended may not have sent its reply yet: killed, it is
    # retried as well).
    latest: dict = {}  # worker -> [(start, key)]
    for (key, worker), began in starts.items():
        latest.setdefault(worker, []).extend((t, key) for t in began)
    cut: dict = {}
    for t, _node, worker, retried in kills:
        before = [run for run in latest.get(worker, []) if run[0] <= t]
        if not before:
            continue
        start, key = max(before)
        ended = any(start <= e <= t for e in ends.get((key, worker), []))
        cut.setdefault(key, []).append((t, retried, ended))
    deadline = sim.clock.current_time() + LIVENESS_S
    for key, x, retries, owner in tasks:
        label = f"memory hog {key} (max_retries={retries}, owner #{owner})"
        runs = ledger.executions.get(key, 0)
        retried_kills = sum(1 for _, retried, _ in cut.get(key, []) if retried)
        if retries >= 0 and runs > 1 + retries + retried_kills:
            raise InvariantViolation(
                "task-executes-at-most-1+max_retries",
                f"{label} ran {runs} times; max_retries={retries} and {retried_kills} memory "
                f"kill(s) the policy retries allow {1 + retries + retried_kills}")
        gave_up = [t for t, retried, ended in cut.get(key, []) if not retried and not ended]
        # (The owner asks the node why its worker died: a fault in between
        # may leave it a plain crash, retried within max_retries.)
        strict = not program.kills and all(_quiet_around(sim, t) for t in gave_up)
        ref = refs.get(key)
        if ref is None:
            continue  # its owner died before handing it over
        error = _get(ref, label, sim, deadline)
        if error is None:
            if gave_up and strict:
                raise InvariantViolation(
                    "memory-kill-without-retry-fails-with-OutOfMemoryError",
                    f"{label}: the memory monitor killed it at t={gave_up[0]:.6f} where the "
                    "policy does not retry it (not retried, or its owner's last task on the "
                    "node), and it came back with a value")
            continue
        if isinstance(error, exceptions.OutOfMemoryError):
            # The kill it names (its task may have been on its way to the
            # worker, its body not begun).
            match = _KILLED_WORKER.search(str(error))
            named = [retried for _, _, worker, retried in kills
                     if match is not None and worker.startswith(match.group(1))]
            if retries != 0 and (not named or all(named)):
                why = "none found" if not named else "others of its owner ran there"
                raise InvariantViolation(
                    "out-of-memory-error-only-when-the-policy-gives-up",
                    f"{label}: got OutOfMemoryError, and the memory kill it names was one the "
                    f"policy retries ({why}): {str(error)[:400]}")
            if not gave_up:
                continue
            later = [t for t, _, _ in cut.get(key, []) if t > gave_up[0]]
            if later:
                raise InvariantViolation(
                    "memory-kill-without-retry-fails-with-OutOfMemoryError",
                    f"{label}: ran again after the kill at t={gave_up[0]:.6f} that gave it up "
                    f"(killed again at t={later[0]:.6f})")
            continue
        if gave_up and strict:
            raise InvariantViolation(
                "memory-kill-without-retry-fails-with-OutOfMemoryError",
                f"{label}: killed for memory at t={gave_up[0]:.6f} (not retried by the "
                f"policy), and failed with {type(error).__name__}: {str(error)[:400]}")
        _delegate(program, ref, x * x + 1, label, retries, error)
    _check_backoff(sim)
    _check_actor_calls(program, sim, calls, kills, deadline)
    _check_memory_returned(program, sim)


def _get(ref, label, sim, deadline):
    from .introspection import wait_for_graph

    try:
        tray.get(ref, timeout=max(0.0, deadline - sim.clock.current_time()))
    except exceptions.GetTimeoutError:
        raise InvariantViolation("no-hang", f"{label} ({ref!r}) did not resolve within "
                                 f"{LIVENESS_S} s of virtual time after the faults stopped; "
                                 "who waits on whom:\n" + wait_for_graph(sim)) from None
    except Exception as error:  # noqa: BLE001 - judged by the caller
        return error
    return None


def _delegate(program, ref, expected, label, retries, error) -> None:
    from .checks import check_error

    check_error(program, Expectation(ref, expected, label,
                                     budget=retries if retries >= 0 else None), error)


def _quiet_around(sim, t: float) -> bool:
    """No fault (but worker kills) acted from a second before ``t`` until
    the owner's question about a death there is answered or given up."""
    from .attribution import fault_spans

    if sim.trace.event_count > len(sim.trace.events):
        return False
    until = t + sim.config.worker_failure_cause_timeout_s
    return not any(span.start_s <= until and span.end_s >= t - 1.0 and
                   span.kind not in ("kill_worker", "memory_kill")
                   for span in fault_spans(list(sim.trace.events), sim.node_ids()[0]))


def _check_backoff(sim) -> None:
    """A task killed for memory runs again only after its backoff:
    ``oom_retry_delay_base_s * 2 ** (its memory kills - 1)``, at most
    ``oom_retry_delay_max_s`` (a node short of memory is not handed the
    same work at once)."""
    if sim.trace.event_count > len(sim.trace.events):
        return
    config = sim.config
    retried: dict = {}  # task -> (kills so far, when the last was retried)
    for event in sim.trace.events:
        if event["event"] == "task_retry" and event.get("reason") == "out of memory":
            kills = retried.get(event["task"], (0, 0.0))[0] + 1
            retried[event["task"]] = (kills, event["t"])
        elif event["event"] == "task_started" and event["task"] in retried:
            kills, since = retried[event["task"]]
            delay = min(config.oom_retry_delay_base_s * 2 ** (kills - 1),
                        config.oom_retry_delay_max_s)
            if event["t"] < since + delay - 1e-6:
                raise InvariantViolation(
                    "memory-kill-retried-after-its-backoff",
                    f"task {event.get('name')} {event['task'][:12]} ran again at "
                    f"t={event['t']:.6f}, {event['t'] - since:.3f} s after its memory kill "
                    f"#{kills} was retried at t={since:.6f}; its backoff is {delay} s")
            del retried[event["task"]]


def _check_acts(sim, kills, samples) -> None:
    """Above the threshold, with something to kill, a kill comes within two
    refresh periods (and a sample's margin), unless a fault held the node."""
    from .attribution import fault_spans

    config = sim.config
    if config.memory_monitor_refresh_s <= 0:
        return
    bound = 2 * config.memory_monitor_refresh_s + 2 * SAMPLE_S
    spans = fault_spans(list(sim.trace.events), sim.node_ids()[0]) \
        if sim.trace.event_count <= len(sim.trace.events) else None
    above: dict = {}  # node -> since
    for t, node, used, total in sorted(samples):
        if used <= config.memory_usage_threshold * total:
            above.pop(node, None)
            continue
        since = above.setdefault(node, t)
        if t - since <= bound:
            continue
        if spans is None or any(span.start_s <= t and span.end_s >= since - 1.0 and
                                span.kind != "kill_worker" for span in spans):
            continue
        if not any(since - config.memory_monitor_refresh_s <= kill_t <= t and
                   node.startswith(kill_node) for kill_t, kill_node, _, _ in kills):
            raise InvariantViolation(
                "memory-monitor-acts-above-threshold",
                f"node {node[:8]}'s memory was above memory_usage_threshold "
                f"{config.memory_usage_threshold} ({used} of {total} bytes) from t={since:.3f} "
                f"to t={t:.3f}, and its monitor (every {config.memory_monitor_refresh_s} s) "
                "killed nothing")
        above[node] = t  # a kill came: the next stretch counts from here


def _check_actor_calls(program, sim, calls, kills, deadline) -> None:
    grabs = [run for run in remote_code.LEDGER.runs if run[1] == "MemoryActor.grab"]
    killed = {worker for _, _, worker, _ in kills}
    for label, ref, kind in calls:
        error = _get(ref, label, sim, deadline)
        if error is not None and not isinstance(error, _UNRETRIED_ERRORS):
            # (A result lost with a node the faults crashed, say.)
            _delegate(program, ref, kind, f"memory actor, {label}", -1, error)
            continue
        if kind == "grab":
            if error is None:
                continue
            if isinstance(error, _UNRETRIED_ERRORS) and \
                    any(worker in killed for _, _, worker, _, _ in grabs):
                continue
            if program.kills and isinstance(error, _UNRETRIED_ERRORS):
                continue
            raise InvariantViolation(
                "get-returns-model-value",
                f"memory actor, {label}: failed with {type(error).__name__}: "
                f"{str(error)[:400]}, and no memory kill or fault hit the actor")
        elif error is not None:
            if program.kills and isinstance(error, _UNRETRIED_ERRORS):
                continue
            raise InvariantViolation(
                "get-returns-model-value",
                f"memory actor, {label}: failed with {type(error).__name__}: "
                f"{str(error)[:400]}; it restarts once (max_restarts=1) and only one grab "
                "alone could be killed")
        else:
            value = tray.get(ref)
            if value[0] != kind[1] ** 2:
                raise InvariantViolation("get-returns-model-value",
                                         f"memory actor, {label}: got {value!r}, the model "
                                         f"says ({kind[1] ** 2}, an incarnation)")


def _check_memory_returned(program, sim) -> None:
    """Every process that ended gave its memory back, and (all this piece's
    work done, each body freeing what it took) no live one holds any,
    unless a fault cut a body off whose process lives on."""
    for index, machine in enumerate(sim.memory):
        for address, size in sorted(machine.holders().items()):
            process = sim.processes.get(address)
            if process is None or not process.alive:
                raise InvariantViolation(
                    "memory-returned-when-process-ends",
                    f"machine {index}: process {address}, which has ended, still holds "
                    f"{size} bytes of its memory")
            if not program.kills:
                raise InvariantViolation(
                    "memory-returned-when-process-ends",
                    f"machine {index}: process {address} still holds {size} bytes after "
                    "every task and call that allocated there freed what it took or died")
