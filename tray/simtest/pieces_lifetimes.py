"""Workload pieces over lifetimes: actors that end because every handle to
them is gone (``lifetimes``), and placement groups that wait for resources
to be freed (``waiting_groups``).

``lifetimes``: actors whose handles are passed to tasks (as an argument, in
a list, inside a ``put`` object), kept by another actor, made and dropped
inside a task, then let go of, by the driver during the faults or after
them: Ray's rule is that a non-detached actor ends when its last handle,
its owner's and its borrowers', is gone, and the calls made through a
borrowed handle still come back. Detached actors must not end that way:
each is looked up by name after every handle the program held is gone, and
answers. Once its borrowers are done, the piece tells the liveness monitor
that an actor is unreferenced (``program.liveness.expect_end``), and the
monitor's own ground truth (no live process holds a count of its handle
reference) covers the rest (``unreferenced-actor-ends``,
``actor-outlives-its-handles``).

``waiting_groups``: a placement group of CPU bundles that may have to wait
for the CPUs other work holds, and tasks in it; it is removed once they are
done (``fitting-placement-group-placed`` judges the wait).

Each piece is a function ``(program) -> None``; its randomness comes only
from ``program.rng``."""

from __future__ import annotations

import tray
from tray import exceptions

from . import remote_code
from .invariants import InvariantViolation

# How long the piece's later step waits for the borrowers it needs done
# before it declares their actor unreferenced (virtual seconds; they are
# usually done long before).
USERS_WAIT_S = 30.0


@tray.remote
class Scoped:
    """The actor whose end is watched: it answers calls, nothing else."""

    def __init__(self, key: str) -> None:
        remote_code._ran(f"{key}:init")

    def square(self, x: int) -> int:
        return x * x


@tray.remote
class Keeper:
    """Keeps the handles it is given (in a list: they arrive as handles),
    calls through them, and lets go of them when asked."""

    def __init__(self) -> None:
        self.held: list = []

    def keep(self, boxed: list) -> int:
        self.held.extend(boxed)
        return len(self.held)

    def call_held(self, x: int) -> int:
        return sum(tray.get([handle.square.remote(x) for handle in self.held]))

    def drop(self) -> int:
        count = len(self.held)
        self.held = []
        return count


@tray.remote
def call_boxed(key: str, boxed: list, x: int) -> int:
    """Borrows a handle that came in a list, and calls through it."""
    remote_code._ran(key)
    return tray.get(boxed[0].square.remote(x))


@tray.remote
def call_direct(key: str, handle, x: int) -> int:
    """Borrows a handle passed as an argument, and calls through it."""
    remote_code._ran(key)
    return tray.get(handle.square.remote(x))


@tray.remote
def call_from_put(key: str, boxes: list, x: int) -> int:
    """Reads a ``put`` object holding a handle, and calls through it."""
    remote_code._ran(key)
    handles = tray.get(boxes[0])
    return tray.get(handles[0].square.remote(x))


@tray.remote
def own_actor(key: str, x: int) -> int:
    """Makes an actor of its own (this worker owns it), calls it and lets it
    go: the actor ends although its owner lives on."""
    attempt = remote_code._ran(key)
    scoped = Scoped.options(num_cpus=0).remote(f"{key}#{attempt}")
    return tray.get(scoped.square.remote(x))


def lifetimes(program) -> None:
    """Actors ended by handle scope (see the module docstring)."""
    rng = program.rng
    later: dict = {"keep": [], "keepers": [], "users": {}, "detached": [], "ids": {}}
    retries = 3 if program.kills else 0
    for _ in range(rng.randint(1, 3)):
        key = program.key("scoped", retries=-1)
        restarts = rng.choice([0, 1, -1]) if program.kills else 0
        detached = rng.random() < 0.25
        # (A detached actor lives to quiescence: it holds no CPU, which would
        # starve the rest for good on a small cluster.)
        cpus = 0 if detached else rng.choice([0, 0, 0.5, 1])
        options = {"num_cpus": cpus, "max_restarts": restarts,
                   "max_task_retries": -1 if restarts else 0}
        if detached or rng.random() < 0.3:
            options["name"] = f"{key}-named"
        if detached:
            options["lifetime"] = "detached"
        handle = Scoped.options(**options).remote(key)
        actor_id = str(handle._actor_id)
        label = f"{'detached' if detached else 'scoped'} actor {key}"
        if detached:
            program.actors.append(handle)  # only a kill ends it (at quiescence)
            later["detached"].append((options["name"], key, restarts))
        else:
            later["ids"][actor_id] = label
        unlimited = restarts == -1
        budget = {"max_restarts": restarts, "actor": handle} if restarts >= 0 else {}
        users = later["users"].setdefault(actor_id, [])
        x = rng.randint(2, 30)
        ref = handle.square.remote(x)
        program.expect(ref, x * x, label=f"{label}: a call from the driver", actor_call=True,
                       unlimited=unlimited, **budget)
        users.append(ref)  # (a pending call holds the actor in scope: A.remote().f.remote())
        for use in rng.sample(["boxed", "direct", "put", "keeper"], rng.randint(0, 3)):
            x = rng.randint(2, 30)
            task_key = program.key(f"{use} borrower", retries=retries)
            if use == "boxed":
                ref = call_boxed.options(max_retries=retries, num_cpus=0).remote(
                    task_key, [handle], x)
            elif use == "direct":
                ref = call_direct.options(max_retries=retries, num_cpus=0).remote(
                    task_key, handle, x)
            elif use == "put":
                # (With every argument through the store, a BUGGIFY knob, the
                # list holding this object is kept for the task's lineage,
                # and the object, and the handle in it, with it: the
                # monitor's own count judges that actor's end, not the piece.
                # Such an actor may live to quiescence, so it must hold no
                # CPU, as a detached one: mixed seed 358 starved for good.)
                if cpus:
                    continue
                later["ids"].pop(actor_id, None)
                box = tray.put([handle])
                ref = call_from_put.options(max_retries=retries, num_cpus=0).remote(
                    task_key, [box], x)
                del box
            else:
                keeper = Keeper.options(num_cpus=0).remote()
                kept = keeper.keep.remote([handle])
                program.expect(kept, 1, label=f"{label}: kept by another actor",
                               actor_call=True)
                ref = keeper.call_held.remote(x)
                users.append(kept)
                later["keepers"].append((keeper, actor_id, rng.random() < 0.5))
                del keeper
            users.append(ref)
            program.expect(ref, x * x, label=f"{label}: a call through a borrowed handle "
                           f"({use})", retries=retries)
        if rng.random() < 0.5:
            later["keep"].append(handle)  # let go of after the faults
        del handle  # else: now, while its borrowers may still be at work
    for _ in range(rng.randint(0, 2)):
        x = rng.randint(2, 30)
        ref = own_actor.options(max_retries=retries, num_cpus=0).remote(
            program.key("actor owner", retries=retries), x)
        program.expect(ref, x * x, label="an actor made and let go of inside a task",
                       retries=retries)
    program.later(lambda: _let_go(program, later))


def _let_go(program, later: dict) -> None:
    """After the faults: the driver lets go of the handles it kept; keepers
    drop theirs (or go, with them); detached actors are found by name and
    answer; then each actor whose borrowers are all done is unreferenced."""
    later["keep"].clear()
    waits = []
    for keeper, actor_id, by_call in later.pop("keepers"):
        if by_call:
            ref = keeper.drop.remote()
            later["users"][actor_id].append(ref)
            program.expect(ref, program.ANY_INT, label="a keeper lets go of its handles",
                           actor_call=True)
            waits.append(ref)
        del keeper  # (a keeper not asked goes, and what it held with it)
    for name, key, restarts in later.pop("detached"):
        try:
            found = tray.get_actor(name)
        except ValueError:
            if program.kills and restarts != -1:
                continue  # faults may use up its restarts (actor-death-explained judges why)
            # (Raised here: program.not_ready is read before the later steps run.)
            raise InvariantViolation("detached-actor-outlives-its-handles",
                                     f"detached actor {key} ({name}) was not found by name "
                                     "after its handles were let go of") from None
        program.expect(found.square.remote(7), 49, label=f"detached actor {key} found by "
                       "name after every handle the program held was let go of",
                       actor_call=True)
        del found
    monitor = getattr(program, "liveness", None)
    if monitor is None:
        return
    users = later.pop("users")
    refs = [ref for refs in users.values() for ref in refs]
    if refs:
        tray.wait(refs, num_returns=len(refs), timeout=USERS_WAIT_S, fetch_local=False)
    for actor_id, label in sorted(later.pop("ids").items()):
        pending = [ref for ref in users.get(actor_id, ())
                   if not tray.wait([ref], timeout=0, fetch_local=False)[0]]
        if not pending:
            monitor.expect_end(actor_id, f"{label}, its borrowers done")
    del refs


def waiting_groups(program) -> None:
    """A placement group of CPU bundles that may wait for CPUs other work
    holds (it fits the cluster: never infeasible), tasks in it, and its
    removal once they are done (so that it holds no CPU for long)."""
    from tray.util import placement_group, remove_placement_group
    from tray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    rng = program.rng
    nodes = [node for node in tray.nodes() if node["Alive"]]
    if not nodes:
        return
    cpus = min(node["Resources"].get("CPU", 0.0) for node in nodes)
    if cpus < 1:
        return
    strategy = rng.choice(["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"])
    most = {"STRICT_PACK": int(cpus), "STRICT_SPREAD": len(nodes)}.get(
        strategy, int(cpus) * len(nodes))  # (never infeasible)
    count = rng.randint(1, max(1, min(3, most)))
    # Work that holds the CPUs for a while first (so the group waits for them).
    holding = []
    for i in range(int(sum(node["Resources"].get("CPU", 0.0) for node in nodes))
                   if rng.random() < 0.8 else 0):
        key = program.key("holds a CPU", retries=-1)
        ref = remote_code.sleeper.options(num_cpus=1, max_retries=-1).remote(
            key, rng.uniform(0.05, 0.6))
        program.expect(ref, key, label=f"task {i} that holds a CPU before the group")
        holding.append(key)
    for _ in range(20):  # (until they run: the group must wait for them)
        if all(remote_code.LEDGER.executions.get(key) for key in holding):
            break
        tray.wait([program.expectations[-1].ref], timeout=0.01, fetch_local=False)
    group = placement_group([{"CPU": 1.0} for _ in range(count)], strategy=strategy)
    program.placement_groups.append(group)  # (removed below; at quiescence if not)
    refs = []
    for i in range(rng.randint(1, 3)):
        where = PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=-1)
        ref = remote_code.leaf.options(num_cpus=1, max_retries=-1,
                                       scheduling_strategy=where).remote(
            program.key("in a waiting group", retries=-1), i, rng.random() * 0.05)
        program.expect(ref, i * i, label=f"task {i} in a {strategy} group of CPU bundles")
        refs.append(ref)

    def remove() -> None:
        # Read back first: a result lost with its node (the faults are over,
        # but a copy may have gone with a node meanwhile) is re-created by
        # running its task again, in this group (chaos seed 148).
        try:
            tray.get(refs, timeout=USERS_WAIT_S)
        except Exception:  # noqa: BLE001 - judged with the expectations
            return  # its tasks may still need it (removed at quiescence)
        finally:
            refs.clear()
        try:
            remove_placement_group(group)
        except exceptions.TrayError:
            pass  # (removed at quiescence then)
    program.later(remove)


def backlog(program) -> None:
    """More CPU tasks than the cluster has CPUs, of very unequal lengths,
    from the driver and from a task elsewhere: requests queue at busy nodes
    while others finish early, and must move to the nodes that went idle
    (``work-conserving-leases`` judges every wait)."""
    rng = program.rng
    total = int(tray.cluster_resources().get("CPU", 0))
    if total < 1:
        return
    retries = program.task_retries()
    classes = rng.randint(1, 3)  # (leases are not shared across classes)
    for i in range(rng.randint(total + 1, 2 * total + 2)):
        sleep_s = rng.choice([0.01, 0.05, 0.2, rng.uniform(1.0, 4.0)])
        key = program.key(f"backlog {i}")
        ref = remote_code.sleeper.options(num_cpus=1, memory=1e6 * (i % classes + 1),
                                          max_retries=retries).remote(key, sleep_s)
        program.expect(ref, key, label=f"backlog task {i} ({sleep_s:.2f} s)", retries=retries)
        if rng.random() < 0.15:
            # An actor asked for amid the backlog: its creation waits like a task.
            restarts = -1 if program.kills else 0
            actor = Scoped.options(num_cpus=1, max_restarts=restarts,
                                   max_task_retries=restarts).remote(program.key("amid"))
            x = rng.randint(2, 30)
            program.expect(actor.square.remote(x), x * x, label="an actor made amid the backlog",
                           actor_call=True, unlimited=restarts == -1)
            del actor  # (it ends once its call is done)
