"""The actor call fast paths: calls sent without a task per call
(``ActorTaskSubmitter.send_now`` and ``Connection.start_call``), calls in
their turn admitted by the actor's receive loop with no task per call
(``handle_actor_call``'s ``Deferred``), the caller's floor kept in O(1),
and the actor's per-caller queue found through lazy heaps.

What must hold whatever path a call takes: calls from one caller run in call
order, each exactly once; a broken connection falls back to the retrying path;
a call that needs waiting (an argument not ready yet) still runs in order."""

from __future__ import annotations

import random

import pytest
import trio

import tray
import tray.simtest
from tray.api.blocking import in_loop
from tray.core.context import driver
from tray.core.worker.actor_host import CallerQueue
from tray.core.worker.actor_task_submitter import ActorState


@tray.remote
class Recorder:
    def __init__(self):
        self.seen = []

    def record(self, i):
        self.seen.append(i)
        return i

    def record_value(self, value, i):
        self.seen.append(i)
        return value

    def log(self):
        return list(self.seen)

    def pid(self):
        import os
        return os.getpid()

    def fail(self, message):
        raise ValueError(message)


def _submitter_statistics():
    worker = driver()
    return in_loop(worker, worker.actor_submitter.statistics)


@tray.remote
def slow_value(value, delay_s):
    import time
    time.sleep(delay_s)
    return value


@tray.remote
def call_in_a_burst(actor, count):
    return tray.get([actor.record.remote(i) for i in range(count)])


def test_a_burst_of_calls_from_the_driver_runs_in_call_order(one_node):
    recorder = Recorder.remote()
    assert tray.get(recorder.record.remote(-1)) == -1  # alive, connected: the fast path
    before = _submitter_statistics()
    refs = [recorder.record.remote(i) for i in range(400)]
    assert tray.get(refs) == list(range(400))
    after = _submitter_statistics()
    assert tray.get(recorder.log.remote()) == [-1, *range(400)]
    # Sent without a task each (a few may start on the task path while the
    # driver's loop still sends the calls of an earlier burst).
    assert after.calls_sent_at_once - before.calls_sent_at_once >= 390
    assert after.calls_pending == 0


def test_a_burst_of_calls_from_a_task_runs_in_call_order(one_node):
    recorder = Recorder.remote()
    assert tray.get(recorder.record.remote(-1)) == -1
    assert tray.get(call_in_a_burst.remote(recorder, 300)) == list(range(300))
    assert tray.get(recorder.log.remote()) == [-1, *range(300)]


def test_a_call_waiting_for_its_argument_keeps_its_place(one_node):
    """A call whose argument is not ready takes the slow path; the calls
    after it go at once, and the actor still runs them after it."""
    recorder = Recorder.remote()
    assert tray.get(recorder.record.remote(-1)) == -1
    pending = slow_value.remote("late", 0.5 * (1 if one_node.is_sim else 0.5))
    first = recorder.record_value.remote(pending, 0)
    rest = [recorder.record.remote(i) for i in range(1, 50)]
    assert tray.get(first) == "late"
    assert tray.get(rest) == list(range(1, 50))
    assert tray.get(recorder.log.remote()) == [-1, *range(50)]


def test_calls_in_flight_when_the_actor_dies_are_retried_in_order(backend):
    """Calls sent on the fast path whose connection breaks (the actor's
    process killed) go through the retrying path: each runs once on the
    restarted actor, in call order."""
    tray.init(backend=backend, num_cpus=2, **({"seed": 3} if backend == "sim" else {}))
    try:
        recorder = Recorder.options(max_restarts=1, max_task_retries=-1).remote()
        assert tray.get(recorder.record.remote(-1)) == -1
        if backend == "sim":
            sim = tray.simtest.cluster()
            refs = [recorder.record.remote(i) for i in range(50)]
            sim.kill_worker(sim.worker_of(recorder))
        else:
            import os
            import signal
            pid = tray.get(recorder.pid.remote())
            refs = [recorder.record.remote(i) for i in range(50)]
            os.kill(pid, signal.SIGKILL)
        assert tray.get(refs, timeout=60) == list(range(50))
        log = tray.get(recorder.log.remote())
        # The new instance ran the calls the old one had not answered, in order.
        assert log == sorted(log)
        assert log[-1] == 49
    finally:
        tray.shutdown()


def test_a_call_to_a_dead_actor_fails_on_the_fast_path_too(one_node):
    recorder = Recorder.remote()
    assert tray.get(recorder.record.remote(0)) == 0
    tray.kill(recorder)
    with pytest.raises(tray.exceptions.ActorDiedError):
        tray.get([recorder.record.remote(i) for i in range(20)], timeout=60)


# ------------------------------------------------------------ the bookkeeping

def test_calls_in_their_turn_take_no_task_of_their_own(monkeypatch):
    # A call whose turn it is goes from the actor's receive loop straight to
    # its executor, which replies; a task per call waited to reply before.
    # A concurrent actor's calls still take one; results and errors are
    # what they were.
    from tray.core import rpc

    tasks = []
    run_soon = rpc.Deferred.run_soon

    def counted(self, async_fn, *args):
        tasks.append(async_fn.__name__)
        run_soon(self, async_fn, *args)

    monkeypatch.setattr(rpc.Deferred, "run_soon", counted)
    tray.init(backend="sim", seed=5, num_cpus=2)
    try:
        recorder = Recorder.remote()
        assert tray.get(recorder.record.remote(0)) == 0
        assert tray.get([recorder.record.remote(i) for i in range(1, 40)]) == list(range(1, 40))
        assert tray.get(recorder.log.remote()) == list(range(40))
        with pytest.raises(ValueError, match="refused"):
            tray.get(recorder.fail.remote("refused"))
        assert tasks == []
        concurrent = Recorder.options(max_concurrency=4).remote()
        assert sorted(tray.get([concurrent.record.remote(i) for i in range(4)])) == [0, 1, 2, 3]
        assert tasks == ["_call_in_task"] * 4
    finally:
        tray.shutdown()


def test_the_callers_floor_is_its_lowest_unfinished_call():
    state = ActorState("a" * 32)
    rng = random.Random(7)
    for _ in range(2000):
        if state.unfinished and rng.random() < 0.5:
            state.unfinished.pop(rng.choice(list(state.unfinished)))
        else:
            state.unfinished[state.next_seq] = True
            state.next_seq += 1
        assert state.floor() == min(state.unfinished, default=state.next_seq)


def test_the_actor_finds_its_earliest_waiter_and_forgets_below_a_floor():
    queue = CallerQueue()
    rng = random.Random(11)
    seqs = list(range(500))
    rng.shuffle(seqs)
    for seq in seqs:
        queue.add_waiter(seq, trio.Event())
        queue.add_started(seq, trio.Event())
        assert queue.first_waiter() == min(queue.waiters)
    while queue.waiters:
        seq = rng.choice(list(queue.waiters))
        del queue.waiters[seq]
        assert queue.first_waiter() == (min(queue.waiters) if queue.waiters else None)
    assert queue.first_waiter() is None
    queue.replies = {seq: object() for seq in range(0, 500, 3)}
    queue.forget_below(250)
    assert min(queue.started) == 250
    assert all(seq >= 250 for seq in queue.replies)
    # The lazy heaps stay within twice their table (plus a constant) as
    # entries come and go without a floor passing them.
    for seq in range(500, 5000):
        queue.add_waiter(seq, trio.Event())
        del queue.waiters[seq]
        queue.add_started(seq, trio.Event())
        del queue.started[seq]
    assert len(queue._waiting_order) <= 2 * len(queue.waiters) + 65
    assert len(queue._started_order) <= 2 * len(queue.started) + 65


def test_a_restarted_actor_is_told_the_floor_a_call_its_predecessor_answered_passed():
    # Simtest mixed default 1261, 8114 and chaos 9399, directly: call #1 was
    # answered by incarnation 1 (its re-sent copy got the kept reply) while
    # #0 and #2 were re-sent to incarnation 2 with floor 0. Once #0 ran
    # there, the floor is 2; incarnation 2 never saw #1, so it must be told,
    # else #2 waits for #1 forever. (The caller used to skip a floor after
    # an answered call: "the actor ran it and moved past it".)
    from types import SimpleNamespace

    from tray.core.messages import ActorInfo, ActorStatus
    from tray.core.worker.actor_task_submitter import ActorTaskSubmitter

    sent = []
    outbox = SimpleNamespace(send_later=lambda *message: sent.append(message))
    submitter = ActorTaskSubmitter(
        address="n0/driver", name="driver", endpoint=None, gcs=None, bridge=None,
        outbox=outbox, tracer=None, task_manager=SimpleNamespace(), resolver=None,
        functions=None, references=None)

    def incarnation(n: int) -> ActorInfo:
        return ActorInfo("a", ActorStatus.ALIVE, f"n{n}/worker", "w", "node", None, "", n - 1, -1,
                         None, n, "A", -1, False, {})

    state = submitter.actor_state("a")
    calls = [SimpleNamespace(spec=SimpleNamespace(seq=submitter.next_call(state)))
             for _ in range(3)]
    state.info = incarnation(1)
    state.told(1, 0)  # the three calls went to incarnation 1 with floor 0
    submitter._call_ended(calls[1], state, 1)
    assert sent == []  # #0 is still unfinished: the floor is 0
    state.info = incarnation(2)
    state.told(2, 0)  # #0 and #2 re-sent there with floor 0
    submitter._call_ended(calls[0], state, 2)
    assert sent == [("n2/worker", "actor_floor", "n0/driver", 2)]
    # In one incarnation, a call answered in order needs no floor message.
    submitter._call_ended(calls[2], state, 2)
    assert len(sent) == 1


def _submitter_with_gcs(gcs):
    from types import SimpleNamespace

    from tray.core.worker.actor_task_submitter import ActorTaskSubmitter

    return ActorTaskSubmitter(address="caller", name="caller", endpoint=None, gcs=gcs,
                              bridge=None, outbox=None, tracer=None,
                              task_manager=SimpleNamespace(), resolver=None, functions=None,
                              references=None)


def _actor_info(incarnation: int, address: str = "n0/worker-old"):
    from tray.core.messages import ActorInfo, ActorStatus

    return ActorInfo("a" * 32, ActorStatus.ALIVE, address, "w" * 32, "n" * 32, None, "", 0, -1,
                     None, incarnation, "Squarer", 0, False, {})


def test_a_call_that_found_nothing_listening_waits_for_the_next_incarnation_boundedly():
    """Such a call waits for the GCS to report the actor's next incarnation
    (it cannot have run, so it spends no retry), but not for ever: a live
    process that refused the connection gets the call failed as one cut
    off, after UNSENT_CALL_WAIT_S."""
    import trio.testing

    from tray.core.worker import actor_task_submitter as ats

    class SilentGcs:  # has not heard of any death, and never will
        async def call(self, method, *args):
            await trio.sleep_forever()

    class AnsweringGcs:
        async def call(self, method, actor_id, seen):
            assert method == "wait_actor_ready" and seen == 1
            await trio.sleep(0.5)
            return _actor_info(2, "n1/worker-new")

    async def main():
        silent = _submitter_with_gcs(SilentGcs())
        state = ActorState("a" * 32, info=_actor_info(1))
        start = trio.current_time()
        assert await silent._next_incarnation(state, state.info) is False
        assert trio.current_time() - start == pytest.approx(ats.UNSENT_CALL_WAIT_S)
        assert state.seen_incarnation == 0 and state.info.incarnation == 1  # untouched

        answering = _submitter_with_gcs(AnsweringGcs())
        assert await answering._next_incarnation(state, state.info) is True
        assert state.seen_incarnation == 1
        assert (state.info.incarnation, state.info.address) == (2, "n1/worker-new")

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
