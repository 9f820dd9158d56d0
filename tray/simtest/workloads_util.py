"""tray.util under faults: an ActorPool, a multiprocessing Pool and a
Queue between producer and consumer tasks, while the seed's faults fire.

Reference models:

* An ``ActorPool`` over actors that restart and retry their calls
  (``max_restarts=-1``, ``max_task_retries=3``), some calls raising an
  application error (seeded), runs a ``map``/``map_unordered`` and then a
  random run of ``submit``, ``get_next``, ``get_next_unordered``, a
  ``get_next(timeout=)`` that times out, ``pop_idle``/``push`` and new
  actors, every step replayed by ``_PoolModel``, Ray's documented pool
  (``actor-pool-as-ray``): see its docstring. A crash may re-run a call,
  never lose or duplicate a result; a fault's error ends the scenario and
  goes to the runner.
* ``Pool.map`` / ``imap`` / ``starmap`` return the squares of their input,
  in order; ``imap_unordered`` the same multiset.
* The driver first probes the queue as Ray documents it (``queue-as-ray``,
  ``_queue_as_ray``). Then it is checked for what a FIFO queue promises,
  whatever fails:
  no item is received twice, and each consumer receives each producer's
  items in the order that producer put them. When every producer and
  consumer finished, the consumers together received every item. Producers
  and consumers do not retry (``max_retries=0``): a re-run producer would
  put its items again, which the queue cannot tell from new ones.

Errors the faults permit (a worker or an actor lost past its retries) are
re-raised by a task so the runner judges them like any other; a broken
queue invariant is a violation at once. Functions sleep a little virtual
time so that the work is still running when the faults fire.
"""

from __future__ import annotations

import random
import time

import tray
from tray.util import ActorPool
from tray.util.multiprocessing import Pool
from tray.util.queue import Empty, Full, Queue

from .invariants import InvariantViolation, _is_fault_error


@tray.remote(max_retries=3)
def _reraise(error: BaseException):
    raise error


def _square(value: int, sleep_s: float = 0.0) -> int:
    time.sleep(sleep_s)
    return value * value


def _square_slowly(args) -> int:
    return _square(*args)


@tray.remote(max_retries=0)
def _produce(queue, producer: int, count: int, sleep_s: float) -> int:
    for seq in range(count):
        time.sleep(sleep_s)
        queue.put((producer, seq), timeout=60)
    return count


@tray.remote(max_retries=0)
def _consume(queue, count: int) -> list:
    return [queue.get(timeout=60) for _ in range(count)]


def _violation(invariant: str, message: str):
    return InvariantViolation(invariant, message)


def _own_rng(program, purpose: str) -> random.Random:
    """Draws of a piece's own, seeded by where the workload's RNG stands (read,
    not advanced): the workload's other draws stay as they were."""
    state = program.rng.getstate()[1]
    return random.Random(f"util-{purpose}:{state[:4]}:{state[-1]}")


def _expect(program, build, expected, label: str) -> None:
    try:
        ref = tray.put(build())
    except Exception as error:  # noqa: BLE001 - judged by the runner like any error
        ref = _reraise.remote(error)
    program.expect(ref, expected, label=f"util: {label}")


def _total_cpus() -> int:
    return max(int(tray.cluster_resources().get("CPU", 1)), 1)


# ================================================================ pieces


class _PoolCallFailed(Exception):
    """The application error a pool call raises when the seed says so."""


@tray.remote
class _PoolWorker:
    def work(self, value: int, sleep_s: float, fail: bool):
        time.sleep(sleep_s)  # a failing call takes its time too
        if fail:
            raise _PoolCallFailed(value)
        return value, 2 * value


class _PoolAbandoned(Exception):
    """A fault ended a call: handed to the runner, the scenario stops."""


class _PoolModel:
    """Ray's documented ``ActorPool`` over one real pool, step by step
    (``actor-pool-as-ray``): values start on an idle member at once, else wait
    and start, oldest first, as soon as a member is free (one call per actor);
    ``get_next`` gives the oldest result, a call's error at its turn, and
    ``get_next_unordered`` any started one; either way the actor goes back to
    the pool, which keeps its size (``has_free``, ``pop_idle``); a timeout
    raises ``TimeoutError`` and loses nothing; ``push``/``pop_idle`` add and
    remove members. Each value is an int of its own, so every result and
    every call's start names its value."""

    def __init__(self, program, rng, members: list, sleep_s: float) -> None:
        self.program, self.rng, self.sleep_s = program, rng, sleep_s
        self.pool = ActorPool(members)
        self.members = list(members)
        self.pending: list[int] = []     # submitted, not returned, in submission order
        self.started: dict = {}          # value -> the actor it was started on
        self.fails: dict[int, bool] = {}
        self.sleeps: dict[int, float] = {}
        self.next_value = 0
        self.log: list[str] = []
        # During a get: the values whose result it may return, and the one
        # whose actor the pool gave to a waiting value before returning it.
        self.returning: set = set()
        self.handed_back: list[int] = []

    def violation(self, what: str):
        return _violation("actor-pool-as-ray", f"{what}\nmodel: {len(self.members)} members, "
                          f"pending {self.pending}, started {sorted(self.started)}; "
                          f"last steps: {'; '.join(self.log[-12:])}")

    # ---------------------------------------------------------- the calls

    def call(self, actor, value: int):
        """The ``fn`` given to the pool: it runs when the pool starts a value."""
        waiting = [v for v in self.pending if v not in self.started]
        if not any(actor == m for m in self.members):
            raise self.violation(f"value {value} started on {actor!r}, not a member of the pool")
        running = [v for v, a in self.started.items() if a == actor]
        if running and (running[0] not in self.returning or self.handed_back):
            raise self.violation(f"value {value} started on an actor still running value "
                                 f"{running[0]}")
        if running:  # the pool gives back the actor of the result it returns now
            self.handed_back.append(running[0])
            del self.started[running[0]]
        if not waiting or waiting[0] != value:
            raise self.violation(f"value {value} started, but the oldest value waiting for an "
                                 f"actor is {waiting[:1] or 'none'}")
        self.started[value] = actor
        return actor.work.remote(value, self.sleeps[value], self.fails[value])

    def new_value(self, sleep_s: float | None = None, fail: bool | None = None) -> int:
        value = self.next_value
        self.next_value += 1
        self.fails[value] = self.rng.random() < 0.3 if fail is None else fail
        self.sleeps[value] = self.sleep_s * self.rng.choice([0.5, 1, 2]) \
            if sleep_s is None else sleep_s
        return value

    def settle(self, step: str) -> None:
        """After each step: the oldest values run, one per member, the rest
        wait; has_next and has_free say so."""
        self.log.append(step)
        running = [v for v in self.pending if v in self.started]
        expected = self.pending[:len(self.members)]
        if running != expected:
            raise self.violation(f"after {step}: values {running} run, but with "
                                 f"{len(self.members)} actors {expected} must (the pool lost "
                                 f"an actor, or kept one idle while values wait)")
        if self.pool.has_next() != bool(self.pending):
            raise self.violation(f"after {step}: has_next() is {not self.pending}, "
                                 f"{len(self.pending)} results are still to come")
        free = len(self.pending) < len(self.members)
        if self.pool.has_free() != free:
            raise self.violation(f"after {step}: has_free() is {not free} with "
                                 f"{len(self.members)} actors and {len(self.pending)} "
                                 f"results to come")

    def returned(self, value: int, outcome) -> None:
        """``outcome`` (a result or the error raised) came for ``value``."""
        ok, got = outcome
        if self.fails[value]:
            if ok or not isinstance(got, _PoolCallFailed):
                raise self.violation(f"value {value}'s call raised _PoolCallFailed, but the pool "
                                     f"gave {'the value ' if ok else 'the error '}{got!r}")
        elif not ok or got != (value, 2 * value):
            raise self.violation(f"value {value}'s call returned {(value, 2 * value)!r}, but "
                                 f"the pool gave {'the value ' if ok else 'the error '}{got!r}")
        if self.handed_back and self.handed_back != [value]:
            raise self.violation(f"the pool returned value {value}'s outcome but gave the actor "
                                 f"of value {self.handed_back[0]} (still running) to another")
        self.pending.remove(value)
        self.started.pop(value, None)

    def outcome(self, get, returning):
        self.returning, self.handed_back = set(returning), []
        try:
            return True, get()
        except InvariantViolation:
            raise
        except Exception as error:  # noqa: BLE001 - judged by the caller
            if _is_fault_error(error):
                self.program.expect(_reraise.remote(error), None,
                                    label=f"util: ActorPool call ({'; '.join(self.log[-3:])})")
                raise _PoolAbandoned() from None
            return False, error
        finally:
            self.returning = set()

    # ---------------------------------------------------------- the steps

    def submit(self) -> None:
        value = self.new_value()
        self.pending.append(value)
        self.pool.submit(self.call, value)
        self.settle(f"submit({value}{', failing' if self.fails[value] else ''})")

    def get_next(self) -> None:
        value = self.pending[0]
        self.returned(value, self.outcome(self.pool.get_next, self.pending[:1]))
        self.settle(f"get_next() -> {value}")

    def get_next_unordered(self) -> None:
        ok, got = self.outcome(self.pool.get_next_unordered, self.started)
        value = got[0] if ok and isinstance(got, tuple) else _failed_value(got)
        if value not in self.started and value not in self.handed_back:
            raise self.violation(f"get_next_unordered() gave {got!r}, which is no started "
                                 "value's outcome")
        self.returned(value, (ok, got))
        self.settle(f"get_next_unordered() -> {value}")

    def timeout(self) -> None:
        """A slow call alone in the pool: a short wait times out, then the
        result still comes."""
        value = self.new_value(sleep_s=1.0)
        self.pending.append(value)
        self.pool.submit(self.call, value)
        unordered = self.rng.random() < 0.5
        name = "get_next_unordered" if unordered else "get_next"
        ok, got = self.outcome(lambda: getattr(self.pool, name)(timeout=0.05), ())
        if ok or not isinstance(got, TimeoutError):
            raise self.violation(f"{name}(timeout=0.05) on a call of 1 s gave "
                                 f"{'the value ' if ok else 'the error '}{got!r}, not TimeoutError")
        self.settle(f"{name}(timeout=0.05) on {value} -> TimeoutError")

    def pop_and_push(self) -> None:
        free = len(self.pending) < len(self.members)
        actor = self.pool.pop_idle()
        if not free:
            if actor is not None:
                raise self.violation(f"pop_idle() gave {actor!r} while no actor is free")
            self.settle("pop_idle() -> None")
            return
        if actor is None or not any(actor == m for m in self.members) or \
                any(actor == a for a in self.started.values()):
            raise self.violation(f"pop_idle() gave {actor!r}, not an idle member")
        self.members = [m for m in self.members if m != actor]
        self.settle("pop_idle()")
        if self.members and self.rng.random() < 0.5:
            try:
                self.pool.push(self.members[0])
            except ValueError:
                pass
            else:
                raise self.violation("push() of an actor already in the pool was accepted")
        self.members.append(actor)
        self.pool.push(actor)
        self.settle("push(the popped actor)")

    def push_new(self) -> None:
        actor = _PoolWorker.options(max_restarts=-1, max_task_retries=3).remote()
        self.program.actors.append(actor)
        self.members.append(actor)
        self.pool.push(actor)
        self.settle("push(a new actor)")

    def map(self, ordered: bool, count: int) -> None:
        values = [self.new_value() for _ in range(count)]
        self.pending.extend(values)
        results = (self.pool.map if ordered else self.pool.map_unordered)(self.call, values)
        self.settle(f"{'map' if ordered else 'map_unordered'}({values})")
        while self.pending:
            ok, got = self.outcome(lambda: next(results),
                                   self.pending[:1] if ordered else self.started)
            if not ok and isinstance(got, StopIteration):
                raise self.violation(f"map{'' if ordered else '_unordered'} ended with "
                                     f"{self.pending} still to come")
            value = got[0] if ok and isinstance(got, tuple) else _failed_value(got)
            if ordered and value != self.pending[0] or \
                    value not in self.started and value not in self.handed_back:
                raise self.violation(f"map{'' if ordered else '_unordered'} gave {got!r}; "
                                     f"the next result is value {self.pending[0]}'s"
                                     f"{'' if ordered else ' or another started one'}")
            self.returned(value, (ok, got))
            self.settle(f"map result {value}")
            if not ok:
                break  # the error ends the iteration; the rest come from get_next
        else:
            if next(results, None) is not None:
                raise self.violation("map gave a result past the values it was given")

    def drain(self) -> None:
        while self.pending:
            if self.rng.random() < 0.5:
                self.get_next()
            else:
                self.get_next_unordered()

    def drain_and_count(self) -> None:
        """Every result comes, then every member is idle and pop_idle
        removes each once."""
        self.drain()
        popped = []
        while True:
            actor = self.pool.pop_idle()
            if actor is None:
                break
            if not any(actor == m for m in self.members) or any(actor == p for p in popped):
                raise self.violation(f"pop_idle() gave {actor!r}, not an idle member")
            popped.append(actor)
            if len(popped) > len(self.members):
                break
        if len(popped) != len(self.members):
            raise self.violation(f"pop_idle() removed {len(popped)} actors from an idle pool "
                                 f"of {len(self.members)}")


def _failed_value(error) -> int | None:
    if isinstance(error, _PoolCallFailed):
        cause = getattr(error, "cause", error)
        args = getattr(cause, "args", ()) or error.args
        return args[0] if args and isinstance(args[0], int) else None
    return None


def _actor_pool(program) -> None:
    rng = program.rng
    count = rng.randint(4, 24)
    sleep_s = rng.choice([0.01, 0.05, 0.1])
    ordered = rng.random() < 0.5
    actors = [_PoolWorker.options(max_restarts=-1, max_task_retries=3).remote()
              for _ in range(rng.randint(1, 3))]
    program.actors.extend(actors)
    # Draws of its own: the workload's other draws stay as they were.
    own = _own_rng(program, "actor-pool")
    model = _PoolModel(program, own, actors, sleep_s)
    steps = {"submit": 6, "get_next": 3, "get_next_unordered": 2, "timeout": 1,
             "pop_and_push": 2, "push_new": 1}
    names = list(steps)
    try:
        model.map(ordered, count)
        plan = [own.choices(names, weights=[steps[n] for n in names])[0]
                for _ in range(own.randint(8, 30))]
        plan.insert(own.randint(0, len(plan)), "timeout")  # at least once
        for name in plan:
            if name in ("get_next", "get_next_unordered") and not model.pending:
                name = "submit"
            if name == "timeout":
                model.drain()  # the slow call alone in the pool
            if name == "push_new" and len(model.members) >= 4:
                name = "submit"
            getattr(model, name)()
        model.drain_and_count()
    except _PoolAbandoned:
        return


def _process_pool(program) -> None:
    rng = program.rng
    values = list(range(rng.randint(4, 40)))
    sleep_s = rng.choice([0.0, 0.02, 0.08])
    processes = min(rng.randint(1, 3), _total_cpus())
    form = rng.choice(["map", "imap", "imap_unordered", "starmap"])
    chunksize = rng.choice([None, 1, 3]) if form in ("map", "starmap") else rng.choice([1, 2, 5])

    def build():
        with Pool(processes=processes) as pool:
            pairs = [(v, sleep_s) for v in values]
            if form == "map":
                return pool.map(_square_slowly, pairs, chunksize)
            if form == "starmap":
                return pool.starmap(_square, pairs, chunksize)
            if form == "imap":
                return list(pool.imap(_square_slowly, pairs, chunksize))
            return sorted(pool.imap_unordered(_square_slowly, pairs, chunksize))

    _expect(program, build, [v * v for v in values],
            f"Pool({processes}).{form} of {len(values)} values, chunksize {chunksize}")


def _queue(program) -> None:
    rng = program.rng
    producers = rng.randint(1, 3)
    per_producer = rng.randint(2, 8)
    total = producers * per_producer
    consumers = rng.randint(1, 3)
    shares = [total // consumers + (1 if i < total % consumers else 0) for i in range(consumers)]
    queue = Queue(maxsize=rng.choice([0, 1, 2, 5]))
    program.actors.append(queue.actor)
    if not _queue_as_ray(program, queue):
        return
    sleep_s = rng.choice([0.0, 0.02, 0.1])
    consumer_refs = [_consume.remote(queue, share) for share in shares]
    producer_refs = [_produce.remote(queue, p, per_producer, sleep_s) for p in range(producers)]
    outcomes = []
    for ref in producer_refs + consumer_refs:
        try:
            outcomes.append((True, tray.get(ref)))
        except Exception as error:  # noqa: BLE001 - judged below and by the runner
            outcomes.append((False, error))
    received = [value for ok, value in outcomes[producers:] if ok]
    _check_fifo(received)
    label = f"Queue: {producers} producers x {per_producer} items, {consumers} consumers"
    failed = [value for ok, value in outcomes if not ok]
    if failed:
        # A fault explains the rest (a consumer that died leaves producers
        # blocked on a full queue, a producer that died starves consumers).
        blamed = next((error for error in failed if _is_fault_error(error)), failed[0])
        program.expect(_reraise.remote(blamed), None, label=f"util: {label}")
        return
    got = sorted(item for items in received for item in items)
    expected = sorted((p, seq) for p in range(producers) for seq in range(per_producer))
    program.expect(tray.put(got), expected, label=f"util: {label}")


def _queue_as_ray(program, queue: Queue) -> bool:
    """What Ray's Queue promises the driver (``queue-as-ray``): items come
    out in the order they went in, ``qsize``/``empty``/``full`` count them
    against ``maxsize``, a ``put`` on a full queue raises ``Full`` and a
    ``get`` on an empty one ``Empty``, at once without blocking and after
    (never before) the timeout with it. Leaves the queue empty. False when a
    fault ended it (the error goes to the runner)."""
    from . import cluster

    own = _own_rng(program, "queue")
    clock = cluster().clock
    maxsize = queue.maxsize
    items = [("probe", i) for i in range(maxsize or own.randint(1, 4))]
    timeout_s = own.choice([0.01, 0.05, 0.2])
    done: list[str] = []

    def broken(what: str):
        return _violation("queue-as-ray", f"Queue(maxsize={maxsize}) after "
                          f"{'; '.join(done) or 'nothing'}: {what}")

    def refused(name: str, call, error_class, timed: bool) -> None:
        started_s = clock.current_time()
        try:
            got = call()
        except error_class:
            waited_s = clock.current_time() - started_s
            if timed and waited_s < timeout_s - 1e-6:
                raise broken(f"{name} raised {error_class.__name__} after {waited_s:.3f} s, "
                             f"before its timeout of {timeout_s} s") from None
            done.append(f"{name} -> {error_class.__name__}")
            return
        raise broken(f"{name} returned {got!r} instead of raising {error_class.__name__}")

    def counts(size: int) -> None:
        got = (queue.qsize(), queue.empty(), queue.full())
        want = (size, size == 0, bool(maxsize) and size >= maxsize)
        if got != want:
            raise broken(f"(qsize, empty, full) is {got}, with {size} items it must be {want}")

    try:
        for index, item in enumerate(items):
            if own.random() < 0.5:
                queue.put_nowait(item)
            else:
                queue.put(item, timeout=timeout_s)
            done.append(f"put {index}")
        counts(len(items))
        if maxsize:
            refused("put_nowait", lambda: queue.put_nowait(("over", 0)), Full, False)
            refused(f"put(timeout={timeout_s})",
                    lambda: queue.put(("over", 1), timeout=timeout_s), Full, True)
            counts(len(items))
        got = [queue.get_nowait() if own.random() < 0.5 else queue.get(timeout=timeout_s)
               for _ in items]
        if got != items:
            raise broken(f"got {got} back from {items} put in that order")
        done.append(f"got {len(got)} back")
        counts(0)
        refused("get_nowait", queue.get_nowait, Empty, False)
        refused(f"get(timeout={timeout_s})", lambda: queue.get(timeout=timeout_s), Empty, True)
        counts(0)
    except InvariantViolation:
        raise
    except Exception as error:  # noqa: BLE001 - a fault's error, judged by the runner
        if not _is_fault_error(error):
            raise broken(f"raised {type(error).__name__}: {error}") from None
        program.expect(_reraise.remote(error), None,
                       label=f"util: Queue(maxsize={maxsize}) from the driver")
        return False
    return True


def _check_fifo(received: list) -> None:
    seen = set()
    for consumer, items in enumerate(received):
        last: dict = {}
        for producer, seq in items:
            if (producer, seq) in seen:
                raise _violation("queue-delivers-each-item-once",
                                 f"item {seq} of producer {producer} was received twice "
                                 f"(consumers got {received})")
            seen.add((producer, seq))
            if seq <= last.get(producer, -1):
                raise _violation("queue-is-fifo-per-producer",
                                 f"consumer {consumer} got item {seq} of producer {producer} "
                                 f"after item {last[producer]}: {items}")
            last[producer] = seq


PIECES = {"actor_pool": _actor_pool, "pool": _process_pool, "queue": _queue}


def util_library(program) -> None:
    names = sorted(PIECES)
    for _ in range(program.rng.randint(1, 3)):
        PIECES[program.rng.choice(names)](program)


WORKLOADS = {"util": util_library}
