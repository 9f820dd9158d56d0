"""Workload pieces over actors: a ledger actor with several callers
(``actors``), actors restarted without limit (``restarts``), one whose
process the workload crashes between calls that are never retried
(``restarts_unretried``, not a piece of ``mixed``) and a named actor looked
up after the faults (``named``).

Each piece is a function ``(program) -> None`` that submits work through the
public API and records what the reference model expects of each ref
(``program.expect``); its randomness comes only from ``program.rng``."""

from __future__ import annotations

import itertools
import time

import tray

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
    (it restarts without limit)."""
    rng = program.rng
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
