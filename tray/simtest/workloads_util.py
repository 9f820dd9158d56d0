"""tray.util under faults: an ActorPool map, a multiprocessing Pool and a
Queue between producer and consumer tasks, while the seed's faults fire.

Reference models:

* ``ActorPool.map`` / ``map_unordered`` over actors that restart and retry
  their calls (``max_restarts=-1``, ``max_task_retries=3``) returns exactly
  ``[2 * v for v in values]`` (sorted, for the unordered form): a crash may
  re-run a call, never lose or duplicate a result.
* ``Pool.map`` / ``imap`` / ``starmap`` return the squares of their input,
  in order; ``imap_unordered`` the same multiset.
* The queue is checked for what a FIFO queue promises, whatever fails:
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

import time

import tray
from tray.util import ActorPool
from tray.util.multiprocessing import Pool
from tray.util.queue import Queue


@tray.remote(max_retries=3)
def _reraise(error: BaseException):
    raise error


@tray.remote
class _Doubler:
    def double(self, value: int, sleep_s: float) -> int:
        time.sleep(sleep_s)
        return 2 * value


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
    from .invariants import InvariantViolation

    return InvariantViolation(invariant, message)


def _expect(program, build, expected, label: str) -> None:
    try:
        ref = tray.put(build())
    except Exception as error:  # noqa: BLE001 - judged by the runner like any error
        ref = _reraise.remote(error)
    program.expect(ref, expected, label=f"util: {label}")


def _total_cpus() -> int:
    return max(int(tray.cluster_resources().get("CPU", 1)), 1)


# ================================================================ pieces


def _actor_pool(program) -> None:
    rng = program.rng
    values = list(range(rng.randint(4, 24)))
    sleep_s = rng.choice([0.01, 0.05, 0.1])
    ordered = rng.random() < 0.5
    actors = [_Doubler.options(max_restarts=-1, max_task_retries=3).remote()
              for _ in range(rng.randint(1, 3))]
    program.actors.extend(actors)

    def build():
        pool = ActorPool(actors)
        if ordered:
            return list(pool.map(lambda a, v: a.double.remote(v, sleep_s), values))
        return sorted(pool.map_unordered(lambda a, v: a.double.remote(v, sleep_s), values))

    _expect(program, build, [2 * v for v in values],
            f"ActorPool.{'map' if ordered else 'map_unordered'} of {len(values)} values over "
            f"{len(actors)} actors")


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
        from .invariants import _is_fault_error

        blamed = next((error for error in failed if _is_fault_error(error)), failed[0])
        program.expect(_reraise.remote(blamed), None, label=f"util: {label}")
        return
    got = sorted(item for items in received for item in items)
    expected = sorted((p, seq) for p in range(producers) for seq in range(per_producer))
    program.expect(tray.put(got), expected, label=f"util: {label}")


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
