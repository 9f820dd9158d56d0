"""Proving the ``util`` workload's models (``actor-pool-as-ray``,
``queue-as-ray``): bugs planted one at a time in tray.util's ActorPool and
Queue (by monkeypatching, never by editing them) must make the sweep fail
on the right invariant within a stated number of seeds. (Not every seed
runs a Queue: the queue's tests need more seeds, each a fraction of a
second.)"""

from __future__ import annotations

from planting import first_failure  # (tests/ is on sys.path)

from tray import exceptions
from tray.util import actor_pool
from tray.util import queue as tray_queue
from tray.util.queue import Empty, Full


def test_a_pool_that_keeps_the_actor_of_a_failed_call_is_caught_within_3_seeds(monkeypatch):
    # Ray gives the actor back before it reads the result: a call that
    # raised must not take its actor out of the pool.
    def result_of(self, call):
        del self._calls[call.index]
        try:
            value = actor_pool.get(call.future)
        except exceptions.ActorDiedError:
            raise
        self._return_actor(call.actor)
        return value

    monkeypatch.setattr(actor_pool.ActorPool, "_result_of", result_of)
    first_failure(range(3), "util", "none", "actor-pool-as-ray")


def test_a_pool_that_drops_the_result_on_a_timeout_is_caught_within_5_seeds(monkeypatch):
    timed_out = actor_pool.ActorPool._timed_out

    def forgetful(self, call, ignore_if_timedout):
        if call is not None:  # the late call is forgotten, its actor kept busy
            del self._calls[call.index]
        return timed_out(self, None, ignore_if_timedout)

    monkeypatch.setattr(actor_pool.ActorPool, "_timed_out", forgetful)
    first_failure(range(5), "util", "none", "actor-pool-as-ray")


def test_a_pool_that_starts_waiting_values_newest_first_is_caught_within_3_seeds(monkeypatch):
    def return_actor(self, actor, alive=True):
        if alive:
            self._idle.append(actor)
        while self._waiting and self._idle:
            fn, value = self._waiting.pop()
            self._start(fn, value, self._idle.pop())

    monkeypatch.setattr(actor_pool.ActorPool, "_return_actor", return_actor)
    first_failure(range(3), "util", "none", "actor-pool-as-ray")


def test_a_queue_that_holds_one_item_past_maxsize_is_caught_within_12_seeds(monkeypatch):
    monkeypatch.setattr(tray_queue._QueueActor, "_full",
                        lambda self: 0 < self.maxsize < len(self.items))
    first_failure(range(12), "util", "none", "queue-as-ray")


def test_a_queue_whose_put_gives_up_before_its_timeout_is_caught_within_12_seeds(monkeypatch):
    put = tray_queue._QueueActor.put

    async def impatient(self, item, timeout_s=None):
        if timeout_s is not None and self._full():
            raise Full("the queue is full")
        return await put(self, item, timeout_s)

    monkeypatch.setattr(tray_queue._QueueActor, "put", impatient)
    first_failure(range(12), "util", "none", "queue-as-ray")


def test_a_queue_that_gives_the_newest_item_first_is_caught_within_12_seeds(monkeypatch):
    async def get_nowait(self):
        if not self.items:
            raise Empty("the queue is empty")
        return self.items.pop()

    monkeypatch.setattr(tray_queue._QueueActor, "get_nowait", get_nowait)
    first_failure(range(12), "util", "none", "queue-as-ray")
