"""What the simulator's speed work must not break: a message is the
receiver's own copy and arrives in order and not early; a parked receiver
wakes on a close; the trace digest does not depend on when it is read; the
virtual clock runs a driver call at the time it was queued; checking only
the components that ran still catches a state broken from outside a
process."""

from __future__ import annotations

import dataclasses
import pickle
import random

import pytest
import trio

import tray
import tray.simtest
from tray.backends.sim.validation import SimulationInvariantError
from tray.core.interfaces import ConnectionClosed, NullTracer
from tray.core.trace import HASH_BATCH_EVENTS, Trace
from tray.transports.sim import SimNetwork


async def _connected(network: SimNetwork, listener: str, client: str):
    accepted: list = []

    async def on_stream(stream) -> None:
        accepted.append(stream)
        await trio.sleep_forever()

    nursery_box: list = []

    async def serve(task_status=trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            nursery_box.append(nursery)
            await nursery.start(network.transport(listener).serve, listener, on_stream)
            task_status.started()

    return serve, accepted, nursery_box


async def test_a_message_is_the_receivers_own_copy_in_order_and_never_early(autojump_clock):
    network = SimNetwork(random.Random(0), NullTracer())
    serve, accepted, _ = await _connected(network, "n1/server", "n0/client")
    async with trio.open_nursery() as nursery:
        await nursery.start(serve)
        client = await network.transport("n0/client").connect("n1/server")
        while not accepted:
            await trio.sleep(0)
        server = accepted[0]
        payload = {"items": [1, 2, 3]}
        sent_at = trio.current_time()
        client.send_nowait(("first", payload))
        payload["items"].append(4)  # after the send: the receiver must not see it
        for n in range(20):
            client.send_nowait(("next", n))
        kind, received = await server.receive()
        # Another machine is at least 100 µs away.
        assert trio.current_time() - sent_at >= network.latency_remote_s[0]
        assert (kind, received) == ("first", {"items": [1, 2, 3]})
        assert received is not payload
        received["items"].clear()  # nor may the sender see the receiver's changes
        assert payload["items"] == [1, 2, 3, 4]
        assert [(await server.receive())[1] for _ in range(20)] == list(range(20))
        nursery.cancel_scope.cancel()


async def test_a_parked_receiver_wakes_when_its_peer_closes(autojump_clock):
    network = SimNetwork(random.Random(1), NullTracer())
    serve, accepted, _ = await _connected(network, "n0/server", "n0/client")
    async with trio.open_nursery() as nursery:
        await nursery.start(serve)
        client = await network.transport("n0/client").connect("n0/server")
        while not accepted:
            await trio.sleep(0)
        server = accepted[0]
        closed_at: list = []

        async def receive_until_closed() -> None:
            with pytest.raises(ConnectionClosed):
                await server.receive()
            closed_at.append(trio.current_time())

        nursery.start_soon(receive_until_closed)
        await trio.sleep(1.0)  # the receiver is parked with nothing to wait for
        assert not closed_at
        client.close()
        with trio.fail_after(1):
            while not closed_at:
                await trio.sleep(0)
        assert closed_at[0] == pytest.approx(trio.current_time())
        with pytest.raises(ConnectionClosed):
            client.send_nowait(("late", 0))
        nursery.cancel_scope.cancel()


def test_the_digest_does_not_depend_on_when_it_is_read():
    class Id:
        def __init__(self, raw: bytes) -> None:
            self.raw = raw

        def hex(self) -> str:
            return self.raw.hex()

    def fill(trace: Trace, read_every: int) -> list:
        seen = []
        for n in range(3 * HASH_BATCH_EVENTS + 7):
            trace.record("n0/driver", "task_started", task_id=Id(bytes([n % 256, 1])),
                         attempt=n, spec={"b": [1.5, None], "a": "x"}, name=f"f{n}")
            if read_every and n % read_every == 0:
                seen.append(trace.digest())
        return seen + [trace.digest()]

    once = fill(Trace(lambda: 1.25), 0)[-1]
    often = fill(Trace(lambda: 1.25), 97)
    assert often[-1] == once
    assert len(set(often)) == len(often)  # every event moved the digest
    # An id and its hex string are the same field; a dict's order is not.
    a, b = Trace(lambda: 0.0), Trace(lambda: 0.0)
    a.record("c", "e", task_id=Id(b"\x01\x02"), spec={"x": 1, "y": 2})
    b.record("c", "e", task_id="0102", spec={"y": 2, "x": 1})
    assert a.digest() == b.digest()
    assert a.events[0] == {"t": 0.0, "component": "c", "event": "e", "task_id": "0102",
                           "spec": {"x": 1, "y": 2}}


def test_a_driver_call_runs_when_queued_not_at_the_next_deadline():
    tray.init(backend="sim", seed=3)
    try:
        cluster = tray.simtest.cluster()

        @tray.remote
        def now() -> float:
            import time
            return time.time()

        tray.get(now.remote())
        for _ in range(5):
            queued_at = cluster.clock.current_time()
            started = tray.get(now.remote()) - 1_767_225_600.0
            # A round trip on one machine plus the task's cost, far below a
            # heartbeat period.
            assert started - queued_at < 0.05
    finally:
        tray.shutdown()


@pytest.mark.parametrize("where", ["driver", "node"])
def test_checking_only_what_ran_still_catches_a_state_broken_from_outside(where):
    tray.init(backend="sim", seed=4, validate_every_steps=1)
    try:
        cluster = tray.simtest.cluster()
        address = "n0/driver" if where == "driver" else "n0/raylet"
        component = cluster.processes[address].component
        broken: list = []
        original = component.validate_state

        def validate_state() -> None:
            original()
            assert not broken, "planted by the test"

        component.validate_state = validate_state

        @tray.remote
        def one() -> int:
            return 1

        assert tray.get(one.remote()) == 1
        if where == "driver":
            broken.append(True)  # the driver's own code, between two calls
        else:
            cluster.at(0.0, lambda: broken.append(True))  # a task of no process
        with pytest.raises((SimulationInvariantError, tray.exceptions.TrayError)) as caught:
            tray.get(one.remote())
            cluster.advance(0.01)
        error = caught.value
        while not isinstance(error, SimulationInvariantError) and error.__cause__ is not None:
            error = error.__cause__
        assert isinstance(error, SimulationInvariantError)
        assert error.address == address and "planted by the test" in str(error)
    finally:
        component.validate_state = original
        try:
            tray.shutdown()
        except Exception:
            pass


def test_the_same_seed_replays_with_validation_and_faults():
    from tray.simtest import runner

    first = runner.run_seed(7, "mixed", "chaos")
    second = runner.run_seed(7, "mixed", "chaos")
    assert first.digest == second.digest


# ------------------------------------------------------------ copy on send

@dataclasses.dataclass(frozen=True)
class _Plain:
    name: str
    sizes: tuple


def test_copy_message_shares_only_what_cannot_change():
    from tray.core.ids import ObjectID
    from tray.core.messages import InlineResult, StoredResult, TaskReply
    from tray.core.serialization import SerializedObject
    from tray.transports.sim import copy_message

    oid = ObjectID(bytes(20))
    plain = _Plain("a", (1, 2))
    stored = StoredResult([("node", "n1/raylet")], [(oid.binary(), "n0/driver")])
    reply = TaskReply([InlineResult(SerializedObject(b"x", [bytearray(b"buf")]))])
    message = (1, 7, True, (plain, oid, stored, reply, {"k": [1]}, {3}, frozenset({4})))
    copied = copy_message(message)
    # Equal, field for field.
    assert pickle.dumps(copied, protocol=5) == pickle.dumps(message, protocol=5)
    _, _, _, (c_plain, c_oid, c_stored, c_reply, c_dict, c_set, c_frozen) = copied
    # Immutable all the way down: shared.
    assert c_plain is plain and c_oid is oid and c_frozen is message[3][6]
    # Frozen, but holding lists: a new object with new lists.
    assert c_stored is not stored and c_stored.locations is not stored.locations
    assert c_stored.locations == stored.locations
    assert c_reply.results[0] is not reply.results[0]
    buffers = c_reply.results[0].value.buffers
    assert buffers == [bytearray(b"buf")] and buffers[0] is not reply.results[0].value.buffers[0]
    assert c_dict == {"k": [1]} and c_dict["k"] is not message[3][4]["k"]
    assert c_set == {3} and c_set is not message[3][5]


_reduced: list = []


class _Hooked:
    def __init__(self, value) -> None:
        self.value = value

    def __reduce__(self):
        _reduced.append(self.value)
        return (_Hooked, (self.value,))


def test_copy_message_copies_dicts_whatever_their_keys():
    # Dicts are copied in C and patched where a value must be copied; a key
    # of another type than str/int/... takes the slow path, which copies it.
    from tray.transports.sim import copy_message

    inner = {"CPU": 1.0}
    plain_keys = {"a": 1, "resources": inner, "name": "f", 2: None}
    copied = copy_message(plain_keys)
    assert copied == plain_keys and list(copied) == list(plain_keys)
    assert copied is not plain_keys and copied["resources"] is not inner
    _reduced.clear()
    hooked = _Hooked(7)
    other_keys = {("t", 1): [1], hooked: "x", "z": inner}
    copied = copy_message(other_keys)
    assert _reduced == [7]  # the key went through its own pickle hook
    keys = list(copied)
    assert keys[0] == ("t", 1) and isinstance(keys[1], _Hooked) and keys[1] is not hooked
    assert copied[("t", 1)] == [1] and copied[("t", 1)] is not other_keys[("t", 1)]
    assert copied["z"] == inner and copied["z"] is not inner


def test_copy_message_copies_a_long_list_whole_through_pickle():
    # A list of LIST_PICKLED_FROM_ITEMS items or more is one pickle round
    # trip: still the receiver's own copy, hooks run once per item.
    from tray.transports.sim import LIST_PICKLED_FROM_ITEMS, copy_message

    _reduced.clear()
    records = [(f"t{n}", n, {"state": {"RUNNING": 0.5}}, [n]) for n in
               range(LIST_PICKLED_FROM_ITEMS)] + [_Hooked(9)]
    copied = copy_message((2, 0, "add_task_events", (records,)))[3][0]
    assert _reduced == [9]
    assert copied is not records and len(copied) == len(records)
    assert copied[:-1] == records[:-1]
    assert copied[0][2] is not records[0][2] and copied[0][2]["state"] is not \
        records[0][2]["state"] and copied[0][3] is not records[0][3]
    assert isinstance(copied[-1], _Hooked) and copied[-1] is not records[-1]
    short = records[:3]
    assert copy_message((2, 0, "m", (short,)))[3][0] == short


def test_copy_message_uses_pickle_for_classes_with_hooks_of_their_own():
    from tray.transports.sim import copy_message

    _reduced.clear()
    error = ValueError("boom")
    copied = copy_message((0, 1, "m", ([_Hooked(5)], error)))
    assert _reduced == [5]  # its own hook ran, as when the whole message was pickled
    hooked, copied_error = copied[3][0][0], copied[3][1]
    assert isinstance(hooked, _Hooked) and hooked.value == 5
    assert type(copied_error) is ValueError and copied_error is not error
    # A cycle: pickle copies the whole message.
    loop: list = []
    loop.append(loop)
    again = copy_message((2, 0, "m", (loop,)))[3][0]
    assert again is not loop and again[0] is again


# ----------------------------------------------- the checks' quick tests

def test_the_quick_tests_of_the_driver_checks_still_catch_each_broken_field():
    # ReferenceCounter and TaskManager test each entry by one expression
    # first and assert field by field only when it fails: every field the
    # asserts look at must make that expression fail.
    import time

    @tray.remote
    def slow(x):
        time.sleep(10.0)
        return x

    tray.init(backend="sim", seed=5)
    try:
        driver = tray.simtest.cluster().processes["n0/driver"].component
        arg = tray.put(list(range(1000)))  # held by the pending task below
        ref = slow.remote(arg)
        tray.wait([ref], timeout=0.5)
        driver.validate_state()  # a sound state passes
        entry = driver.references.refs[ref.object_id()]
        task = next(iter(driver.task_manager.tasks.values()))
        broken = [(entry, "local", -1), (entry, "submitted", -1), (entry, "contained", -1),
                  (entry, "borrowers", {"n0/worker-x": 0}), (entry, "owned", False),
                  (entry, "lineage", -1), (entry, "lineage", 1), (entry, "event", None),
                  (task, "retries_left", -2), (task, "state", "FINISHED"),
                  (task, "state", "PENDING_ARGS_AVAIL")]  # pushed, yet not submitted
        for target, name, value in broken:
            saved = getattr(target, name)
            if name == "event":  # ready with an event still set
                target.ready = True
                value = trio.Event()
            setattr(target, name, value)
            try:
                with pytest.raises(AssertionError):
                    driver.validate_state()
            finally:
                setattr(target, name, saved)
                if name == "event":
                    target.ready = False
        driver.validate_state()
    finally:
        tray.shutdown()


# ------------------------------------------- host-driven sleeps and calls

def test_a_simulated_sleep_wakes_on_time_and_can_be_cancelled():
    real_sleep = trio.sleep
    tray.init(backend="sim", seed=6)
    try:
        cluster = tray.simtest.cluster()
        assert trio.sleep is not real_sleep  # the cluster's timers while it runs

        async def sleeps() -> tuple:
            start = trio.current_time()
            await trio.sleep(0.5)
            slept = trio.current_time() - start
            start = trio.current_time()
            with trio.move_on_after(0.1) as scope:
                await trio.sleep(10.0)
            cut = trio.current_time() - start
            # The cancelled sleep's entry is dead: nothing wakes this task at 10 s.
            await trio.sleep(20.0)
            return slept, scope.cancelled_caught, cut

        slept, cancelled, cut = cluster.run(sleeps)
        assert slept == pytest.approx(0.5, abs=1e-9)
        assert cancelled and cut == pytest.approx(0.1, abs=1e-9)
    finally:
        tray.shutdown()
    assert trio.sleep is real_sleep


def test_calls_queued_from_the_driver_run_in_order_at_the_time_they_were_queued():
    tray.init(backend="sim", seed=7)
    try:
        cluster = tray.simtest.cluster()
        seen: list = []
        queued_at = cluster.clock.current_time()
        for n in range(50):
            cluster.call_soon(lambda n=n: seen.append((n, trio.current_time())))
        cluster.advance(0.001)
        assert [n for n, _ in seen] == list(range(50))
        assert all(at == queued_at for _, at in seen)
    finally:
        tray.shutdown()


def test_a_worker_started_after_the_driver_sets_a_variable_sees_it():
    import os

    @tray.remote
    def read(name):
        return os.environ.get(name)

    name = "TRAY_TEST_SIM_ENVIRON_SNAPSHOT"
    tray.init(backend="sim", seed=8, num_cpus=1)
    try:
        assert tray.get(read.remote(name)) is None
        os.environ[name] = "set"  # the real environ: the driver's code
        cluster = tray.simtest.cluster()
        cluster.kill_worker(cluster.workers()[0])  # the next task starts a new worker
        assert tray.get(read.options(max_retries=3).remote(name)) == "set"
    finally:
        os.environ.pop(name, None)
        tray.shutdown()


def test_a_delivery_recorded_on_the_fast_path_is_the_generic_event():
    # Trace.record_receive (one per simulated message) must hash and keep
    # exactly what record(receiver, "recv", peer=..., msg=...) does, or
    # every seed's digest would depend on which path recorded it.
    fast, generic = Trace(lambda: 0.000123456789), Trace(lambda: 0.000123456789)
    for n in range(HASH_BATCH_EVENTS + 3):
        fast.record_receive("n1/raylet", "n0/driver", f"reply#{n}")
        generic.record("n1/raylet", "recv", peer="n0/driver", msg=f"reply#{n}")
    fast.record_receive("n1/raylet", "n0/driver", None)  # not a str: the generic path
    generic.record("n1/raylet", "recv", peer="n0/driver", msg=None)
    assert fast.digest() == generic.digest()
    assert list(fast.events) == list(generic.events)
    assert fast.event_count == generic.event_count == HASH_BATCH_EVENTS + 4
    fast.record_receive("n1/raylet", "n0/driver", "other")
    assert fast.digest() != generic.digest()


def test_an_id_field_is_its_hex_string_whatever_its_type():
    # record() renders bytes and ids on a fast path: as _canonical would.
    from tray.core.ids import TaskID

    raw = bytes(range(16))
    traces = [Trace(lambda: 0.5) for _ in range(3)]
    for trace, value in zip(traces, (TaskID(raw), raw, raw.hex()), strict=True):
        trace.record("n0/driver", "task_started", task=value, attempt=1)
    assert len({trace.digest() for trace in traces}) == 1
    assert [trace.events[0]["task"] for trace in traces] == [raw.hex()] * 3


def test_instruments_work_on_the_simulators_dict_instrument_table():
    # The simulator swaps trio's UserDict instrument table for a dict
    # (tray._trio_private.DictInstruments): trio's add/remove/call must still work on it.
    class Steps(trio.abc.Instrument):
        def __init__(self) -> None:
            self.steps = 0

        def before_task_step(self, task) -> None:
            self.steps += 1

    steps = Steps()

    async def add() -> None:
        trio.lowlevel.add_instrument(steps)

    async def remove() -> None:
        trio.lowlevel.remove_instrument(steps)

    tray.init(backend="sim", seed=0, validate_every_steps=1)
    try:
        cluster = tray.simtest.cluster()

        @tray.remote
        def one() -> int:
            return 1

        cluster.run(add)
        assert tray.get(one.remote()) == 1
        assert steps.steps > 0
        cluster.run(remove)
        seen = steps.steps
        assert tray.get(one.remote()) == 1
        assert steps.steps == seen  # removed: no more calls
        # A dict's own `in` (C), and the change tracker (validate_every_steps)
        # is in it.
        runner = cluster._ticker._runner
        assert isinstance(runner.instruments, dict)
        assert "before_task_step" in runner.instruments
        assert [type(i).__name__ for i in runner.instruments["_all"]] == ["_ChangeTracker"]
        # With the tracker alone on the hook, its steps skip trio's generic call.
        generic: list = []
        generic_call = runner.instruments._call_each
        runner.instruments._call_each = lambda hook, *args: (
            generic.append(hook), generic_call(hook, *args))
        assert tray.get(one.remote()) == 1
        assert "before_task_step" not in generic
    finally:
        tray.shutdown()
