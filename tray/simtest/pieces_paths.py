"""Workload piece ``paths``: public-API paths of the core the other pieces
leave alone, each checked against what Ray promises (a piece of ``mixed``,
and a workload of its own). Per seed, ``program.rng`` draws which run:

* ``timeouts``: ``get(ref, timeout=)`` of a task that sleeps raises
  ``GetTimeoutError``; ``wait(timeout=)`` never reports a sleeping task
  ready; ``get`` of a list in which one task fails raises that task's error
  (its class) as soon as it fails, without waiting for the others (checked
  without kills: the sleeper has not got to its end then). On the driver's
  thread path (half the seeds) these are the thread's timed waits.
* ``kv``: a random sequence of ``internal_kv`` puts (with and without
  ``overwrite``), deletes (by key and by prefix) in two namespaces of its own; after
  each, ``get``/``exists``/``list`` answer what a dict model holds (the
  state, not the return values: a GCS call retried across a restart may
  be answered twice).
* ``builtins``: ``__ray_ready__`` answers True; calls queued before
  ``__ray_terminate__`` run in order, the terminate call and every later
  call raise ``ActorDiedError``, and the actor is not restarted (its
  ``max_restarts`` notwithstanding: the exit was asked for).
* ``boxes``: refs and an actor handle inside a put object and inside an
  argument, read by a task (the refs' values and the actor's answer), the
  outer refs dropped by the driver meanwhile.
* ``object_states``: ``list_objects`` reports the driver's references as
  Ray types them: held (``LOCAL_REFERENCE``), an argument of a task still
  running (``USED_BY_PENDING_TASK``), only inside another object
  (``CAPTURED_IN_OBJECT``); a dropped one is gone.
* ``infeasible``: a task and an actor needing a resource no node has wait
  (never done, never failed by themselves) until the task is cancelled
  (``TaskCancelledError``, it never ran) and the actor killed (its call
  raises ``ActorDiedError``).
* ``exits``: ``exit_actor()`` or ``sys.exit()`` in a method: that call and
  every later one raise ``ActorDiedError``, no restart; a cancel of a
  running synchronous method interrupts nothing, the method sees it
  (``is_canceled()``), or the call had not started (``TaskCancelledError``).
* ``concurrency``: an async actor with concurrency groups (calls moved
  between groups by ``.options``) or a threaded actor: no group ever runs
  more calls at once than its limit (checked on the spans the calls log in
  virtual time), and without kills calls sent together run together, up
  to it.
* ``group_states``: ``list_placement_groups`` shows a named group as
  created (state, strategy, bundles, detachment), ``REMOVED`` once removed;
  ``get_placement_group`` finds it by name until then, never after.

Then, from an RNG of their own (the draws above, and those of the pieces
after in ``mixed``, stay put):

* ``context``: ``get_runtime_context()`` in the driver (no task, actor or
  group; the driver's node), in tasks, their children and an actor's
  methods: the driver's job and namespace, the task id of the ref the
  caller holds, the actor's id in a method only, the node the simulator
  runs the code on; ``get_current_placement_group()`` None outside a group.
* ``group_context``: ``placement_group_table`` is the group created and
  puts each bundle on the node its task ran on (while the table held still
  across the run); ``get_current_placement_group()`` in a bundle is the
  group; a child with no strategy joins the group (on one of its nodes)
  with ``placement_group_capture_child_tasks=True``, no group without.
* ``returns``: an actor method's ``.options(num_returns=2)`` and
  ``@tray.method(num_returns=2)`` give two refs, each its value; ``get`` of
  a list with duplicates answers the values in order.

Refusals and answers known at once are judged on the spot (invariant
``api-outcome-as-ray``); values go through ``program.expect``."""

from __future__ import annotations

import random
import warnings

import tray
from tray import exceptions

from . import remote_code, remote_code_paths
from .invariants import InvariantViolation
from .remote_code import leaf
from .remote_code_paths import (
    Grouped,
    PathError,
    Quitter,
    Tally,
    Threaded,
    fails,
    open_box,
    slow_end,
)

API = "api-outcome-as-ray"


def _violation(label: str, what: str) -> InvariantViolation:
    return InvariantViolation(API, f"{label}: {what}")


def timeouts(program) -> None:
    key = program.key("timeouts", retries=-1)
    sleeper = slow_end.options(max_retries=-1).remote(key, 3.0)
    program.expect(sleeper, key, label="timeouts sleeper", unlimited=True)
    try:
        value = tray.get(sleeper, timeout=program.rng.choice([0.0, 0.01, 0.1]))
    except exceptions.GetTimeoutError:
        pass
    except Exception as error:  # noqa: BLE001 - the wrong outcome
        raise _violation("get(timeout=) of a sleeping task",
                         f"raised {type(error).__name__}: {error}, Ray raises GetTimeoutError"
                         ) from None
    else:
        raise _violation("get(timeout=) of a sleeping task", f"answered {value!r}")
    quick = leaf.remote(program.key("timeouts-leaf", retries=3), 5)
    program.expect(quick, 25, label="timeouts leaf")
    ready, not_ready = program.timed_wait([sleeper, quick], num_returns=2,
                                          timeout=program.rng.choice([0.0, 0.05]),
                                          fetch_local=False, label="paths timeouts")
    if sleeper in ready or len(ready) + len(not_ready) != 2:
        raise _violation("wait(timeout=) with a sleeping task",
                         f"ready {len(ready)} (the sleeper among them: {sleeper in ready}), "
                         f"not ready {len(not_ready)}")
    failing_key = program.key("timeouts-fails", retries=3)
    failing = fails.remote(failing_key)
    other_key = program.key("timeouts-other", retries=-1)
    other = slow_end.options(max_retries=-1).remote(other_key, 3.0)
    program.expect(other, other_key, label="timeouts other", unlimited=True)
    try:
        tray.get([other, failing])
    except PathError:
        pass
    except exceptions.TrayError as error:
        if not program.kills:
            raise _violation("get of a list with a failing task",
                             f"raised {type(error).__name__}: {error}, not its error"
                             ) from None
    else:
        raise _violation("get of a list with a failing task", "answered values")
    where = remote_code.LEDGER.where
    # (Judged when the failing task ran before the other ended: on a small
    # cluster it may wait for the other's CPU; paths seed 11 without faults.)
    if not program.kills and where.get(f"{other_key}:end") and where.get(failing_key) and \
            where[failing_key][0][1] < where[f"{other_key}:end"][0][1]:
        raise _violation("get of a list with a failing task",
                         "waited for the other task's end (Ray raises the error at once)")
    program.expect(failing, program.error(PathError), label="timeouts failing")


def kv(program) -> None:
    from tray.experimental import internal_kv

    rng = program.rng
    namespaces = [f"paths-{program.key('kv')}", f"paths-{program.key('kv')}"]
    model: dict = {}  # (namespace, key) -> value
    keys = [b"a", b"ab", b"abc", b"b", b"ba"]
    for step in range(rng.randint(8, 16)):
        namespace = rng.choice(namespaces)
        key = rng.choice(keys)
        op = rng.choice(["put", "put", "put_new", "del", "del_prefix"])
        if op == "del_prefix":
            key = key[:1]  # (a prefix of others, often)
        value = f"{step}".encode()
        if op == "put":
            internal_kv._internal_kv_put(key, value, namespace=namespace)
            model[(namespace, key)] = value
        elif op == "put_new":
            internal_kv._internal_kv_put(key, value, overwrite=False, namespace=namespace)
            model.setdefault((namespace, key), value)
        elif op == "del":
            internal_kv._internal_kv_del(key, namespace=namespace)
            model.pop((namespace, key), None)
        else:
            internal_kv._internal_kv_del(key, del_by_prefix=True, namespace=namespace)
            for name in [name for name in model if name[0] == namespace and
                         name[1].startswith(key)]:
                del model[name]
        _check_kv(internal_kv, model, namespace, key, f"kv step {step} ({op})")
    for namespace in namespaces:
        listed = sorted(internal_kv._internal_kv_list(b"", namespace=namespace))
        held = sorted(name[1] for name in model if name[0] == namespace)
        if listed != held:
            raise _violation("kv list", f"lists {listed}, the model holds {held}")


def _check_kv(internal_kv, model: dict, namespace, key: bytes, label: str) -> None:
    got = internal_kv._internal_kv_get(key, namespace=namespace)
    if got != model.get((namespace, key)):
        raise _violation(label, f"get({key!r}) is {got!r}, the model holds "
                                f"{model.get((namespace, key))!r}")
    if internal_kv._internal_kv_exists(key, namespace=namespace) != ((namespace, key) in model):
        raise _violation(label, f"exists({key!r}) disagrees with get")
    listed = sorted(internal_kv._internal_kv_list(key[:1], namespace=namespace))
    held = sorted(name[1] for name in model if name[0] == namespace and
                  name[1].startswith(key[:1]))
    if listed != held:
        raise _violation(label, f"list({key[:1]!r}) is {listed}, the model holds {held}")


def builtins(program) -> None:
    rng = program.rng
    key = program.key("tally")
    restarts = rng.choice([0, 1, 2])
    tally = program.actor(Tally.options(max_restarts=restarts), key)
    # Its calls name no restart budget: the actor ends itself, so a call
    # whose reply a fault lost finds it gone for good when sent again.
    program.actor_restarts(key, restarts)
    ready = tally.__ray_ready__.remote()
    program.expect(ready, True, label="__ray_ready__")
    amounts = [rng.randint(1, 9) for _ in range(rng.randint(1, 4))]
    running = 0
    for amount in amounts:
        running += amount
        ref = tally.add.remote(amount)
        # Restarted (under kills), the actor starts again from 0.
        program.expect(ref, running if not program.kills else program.ANY_INT,
                       label="tally add")
    done = tally.__ray_terminate__.remote()
    program.expect(done, program.error(exceptions.ActorDiedError),
                   label="__ray_terminate__")
    after = tally.total.remote()
    program.expect(after, program.error(exceptions.ActorDiedError),
                   label="a call after __ray_terminate__")


def boxes(program) -> None:
    rng = program.rng
    key = program.key("boxes")
    tally = program.actor(Tally.options(max_restarts=-1, max_task_retries=-1), key)
    values = [rng.randint(1, 50) for _ in range(rng.randint(1, 4))]
    made_by_task = [rng.random() < 0.5 for _ in values]  # (leaf answers its square)
    # (Retried without limit, as the task that opens the box: a leaf that
    # used up a budget would fail it with its error; paths chaos seed 485.)
    refs = [leaf.options(max_retries=-1).remote(program.key("boxes-leaf", retries=-1), value)
            if made else tray.put(value)
            for value, made in zip(values, made_by_task, strict=True)]
    echo = rng.randint(1, 9)
    box = {"refs": refs, "actor": tally, "echo": echo}
    if rng.random() < 0.5:
        box = tray.put(box)
    result = open_box.options(max_retries=-1).remote(program.key("boxes-open", retries=-1),
                                                    box)
    del box, refs  # the task's argument holds what it needs
    expected = sum(value * value if made else value
                   for value, made in zip(values, made_by_task, strict=True)) + echo
    program.expect(result, expected, label="box of refs and a handle", unlimited=True)


def object_states(program) -> None:
    from tray.util.state import list_objects

    key = program.key("states", retries=-1)
    held = tray.put(f"{key}-held")
    inner = tray.put(f"{key}-inner")
    outer = tray.put([inner])
    inner_hex = inner.hex()
    del inner
    argument = tray.put(f"{key}-argument")
    sleeper = slow_end.options(max_retries=-1).remote(key, 3.0, argument)
    program.expect(sleeper, key, label="states sleeper", unlimited=True)
    dropped = tray.put(f"{key}-dropped")
    dropped_hex = dropped.hex()
    del dropped
    want = {held.hex(): "LOCAL_REFERENCE", inner_hex: "CAPTURED_IN_OBJECT",
            argument.hex(): "USED_BY_PENDING_TASK", dropped_hex: None}
    try:
        with warnings.catch_warnings():  # (a process that did not answer: not the driver)
            warnings.simplefilter("ignore")
            rows = list_objects(filters=[("type", "=", "DRIVER")], limit=100_000)
    except exceptions.TrayError:
        if program.kills:
            return  # (a query during a fault may fail; the state workload checks it after)
        raise
    types: dict = {}
    for row in rows:
        if row.object_id in want:
            types.setdefault(row.object_id, set()).add(row.reference_type)
    for object_hex, expected in want.items():
        found = types.get(object_hex)
        if expected is None and found:
            raise _violation("list_objects", f"a dropped ref is still listed ({found})")
        if expected is not None and found != {expected}:
            raise _violation("list_objects", f"the driver's ref {object_hex[:12]} is listed as "
                                             f"{sorted(found or ())}, Ray's type is {expected}")
    del held, argument, outer


def infeasible(program) -> None:
    """Work no node can hold (a resource nobody has) waits, never fails by
    itself: a task until it is cancelled (``TaskCancelledError``), an
    actor's call until the actor is killed (``ActorDiedError``)."""
    rng = program.rng
    nowhere = {"paths-nowhere": 1}
    task_key = program.key("infeasible", retries=3)
    task = leaf.options(resources=nowhere).remote(task_key, 2)
    actor = program.actor(Tally.options(resources=nowhere), program.key("infeasible-actor"))
    call = actor.add.remote(1)
    ready, _ = program.timed_wait([task, call], num_returns=1,
                                  timeout=rng.choice([0.1, 0.5]), label="paths infeasible")
    if ready:
        raise _violation("infeasible work", "a task or call no node can hold got done")
    tray.cancel(task)
    tray.kill(actor)
    program.expect(task, program.error(exceptions.TaskCancelledError),
                   label="cancelled infeasible task", strict=True)
    program.expect(call, program.error(exceptions.ActorDiedError),
                   label="call of a killed infeasible actor", strict=True)
    program.exact_executions(task_key, 0)  # it never ran anywhere


def exits(program) -> None:
    """An actor ended from inside (``exit_actor()`` or ``sys.exit()`` in a
    method): the calls before run in order, that call and every later one
    raise ``ActorDiedError``, and it is not restarted, whatever its
    ``max_restarts``. A cancel of a running method of another actor
    interrupts nothing: the method sees it (``is_canceled()``), or the call
    had not started and raises ``TaskCancelledError``."""
    rng = program.rng
    restarts = rng.choice([0, 1, 2])
    quitter = program.actor(Quitter.options(max_restarts=restarts), program.key("quitter"))
    # (No restart budget named, as in ``builtins``.)
    running = 0
    for amount in [rng.randint(1, 9) for _ in range(rng.randint(0, 3))]:
        running += amount
        program.expect(quitter.add.remote(amount),
                       running if not program.kills else program.ANY_INT,
                       label="quitter add")
    quit_call = quitter.quit.remote(rng.choice(["exit_actor", "sys.exit"]))
    program.expect(quit_call, program.error(exceptions.ActorDiedError), label="quit")
    program.expect(quitter.add.remote(1), program.error(exceptions.ActorDiedError),
                   label="a call after the actor quit")

    poller = program.actor(Quitter, program.key("poller"))
    poll_key = program.key("poll", retries=0)
    poll = poller.poll.remote(poll_key, 40, 0.05)
    program.timed_wait([poll], timeout=rng.choice([0.0, 0.1, 0.3]), label="paths poll")
    tray.cancel(poll)
    program.expect(poll, program.CANCELLED_OR_VALUE, label="cancelled poll", actor=poller,
                   max_restarts=0)

    def seen() -> None:
        try:
            value = tray.get(poll)
        except exceptions.TrayError:
            return  # (judged by the expectation)
        if value != "saw the cancel" and not program.kills:
            raise _violation("cancel of a running actor method", f"the method says {value!r}")
    program.later(seen)


def _peak(spans: list) -> int:
    """How many of the (start, end) spans ran at once at most (an end at
    the instant of a start comes first)."""
    events = sorted([(start, 1) for start, _ in spans] + [(end, -1) for _, end in spans])
    running = peak = 0
    for _, step in events:
        running += step
        peak = max(peak, running)
    return peak


def concurrency(program) -> None:
    """A concurrent actor never runs more calls of a concurrency group at
    once than the group's limit (``concurrency_groups``, and
    ``max_concurrency`` for the default group), whatever ``.options``
    moves a call to; without kills, calls sent together do run together,
    up to the limit. Async methods (groups) and a threaded actor's
    synchronous ones."""
    rng = program.rng
    remote_code_paths.SPANS.clear()
    key = program.key("grouped")
    limits = {"io": 2, "compute": 1, "default": rng.choice([1, 2, 3])}
    if rng.random() < 0.5:
        actor = program.actor(Grouped.options(max_concurrency=limits["default"]), key)
        methods = {"io": actor.io, "compute": actor.compute, "default": actor.plain}
    else:
        actor = program.actor(Threaded.options(max_concurrency=limits["default"]), key)
        methods = {"default": actor.plain}
    counts = dict.fromkeys(methods, 0)
    for x in range(rng.randint(3, 9)):
        group = rng.choice(sorted(methods))
        method = methods[group]
        if group != "default" and rng.random() < 0.3:  # moved to the other named group
            group = "compute" if group == "io" else "io"
            method = method.options(concurrency_group=group)
        counts[group] += 1
        program.expect(method.remote(x, 0.3, group), x, label=f"concurrency {group} call")

    def bounded() -> None:
        by_group: dict = {}
        for group, start, end in remote_code_paths.SPANS.get(key, []):
            by_group.setdefault(group, []).append((start, end))
        for group, spans in sorted(by_group.items()):
            peak = _peak(spans)
            if peak > limits[group]:
                raise _violation("concurrency groups",
                                 f"{peak} calls of group {group!r} ran at once, its limit is "
                                 f"{limits[group]}")
            if not program.kills and len(spans) == counts[group] and \
                    peak < min(limits[group], counts[group]):
                raise _violation("concurrency groups",
                                 f"{counts[group]} calls of group {group!r} sent together ran "
                                 f"{peak} at a time, its limit is {limits[group]}")
    program.later(bounded)


def _group_rows(name: str) -> list:
    from tray.util.state import list_placement_groups

    return list_placement_groups(filters=[("name", "=", name)], detail=True)


def group_states(program) -> None:
    """The state API's ``list_placement_groups`` says what the group is:
    one row by its name, ``CREATED`` once ``ready()`` answered (never
    ``PENDING`` then: under kills ``RESCHEDULING`` too), its strategy,
    bundles and detachment as created; ``REMOVED`` once removed, and its
    name then finds nothing (``get_placement_group`` raises ValueError)."""
    from tray.util import get_placement_group, placement_group, remove_placement_group

    rng = program.rng
    name = program.key("paths-group")
    detached = rng.random() < 0.3
    strategy = rng.choice(["PACK", "SPREAD"])
    bundles = [{"CPU": 0.1} for _ in range(rng.randint(1, 2))]
    group = placement_group(bundles, strategy=strategy, name=name,
                            lifetime="detached" if detached else None)
    ready, _ = tray.wait([group.ready()], timeout=program.wait_timeout_s)
    rows = _group_rows(name)
    if len(rows) != 1:
        raise _violation("list_placement_groups", f"{len(rows)} rows named {name!r}, not 1")
    row = rows[0]
    states = {"CREATED", "RESCHEDULING"} if program.kills else {"CREATED"}
    if ready and row.state not in states:
        raise _violation("list_placement_groups", f"a ready group is {row.state}")
    if (row.placement_group_id, row.strategy, row.bundles, row.is_detached) != \
            (group.id.hex(), strategy, bundles, detached):
        raise _violation("list_placement_groups",
                         f"the row {row} is not the group created ({strategy}, {bundles}, "
                         f"detached {detached})")
    if get_placement_group(name) != group:
        raise _violation("get_placement_group", f"{name!r} is not the group")
    remove_placement_group(group)
    rows = _group_rows(name)
    if [row.state for row in rows] != ["REMOVED"]:
        raise _violation("list_placement_groups",
                         f"a removed group's rows say {[row.state for row in rows]}")
    try:
        get_placement_group(name)
    except ValueError:
        pass
    else:
        raise _violation("get_placement_group", "a removed group's name still finds it")


def _got(program, refs, label: str):
    """``tray.get(refs)``; None where a fault failed them (under kills)."""
    try:
        return tray.get(refs)
    except exceptions.TrayError as error:
        if program.kills:
            return None
        raise _violation(label, f"raised {type(error).__name__}: {error} without faults"
                         ) from None


def _same_context(label: str, seen: dict, driver: dict, ref_task: str,
                  actor: str | None) -> None:
    """A task's or method's runtime context is Ray's: the driver's job and
    namespace, its own task id (the caller's ref's), the actor's id in a
    method and None elsewhere, the node it truly runs on."""
    want = {"job": driver["job"], "namespace": driver["namespace"], "task": ref_task,
            "actor": actor}
    wrong = {name: (seen[name], value) for name, value in want.items() if seen[name] != value}
    if seen["true_node"] is not None and seen["node"] != seen["true_node"]:
        wrong["node"] = (seen["node"], seen["true_node"])
    if wrong:
        raise _violation(f"get_runtime_context() in {label}",
                         f"(name: (said, Ray's)) {wrong}")


def context(program, rng) -> None:
    """``get_runtime_context()`` in the driver (no task, no actor, the
    driver's node), in tasks and in an actor's methods (the caller's job
    and namespace, the task id of the ref the caller holds, the actor's id
    in a method only, the node the simulator runs it on); and
    ``get_current_placement_group()`` None outside any group."""
    driver = remote_code_paths._context()
    if (driver["task"], driver["actor"], driver["group"]) != (None, None, None) or \
            (driver["true_node"] is not None and driver["node"] != driver["true_node"]):
        raise _violation("get_runtime_context() in the driver",
                         f"says {driver}: Ray's has no task, actor or group, and the "
                         f"driver's node")
    refs = [remote_code_paths.probe.options(num_cpus=rng.choice([0.5, 1]), max_retries=-1)
            .remote(program.key("context-task", retries=-1),
                    rng.choice([None, 0.25])) for _ in range(rng.randint(1, 3))]
    prober = program.actor(remote_code_paths.Prober.options(max_restarts=-1,
                                                            max_task_retries=-1),
                           program.key("prober"))
    calls = [prober.context.remote() for _ in range(rng.randint(1, 2))]
    actor_id = str(prober._actor_id)
    seen = _got(program, refs + calls, "runtime context")
    if seen is None:
        return
    for ref, here in zip(refs, seen[:len(refs)], strict=True):
        _same_context("a task", here, driver, ref.task_id().hex(), None)
        if here["group"] is not None:
            raise _violation("get_current_placement_group()",
                             f"a task in no group is in {here['group']}")
        if "child" in here:
            _same_context("a task's child", here["child"], driver, here["child_ref_task"],
                          None)
    for ref, here in zip(calls, seen[len(refs):], strict=True):
        _same_context("an actor method", here, driver, ref.task_id().hex(), actor_id)


def group_context(program, rng) -> None:
    """A placement group's ``placement_group_table`` is the group created
    (id, name, strategy, bundles, ``CREATED`` once ready) and says a node
    per bundle; a task in bundle i finds the group
    (``get_current_placement_group()``) and runs on that bundle's node;
    its child with no strategy of its own joins the group (anywhere in it)
    with ``placement_group_capture_child_tasks=True``, and is in no group
    without."""
    from tray.util import placement_group, placement_group_table, remove_placement_group
    from tray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    name = program.key("context-group")
    strategy = rng.choice(["PACK", "SPREAD", "STRICT_PACK"])
    bundles = [{"CPU": 0.25} for _ in range(rng.randint(1, 3))]
    group = placement_group(bundles, strategy=strategy, name=name)
    ready, _ = tray.wait([group.ready()], timeout=program.wait_timeout_s)
    if not ready:
        remove_placement_group(group)
        return
    table = placement_group_table(group)
    states = {"CREATED", "RESCHEDULING"} if program.kills else {"CREATED"}
    want = {"placement_group_id": group.id.hex(), "name": name, "strategy": strategy,
            "bundles": dict(enumerate(bundles))}
    nodes = table.get("bundles_to_node_id", {})
    if {key: table.get(key) for key in want} != want or table.get("state") not in states \
            or (not program.kills and sorted(nodes) != list(range(len(bundles)))):
        raise _violation("placement_group_table", f"says {table} of the ready group "
                                                  f"{want}")
    if strategy == "STRICT_PACK" and len(set(nodes.values())) > 1:
        raise _violation("placement_group_table", f"a STRICT_PACK group on nodes {nodes}")
    captures = [rng.choice([True, False, None]) for _ in bundles]
    refs = [remote_code_paths.probe.options(
        num_cpus=0.125, max_retries=-1,
        scheduling_strategy=PlacementGroupSchedulingStrategy(
            group, placement_group_bundle_index=index,
            placement_group_capture_child_tasks=capture))
        .remote(program.key("context-bundle", retries=-1), 0.125)
        for index, capture in enumerate(captures)]
    seen = _got(program, refs, "tasks in a placement group")
    # A fault may move bundles (off a dead node, to a new id): where the
    # table said the same before and after the tasks, they ran there.
    stable = not program.kills
    if program.kills and seen is not None:
        try:
            stable = placement_group_table(group).get("bundles_to_node_id") == nodes and \
                len(nodes) == len(bundles)
        except exceptions.TrayError:
            pass
    remove_placement_group(group)
    if seen is None:
        return
    driver = remote_code_paths._context()
    for index, (ref, here, capture) in enumerate(zip(refs, seen, captures, strict=True)):
        _same_context(f"a task in bundle {index}", here, driver, ref.task_id().hex(), None)
        child = here["child"]
        _same_context("its child", child, driver, here["child_ref_task"], None)
        if here["group"] != group.id.hex():
            raise _violation("get_current_placement_group()",
                             f"a task in bundle {index} of {group.id.hex()} says "
                             f"{here['group']}")
        if child["group"] != (group.id.hex() if capture else None):
            raise _violation("placement_group_capture_child_tasks",
                             f"with capture {capture}, a child with no strategy is in group "
                             f"{child['group']} (its parent's: {group.id.hex()})")
        if not stable:
            continue
        if here["node"] != nodes.get(index):
            raise _violation("placement_group_table",
                             f"a task in bundle {index} ran on {here['node'][:12]}, the table "
                             f"puts the bundle on {str(nodes.get(index))[:12]}")
        if capture and child["node"] not in set(nodes.values()):
            raise _violation("placement_group_capture_child_tasks",
                             f"a captured child ran on {child['node'][:12]}, on none of the "
                             f"group's nodes {sorted(node[:12] for node in nodes.values())}")


def returns(program, rng) -> None:
    """An actor method of two returns, by ``.options(num_returns=2)`` and
    by ``@tray.method(num_returns=2)``: two refs, each its own value; and
    ``tray.get`` of a list with duplicates: the values in order, a
    duplicate's value each time."""
    prober = program.actor(remote_code_paths.Prober.options(max_restarts=-1,
                                                            max_task_retries=-1),
                           program.key("returns"))
    x = rng.randint(1, 50)
    pair = prober.pair.options(num_returns=2).remote(x)
    split = prober.split.remote(x)
    for label, refs, values in (("options(num_returns=2)", pair, [x, x + 1]),
                                ("@tray.method(num_returns=2)", split, [2 * x, 3 * x])):
        if not isinstance(refs, list) or len(refs) != 2 or \
                not all(isinstance(ref, tray.ObjectRef) for ref in refs):
            raise _violation(f"an actor method's {label}", f"returned {refs!r}, not 2 refs")
        for ref, value in zip(refs, values, strict=True):
            program.expect(ref, value, label=f"an actor method's {label}", unlimited=True)
    values = [rng.randint(0, 99) for _ in range(rng.randint(1, 3))]
    distinct = [tray.put(value) for value in values]
    order = [rng.randrange(len(distinct)) for _ in range(rng.randint(2, 6))]
    order[rng.randrange(len(order))] = order[0]  # (one duplicate at least)
    if len(set(order)) == len(order):
        order.append(order[0])
    got = _got(program, [distinct[index] for index in order] + pair + split,
               "get of a list with duplicates")
    if got is not None and got != [values[index] for index in order] + \
            [x, x + 1, 2 * x, 3 * x]:
        raise _violation("get of a list with duplicates",
                         f"got {got} for the refs {order} of {values} (and the methods' "
                         f"returns of {x})")


SUBPIECES = {"timeouts": timeouts, "kv": kv, "builtins": builtins, "boxes": boxes,
             "object_states": object_states, "infeasible": infeasible,
             "exits": exits, "concurrency": concurrency, "group_states": group_states}
# Drawn from an RNG of their own (seeded by where the workload's stands, read
# and not advanced): the draws above, and those of the pieces after, stay put.
API_SUBPIECES = {"context": context, "group_context": group_context, "returns": returns}


def paths(program) -> None:
    names = sorted(SUBPIECES)
    chosen = [name for name in names if program.rng.random() < 0.6] or \
        [program.rng.choice(names)]
    for name in chosen:
        SUBPIECES[name](program)
    state = program.rng.getstate()[1]
    rng = random.Random(f"paths-api:{state[:4]}:{state[-1]}")
    for name in sorted(API_SUBPIECES):
        if rng.random() < 0.6:
            API_SUBPIECES[name](program, rng)
