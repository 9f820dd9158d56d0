"""Workload pieces over actors: a ledger actor with several callers
(``actors``), actors restarted without limit (``restarts``; in some seeds
with faults, one's node is then cut off past its death timeout: it must be
declared dead, its calls come back from the next incarnations while it is
cut off, and once healed it must fence itself), one whose process the
workload crashes between calls that are never retried
(``restarts_unretried``, not a piece of ``mixed``), a named actor looked up
after the faults (``named``; in most seeds an actor also creates a detached
and an owned actor and ends: the detached one outlives it, the owned one
dies with it and frees its name) and actors in a placement group that is
removed (``removed_group``, also run by the ``groups`` workload: they end at
once with the group-removed cause, their bundle node cut off or not).
The invariants these raise are named in ``checks_actors``' docstring.

Each piece is a function ``(program) -> None`` that submits work through the
public API and records what the reference model expects of each ref
(``program.expect``); its randomness comes only from ``program.rng``."""

from __future__ import annotations

import itertools
import random
import time

import tray
from tray import exceptions

from .invariants import InvariantViolation
from .remote_code import Account, Squarer, account_caller, add


def _balances(total: int, fallible: list[int]):
    """What a balance may be: ``total``, less the amounts of any of the
    ``fallible`` deposits (whose calls may have failed without running)."""
    if not fallible:
        return total
    return ("one of", *sorted({total - sum(chosen) for size in range(len(fallible) + 1)
                               for chosen in itertools.combinations(fallible, size)}))


def actors(program) -> None:
    """A ledger actor with several callers: the driver and tasks."""
    rng = program.rng
    key = program.key("account")
    restarts = rng.choice([0, 0, 1, 3]) if program.kills else 0
    task_retries = rng.choice([0, 1, -1]) if restarts else 0
    options = {"max_restarts": restarts, "max_task_retries": task_retries}
    style = rng.choice(["plain", "named", "detached"])
    if style != "plain":
        options["name"] = f"{key}-{style}"
    if style == "detached":
        options["lifetime"] = "detached"
    account = program.actor(Account.options(**options), key)
    program.actor_restarts(key, restarts)
    if style != "plain":
        account = tray.get_actor(options["name"])
    state_safe = restarts == 0  # restarted actors lose their balance
    amounts_total = 0
    callers = rng.randint(1, 3)  # caller tasks block in get() on their calls
    driver_amounts = [rng.randint(1, 9) for _ in range(rng.randint(1, 6))]
    # Some amounts come from tasks, so calls become ready out of order and
    # the actor must hold the early arrivals back.
    running = 0
    # The amounts of earlier deposits whose argument is a task's result: a
    # task whose retries all died fails its call, which never runs (the
    # actor goes on), so a balance lacks any of these (chaos seed 586).
    fallible: list[int] = []
    for seq, amount in enumerate(driver_amounts):
        arg = amount
        from_task = rng.random() < 0.4
        if from_task:
            arg = add.remote(program.key("amount", retries=3), amount, 0)
        ref = account.deposit.remote("driver", seq, arg)
        running += amount
        program.expect(ref, _balances(running, fallible) if state_safe and callers == 1
                       else program.ANY_INT, actor_call=True, max_task_retries=task_retries,
                       label="deposit", max_restarts=restarts, actor=account)
        program.actor_call(key, "driver", seq, task_retries)
        if from_task:
            fallible.append(amount)
    amounts_total += sum(driver_amounts)
    for c in range(1, callers):
        amounts = [rng.randint(1, 9) for _ in range(rng.randint(1, 5))]
        caller = program.key(f"caller{c}", retries=0)
        ref = account_caller.options(max_retries=0).remote(caller, account, caller, amounts)
        program.expect(ref, program.ANY_LIST, label="actor caller task", nested=True)
        amounts_total += sum(amounts)
        for seq in range(len(amounts)):
            program.actor_call(key, caller, seq, task_retries)
    final = account.total.remote("driver", len(driver_amounts))
    program.actor_call(key, "driver", len(driver_amounts), task_retries)
    if callers == 1:
        program.expect(final, _balances(amounts_total, fallible) if state_safe
                       else program.ANY_INT, actor_call=True,
                       max_task_retries=task_retries, label="final balance",
                       max_restarts=restarts, actor=account)
    else:
        program.expect(final, program.ANY_INT, actor_call=True, max_task_retries=task_retries,
                       label="balance", max_restarts=restarts, actor=account)


def restarts(program) -> None:
    """Long-lived actors with unlimited restarts and re-sent calls, called
    throughout the fault window: every call must come back with its value."""
    rng = program.rng
    cpus = 0  # holding CPU for the whole run would starve the 1-CPU tasks of other pieces
    actors = [program.actor(Squarer.options(max_restarts=-1, max_task_retries=-1,
                                            num_cpus=cpus), program.key("squarer", retries=-1))
              for _ in range(rng.randint(1, 3))]
    for i in range(rng.randint(10, 40)):
        ref = actors[i % len(actors)].square.remote(i, rng.random() * 0.05)
        program.expect(ref, i * i, label=f"call {i} to a restarting actor", actor_call=True,
                       unlimited=True)
    if program.kills and len(tray.nodes()) >= 2 and rng.random() < 0.5:
        program.later(lambda: _cut_off_past_death(program, actors))


def _cut_off_past_death(program, actors: list) -> None:
    """Once the faults are over: the node of an actor (never the head) is
    cut off by a partition until the GCS declares it dead, with calls in
    flight; then the partition heals, and the node must learn at its next
    heartbeat that it is dead and end itself (``dead-node-fenced``) while
    its actors restart elsewhere and every call comes back; the machine
    then starts a fresh node."""
    sim = tray.simtest.cluster()
    head = sim.node_ids()[0]
    homes = []
    for actor in actors:
        record = _gcs_actor(str(actor._actor_id))
        if record is not None and record.node_id and record.node_id != head and \
                sim.is_alive(record.node_id):
            homes.append(record.node_id)
    if not homes:
        return
    victim = sorted(homes)[0]
    others = [node for node in sim.node_ids() if node != victim and sim.is_alive(node)]
    _own_fault(program, f"partition isolated={victim[:8]}")
    sim.partition([victim], others)
    cut_off_s = sim.clock.current_time()
    refs = []
    for i in range(len(actors)):
        ref = actors[i].square.remote(100 + i, 0.0)
        program.expect(ref, (100 + i) ** 2, label=f"a call to restarting actor {i} while a "
                       "node is cut off past its death", actor_call=True, unlimited=True)
        refs.append(ref)
    from .checks_actors import _gcs

    def declared_dead() -> bool:
        gcs = _gcs(sim)
        record = gcs.node_table.nodes.get(victim) if gcs is not None else None
        return record is not None and not record.alive

    config = sim.config
    timeout_s = config.node_death_timeout_s + 4 * config.heartbeat_period_s
    if not _wait_for(declared_dead, timeout_s, step_s=0.25):
        raise InvariantViolation(SILENT, f"node {victim[:8]}, cut off from every other node "
                                 f"at t={cut_off_s:.3f}s, was not declared dead by the GCS "
                                 f"within {timeout_s} s of virtual time (node_death_timeout_s="
                                 f"{config.node_death_timeout_s})")
    # Its actors restart elsewhere and the calls come back while it is
    # still cut off: nothing waits for a dead node to return.
    ready, pending = tray.wait(refs, num_returns=len(refs), timeout=RECOVER_S,
                               fetch_local=False)
    if pending:
        raise InvariantViolation(RECOVERED, f"{len(pending)} call(s) to restartable actors "
                                 f"on node {victim[:8]}, declared dead by the GCS, did not "
                                 f"come back within {RECOVER_S} s of virtual time while it "
                                 "stayed cut off (they must restart elsewhere)")
    del ready, refs
    _own_fault(program, "heal")
    sim.heal()
    # Fenced (it ends itself: the liveness monitor bounds how soon), then
    # a fresh node on its machine.
    if _wait_for(lambda: not sim.is_alive(victim), 5.0):
        sim.restart_node(victim)
    for i in range(len(actors)):
        ref = actors[i].square.remote(200 + i, 0.0)
        program.expect(ref, (200 + i) ** 2, label=f"a call to restarting actor {i} after a "
                       "node was fenced", actor_call=True, unlimited=True)


def restarts_unretried(program) -> None:
    """An actor with Ray's default ``max_task_retries=0`` (each call at most
    once) and unlimited restarts, whose process the workload crashes itself
    between calls, none in flight: each call made after a crash (before the
    GCS heard of it, during the restart, or after) cannot have run on the
    dead process, so it waits for the new one and comes back with its
    value. Under a schedule that kills, a fault may cut a call off (then it
    may fail); under one that does not, every call must succeed. Not a
    piece of ``mixed``: its own kills would make every seed a killing one."""
    rng = program.rng
    sim = tray.simtest.cluster()
    squarer = program.actor(Squarer.options(max_restarts=-1, max_task_retries=0, num_cpus=0),
                            program.key("unretried", retries=-1))
    for i in range(rng.randint(2, 5)):
        ref = squarer.square.remote(i, rng.random() * 0.02)
        program.expect(ref, i * i, label=f"call {i} after {i} crash(es) of its actor",
                       actor_call=True)
        try:
            tray.get(ref)  # none in flight at the crash (the value is checked later)
        except Exception:  # noqa: BLE001 - judged with the other expectations
            pass
        try:
            sim.kill_actor_worker(squarer)
        except tray.exceptions.TrayError:
            pass  # the GCS is restarting: no crash this round
        time.sleep(rng.choice([0.0, rng.random() * 0.05, rng.random() * 0.5]))


def named(program) -> None:
    """A named actor (detached or not), looked up by name only after the
    faults, GCS restarts included: the name survives, and so does the actor
    (it restarts without limit). Most seeds also have an actor create a
    detached and an owned named actor and end (``lifetimes_of_created``)."""
    rng = program.rng
    if rng.random() < 0.7:
        created_by_an_actor(program)
    name = program.key("named")
    detached = rng.random() < 0.5
    options = {"name": name, "max_restarts": -1, "max_task_retries": -1, "num_cpus": 0}
    if detached:
        options["lifetime"] = "detached"
    handle = program.actor(Squarer.options(**options), program.key("named init", retries=-1))
    x = rng.randint(2, 30)
    program.expect(handle.square.remote(x, 0.0), x * x, label="named actor, first call",
                   actor_call=True, unlimited=True)

    def look_up() -> None:
        found = tray.get_actor(name)  # raises ValueError if the name was lost
        program.expect(found.square.remote(x + 1, 0.0), (x + 1) ** 2,
                       label=f"named actor ({'detached' if detached else 'owned'}) found "
                             "by name after the faults", actor_call=True, unlimited=True)
    program.later(look_up)


# ======================================================= lifetimes by owner

# How long the GCS may take to end an actor whose owner ended (the owner's
# node reports the worker's death, the GCS buries what it owned), in
# virtual seconds once the faults are over.
OWNER_END_S = 10.0
# Removing a placement group ends its actors in the GCS before the call
# returns; a heartbeat period is allowed.
GROUP_END_S = 0.5
WORKERS_GONE_S = 5.0  # (its workers killed, the partition healed)
DETACHED = "detached-actor-outlives-its-creator"
OWNED = "owned-actor-dies-with-its-owner"
REMOVED = "removed-group-ends-its-actors"
SILENT = "silent-node-declared-dead"
RECOVERED = "dead-node-work-recovered"
# How long the calls to a dead node's restartable actors may take to come
# back from their next incarnations (the actor's creation elsewhere).
RECOVER_S = 10.0


@tray.remote
class Creator:
    """Creates a detached named actor and an owned (named) one, keeps their
    handles, and ends when told (killed, or by ``exit_actor``)."""

    def __init__(self) -> None:
        self.made: list = []

    def make(self, key: str, detached_name: str, owned_name: str, x: int) -> list:
        options = {"max_restarts": -1, "max_task_retries": -1, "num_cpus": 0}
        detached = Squarer.options(name=detached_name, lifetime="detached",
                                   **options).remote(f"{key}-detached")
        owned = Squarer.options(name=owned_name, **options).remote(f"{key}-owned")
        self.made = [detached, owned]
        return tray.get([detached.square.remote(x, 0.0), owned.square.remote(x, 0.0)])

    def leave(self) -> None:
        tray.actor.exit_actor()


def _gcs_actor(actor_id: str):
    """The GCS's record of an actor (None while the GCS is down)."""
    from .checks_actors import _gcs

    gcs = _gcs(tray.simtest.cluster())
    return None if gcs is None else gcs.actor_manager.actors.get(actor_id)


def _wait_for(predicate, bound_s: float, step_s: float = 0.05) -> bool:
    """Advance virtual time until ``predicate()`` holds (True) or ``bound_s`` passed."""
    sim = tray.simtest.cluster()
    deadline = sim.clock.current_time() + bound_s
    while not predicate():
        if sim.clock.current_time() >= deadline:
            return False
        sim.advance(step_s)
    return True


def _dead(actor_id: str) -> bool:
    record = _gcs_actor(actor_id)
    return record is not None and record.state.value == "DEAD"


def created_by_an_actor(program) -> None:
    """An actor creates a detached named actor and an owned one, then ends
    (killed or by ``exit_actor``, once the faults are over): as in Ray, the
    detached one outlives it (found by name, it answers), the owned one dies
    with it (its calls raise ActorDiedError, its owner exited)."""
    rng = program.rng
    key = program.key("creator", retries=0)
    detached_name, owned_name = f"{key}-detached", f"{key}-owned"
    creator = program.actor(Creator.options(num_cpus=0, max_restarts=0))
    x = rng.randint(2, 30)
    made = creator.make.remote(key, detached_name, owned_name, x)
    program.expect(made, [x * x, x * x], label="an actor creates a detached and an owned actor",
                   actor_call=True, max_restarts=0, actor=creator)
    by_kill = rng.random() < 0.5

    def end_the_creator() -> None:
        try:
            tray.get(made, timeout=30.0)
            owned = tray.get_actor(owned_name)
        except Exception:  # noqa: BLE001 - a fault ended the creator first (judged above)
            if not program.kills:
                raise
            try:  # (killed at quiescence, if it was made; actor-death-explained judges it)
                program.actors.append(tray.get_actor(detached_name))
            except ValueError:
                pass
            return
        owned_id = str(owned._actor_id)
        if by_kill:
            tray.kill(creator)
        else:
            try:
                tray.get(creator.leave.remote(), timeout=30.0)
            except exceptions.ActorDiedError:
                pass  # (the call that exits is answered so, as in Ray)
        creator_id = str(creator._actor_id)
        _wait_for(lambda: _dead(creator_id), OWNER_END_S)
        ended = _gcs_actor(creator_id)
        cause = ended.death_cause.reason if ended is not None and ended.death_cause else ""
        # (Under faults its worker may have died of one before it was ended.)
        if ended is not None and not (ended.state.value == "DEAD" and (program.kills or (
                cause.startswith("the actor was killed" if by_kill else
                                 "the actor exited by itself")))):
            raise InvariantViolation(OWNED, f"the creator actor, ended by "
                                     f"{'tray.kill' if by_kill else 'exit_actor'}, is "
                                     f"{ended.state.value} by the GCS ({cause!r})")
        if not _wait_for(lambda: _dead(owned_id), OWNER_END_S):
            record = _gcs_actor(owned_id)
            raise InvariantViolation(OWNED, f"actor {owned_id} ({owned_name}), owned by an "
                                     f"actor that ended ({'tray.kill' if by_kill else 'exit_actor'}"
                                     f") {OWNER_END_S} s ago, is "
                                     f"{record.state.value if record else '?'} by the GCS")
        try:
            value = tray.get(owned.square.remote(x, 0.0), timeout=30.0)
        except exceptions.ActorDiedError as error:
            if "owner" not in str(error):
                raise InvariantViolation(OWNED, f"a call to actor {owned_name}, whose owner "
                                         f"ended, raised {type(error).__name__} for another "
                                         f"cause: {str(error)[:300]}") from None
        except exceptions.GetTimeoutError:
            raise InvariantViolation(OWNED, f"a call to actor {owned_name}, dead with its "
                                     "owner, did not fail within 30 s") from None
        else:
            raise InvariantViolation(OWNED, f"a call to actor {owned_name}, whose owner "
                                     f"ended, returned {value!r}")
        # A dead actor's name is free (Ray): not found, and taken again.
        try:
            found = tray.get_actor(owned_name)
        except ValueError:
            pass
        else:
            raise InvariantViolation(OWNED, f"get_actor({owned_name!r}) found actor "
                                     f"{found._actor_id} after it died with its owner")
        try:
            again = program.actor(Squarer.options(name=owned_name, num_cpus=0),
                                  program.key("named again", retries=-1))
        except ValueError as error:
            raise InvariantViolation(OWNED, f"the name {owned_name!r} of an actor dead with "
                                     f"its owner could not be taken again: {error}") from None
        program.expect(again.square.remote(x + 2, 0.0), (x + 2) ** 2, actor_call=True,
                       max_restarts=0, actor=again,
                       label=f"a new actor named {owned_name}, its first holder dead")
        try:
            detached = tray.get_actor(detached_name)
        except ValueError as error:
            record = _gcs_actor_by_name(detached_name)
            if program.kills and _arguments_lost(record):
                return  # (a restart needs its constructor's arguments, as in Ray)
            raise InvariantViolation(DETACHED, f"the detached actor {detached_name} was not "
                                     f"found by name after its creator ended: {error}"
                                     + (f"; the GCS: {record.state.value}, "
                                        f"{record.death_cause}" if record else "")) from None
        program.actors.append(detached)  # (killed at quiescence)
        program.expect(detached.square.remote(x + 1, 0.0), (x + 1) ** 2, actor_call=True,
                       unlimited=True, label=f"detached actor {detached_name}, its creator "
                       "ended")
    program.later(end_the_creator)


def _arguments_lost(record) -> bool:
    """Did the actor die because its constructor's argument was lost with
    its owner (a worker a fault killed; named default seed 485: an argument
    through the store, a BUGGIFY knob, owned by the creator's worker)?"""
    from tray.core.serialization import deserialize

    cause = None if record is None else record.death_cause
    if cause is None or cause.error is None or record.state.value != "DEAD":
        return False
    try:
        error = deserialize(cause.error)
    except Exception:  # noqa: BLE001 - not an error we can read: not excused
        return False
    return isinstance(error, (exceptions.OwnerDiedError, exceptions.ObjectLostError))


def _gcs_actor_by_name(name: str):
    from .checks_actors import _gcs

    gcs = _gcs(tray.simtest.cluster())
    if gcs is None:
        return None
    for record in gcs.actor_manager.actors.values():
        if record.spec.name == name:
            return record
    return None


def _own_fault(program, what: str) -> None:
    """Record a fault the piece causes itself (as the injector records its
    own), so that the checks attribute what it causes."""
    sim = tray.simtest.cluster()
    text = f"t={sim.clock.current_time():.3f}s {what} (by the workload)"
    sim.trace.record("simtest", "fault", what="heal" if what == "heal" else text)
    program.own_faults.append(text)


def removed_group(program) -> None:
    """Actors placed in a placement group's bundles, called, then the group
    removed once the faults are over (its bundle node cut off by a
    partition meanwhile, in some seeds): as in Ray, every actor in it is
    ended with the group-removed cause at once (DEAD by the GCS within
    ``GROUP_END_S``), and a call to one raises ActorPlacementGroupRemoved,
    whatever its restart budget."""
    from tray.util import placement_group, remove_placement_group
    from tray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    rng = program.rng
    nodes = [node for node in tray.nodes() if node["Alive"]]
    count = rng.randint(1, 3)
    strategy = rng.choice(["PACK", "SPREAD"] + (["STRICT_SPREAD"] if len(nodes) >= count
                                                 else []))
    # Half the groups are named (a draw of their own: the program's draws
    # stay as they were): a name is taken while the group lives, and free
    # again once it is removed.
    name = program.key("removed-group") \
        if random.Random(f"{tray.simtest.cluster().seed}:{count}:{strategy}").random() < 0.5 \
        else ""
    group = placement_group([{"CPU": 0.25} for _ in range(count)], strategy=strategy,
                            name=name)
    program.placement_groups.append(group)  # (removed below; at quiescence if not)
    actors, calls = [], []
    for index in range(count):
        restarts = rng.choice([0, 1, -1]) if program.kills else rng.choice([0, -1])
        where = PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=index)
        actor = Squarer.options(num_cpus=0.25, max_restarts=restarts,
                                max_task_retries=-1 if restarts else 0,
                                scheduling_strategy=where).remote(
            program.key(f"in group bundle {index}", retries=-1))
        x = rng.randint(2, 30)
        ref = actor.square.remote(x, rng.random() * 0.05)
        budget = {"max_restarts": restarts, "actor": actor} if restarts >= 0 else {}
        program.expect(ref, x * x, label=f"actor in bundle {index} of a {strategy} group",
                       actor_call=True, unlimited=restarts == -1, **budget)
        actors.append(actor)
        calls.append(ref)
    cut_off = program.kills and len(nodes) >= 2 and rng.random() < 0.5

    def remove() -> None:
        sim = tray.simtest.cluster()
        # Their first calls answered (or failed) first: a call still on its
        # way when the group goes fails with it (judged with the expectations).
        ready, pending = tray.wait(calls, num_returns=len(calls), timeout=30.0,
                                   fetch_local=False)
        del ready
        calls.clear()
        if pending:
            return  # (removed at quiescence, once they are judged)
        before = {str(actor._actor_id): _gcs_actor(str(actor._actor_id)) for actor in actors}
        if any(record is None for record in before.values()):
            return  # the GCS is down: removed at quiescence
        dead_before = {actor_id for actor_id, record in before.items()
                       if record.state.value == "DEAD"}
        victim = None
        if cut_off:
            head = sim.node_ids()[0]
            homes = sorted({record.node_id for record in before.values()
                            if record.node_id and record.node_id != head and
                            record.state.value == "ALIVE" and sim.is_alive(record.node_id)})
            if homes:
                victim = homes[0]
                others = [node for node in sim.node_ids() if node != victim and
                          sim.is_alive(node)]
                _own_fault(program, f"partition isolated={victim[:8]}")
                sim.partition([victim], others)
        if name:
            _check_group_name(name, group, taken=True)
        try:
            remove_placement_group(group)
            program.placement_groups.remove(group)
            ended = _wait_for(lambda: all(_dead(actor_id) for actor_id in before), GROUP_END_S)
            if not ended:
                alive = {actor_id: _gcs_actor(actor_id) for actor_id in before}
                raise InvariantViolation(REMOVED, "after remove_placement_group, actors of the "
                                         "group are not DEAD by the GCS within "
                                         f"{GROUP_END_S} s: " + ", ".join(
                                             f"{actor_id[:8]} {record.state.value}"
                                             for actor_id, record in alive.items()
                                             if record is not None and
                                             record.state.value != "DEAD")
                                         + (f" (bundle node {victim[:8]} cut off)" if victim
                                            else ""))
        finally:
            if victim is not None:
                _own_fault(program, "heal")
                sim.heal()
        if name:
            _check_group_name(name, group, taken=False)
        # A call sent while an actor's worker still runs may run there, as
        # in Ray (the GCS has the worker killed after it ends the actor): its
        # calls are judged once the workers are gone (unreferenced-actor-ends
        # bounds how soon).
        workers = [f"/worker-{record.worker_id[:12]}" for record in before.values()
                   if record.worker_id]
        _wait_for(lambda: not any(process.alive and address.endswith(workers_of)
                                  for address, process in sim.processes.items()
                                  for workers_of in workers), WORKERS_GONE_S)
        for actor in actors:
            actor_id = str(actor._actor_id)
            try:
                value = tray.get(actor.square.remote(1, 0.0), timeout=30.0)
            except exceptions.ActorPlacementGroupRemoved:
                continue
            except exceptions.ActorDiedError as error:
                if actor_id in dead_before or _worker_killed(sim, before[actor_id]):
                    continue  # it had died of something else first
                raise InvariantViolation(REMOVED, f"a call to actor {actor_id} after its "
                                         "placement group was removed raised "
                                         f"{type(error).__name__}, not "
                                         f"ActorPlacementGroupRemoved: {str(error)[:300]}") \
                    from None
            except exceptions.GetTimeoutError:
                raise InvariantViolation(REMOVED, f"a call to actor {actor_id} after its "
                                         "placement group was removed did not fail within "
                                         "30 s") from None
            else:
                raise InvariantViolation(REMOVED, f"a call to actor {actor_id} after its "
                                         f"placement group was removed returned {value!r}")
    program.later(remove)


def _worker_killed(sim, record) -> bool:
    """Did a fault kill this actor's worker (or its node)? The GCS may hear
    of that after the group's removal, and end the actor for it (groups
    chaos seed 491): as in Ray, the first death it hears of is the cause."""
    worker, node = record.worker_id or "", record.node_id or ""
    return any(event.get("component") == "fault" and (
        (event.get("event") == "kill_worker" and worker and
         str(event.get("worker", "")).startswith(worker[:12])) or
        (event.get("event") == "kill_node" and node and event.get("node") == node))
        for event in sim.trace.events)


def _check_group_name(name: str, group, taken: bool) -> None:
    """``placement-group-names-unique``: while its group lives a name finds
    it and cannot be given to another; once it is removed the name is free:
    another group takes it, and is found by it (then removed)."""
    from tray.util import get_placement_group, placement_group, remove_placement_group

    violation = "placement-group-names-unique"
    if taken:
        if get_placement_group(name) != group:
            raise InvariantViolation(violation, f"get_placement_group({name!r}) is not the "
                                     "group of that name")
        try:
            other = placement_group([{"CPU": 0.25}], name=name)
        except ValueError:
            return
        remove_placement_group(other)
        raise InvariantViolation(violation, f"a second placement group took the name {name!r} "
                                 "while the first lived")
    try:
        found = get_placement_group(name)
    except ValueError:
        found = None
    if found is not None:
        raise InvariantViolation(violation, f"get_placement_group({name!r}) found a group "
                                 "after it was removed")
    try:
        again = placement_group([{"CPU": 0.25}], name=name)
    except ValueError as error:
        raise InvariantViolation(violation, f"the name {name!r} of a removed group was not "
                                 f"free again: {error}") from None
    try:
        if get_placement_group(name) != again:
            raise InvariantViolation(violation, f"get_placement_group({name!r}) is not the "
                                     "new group of that name")
    finally:
        remove_placement_group(again)


def groups_removed(program) -> None:
    """The ``groups`` workload: the placement groups piece, then actors in
    a group that is removed (``removed_group``)."""
    from .pieces_tasks import placement_groups

    placement_groups(program)
    removed_group(program)
