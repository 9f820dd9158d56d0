"""The object fast paths keep Ray's semantics: ``wait`` without a task per
ref (one callback per owned ref that is not ready), and the cross-node pull
that writes chunks straight into the destination's store entry."""

from __future__ import annotations

import time

import numpy as np
import pytest
import trio

import tray
import tray.simtest
from tray.core.worker.object_getter import ReadyEvent


@tray.remote
def sleepy(seconds: float, value):
    import time

    time.sleep(seconds)
    return value


def _pending_callbacks() -> int:
    """Callbacks still parked on the driver's not-ready entries."""
    from tray.core.context import get_worker

    return sum(len(entry.event._callbacks) for entry in get_worker().references.refs.values()
               if isinstance(entry.event, ReadyEvent))


def test_ready_event_runs_callbacks_in_order_once():
    order = []

    async def main():
        event = ReadyEvent()
        event.add_callback(lambda: order.append("a"))
        gone = event.add_callback(lambda: order.append("gone"))
        event.add_callback(lambda: order.append("b"))
        event.remove_callback(gone)
        event.remove_callback(gone)  # twice is harmless
        async with trio.open_nursery() as nursery:
            nursery.start_soon(event.wait)
            await trio.sleep(0)
            event.set()
        assert event.is_set()
        event.set()  # a second set runs nothing again

    trio.run(main)
    assert order == ["a", "b"]


def test_wait_loop_over_a_shrinking_list_returns_each_ref_once(one_node):
    """Ray's pattern: one wait per result over the refs not returned yet."""
    refs = [sleepy.remote(0.01 * (i % 7), i) for i in range(60)]
    not_ready, seen = refs, []
    while not_ready:
        ready, not_ready = tray.wait(not_ready, timeout=60)
        assert len(ready) == 1
        seen.extend(ready)
    assert sorted(tray.get(seen)) == list(range(60))
    assert len(set(seen)) == 60
    assert _pending_callbacks() == 0


def test_wait_num_returns_mixes_ready_and_pending_refs(one_node):
    done = [tray.put(i) for i in range(3)]
    later = [sleepy.remote(0.2, i) for i in range(3)]
    ready, rest = tray.wait(later + done, num_returns=5, timeout=60)
    assert len(ready) == 5 and len(rest) == 1
    assert set(done) <= set(ready)
    # The ready ones keep their order in the input list.
    order = later + done
    assert ready == [ref for ref in order if ref in set(ready)]
    assert _pending_callbacks() == 0


def test_wait_timeout_takes_its_callbacks_back(one_node):
    slow = [sleepy.remote(30, i) for i in range(5)]
    ready, rest = tray.wait(slow, num_returns=5, timeout=0.2)
    assert ready == [] and rest == slow
    assert _pending_callbacks() == 0  # nothing left parked on the entries
    tray.cancel(slow[0], force=True)


def test_wait_and_get_share_an_entry_event(one_node):
    """A get and a wait on the same pending ref both wake when it is ready."""
    ref = sleepy.remote(0.2, "x")
    ready, _ = tray.wait([ref], timeout=0)
    assert ready == []
    ready, _ = tray.wait([ref], timeout=60)
    assert ready == [ref]
    assert tray.get(ref) == "x"


@pytest.mark.cluster(num_nodes=2)
def test_wait_fetch_local_pulls_an_object_made_on_another_node(one_node):
    from tray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    here = tray.get_runtime_context().get_node_id()
    other = [node["NodeID"] for node in tray.nodes() if node["NodeID"] != here][0]

    @tray.remote(scheduling_strategy=NodeAffinitySchedulingStrategy(other, soft=False))
    def make():
        return np.arange(300_000, dtype=np.int64)  # big: stored, not inline

    ref = make.remote()
    ready, _ = tray.wait([ref], fetch_local=True, timeout=60)
    assert ready == [ref]
    assert int(tray.get(ref).sum()) == 300_000 * 299_999 // 2


# ------------------------------------------------------------ cross-node pulls

def test_packed_slices_reassemble_the_packed_form():
    """Chunks served as views, in any chunk size, join into the packed form
    that ``unpack_object`` reads back (boundaries inside the header, the
    pickle and between buffers)."""
    from tray.core.node.object_manager import (
        packed_parts,
        packed_slice,
        packed_slice_views,
        unpack_object,
    )

    data = b"pickle-stream" * 5
    buffers = [np.arange(1000, dtype=np.int64).tobytes(), b"", bytearray(b"xyz" * 333)]
    whole = b"".join(packed_parts(data, buffers))
    for chunk in (1, 7, 64, 4096, len(whole)):
        pieces = []
        for offset in range(0, len(whole), chunk):
            total, views = packed_slice_views(data, buffers, offset, chunk)
            assert total == len(whole)
            pieces.append(b"".join(views))
            assert packed_slice(data, buffers, offset, chunk) == (total, pieces[-1])
        assert b"".join(pieces) == whole
    got_data, got_buffers = unpack_object(bytearray(whole))
    assert got_data == data
    assert [bytes(b) for b in got_buffers] == [bytes(b) for b in buffers]


def _pull_program(seed: int) -> tuple[int, str]:
    import dataclasses

    from tray.core.config import DEFAULT_CONFIG
    from tray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    # Small chunks: a pull of ~1 MB has several chunks in flight at once.
    config = dataclasses.replace(DEFAULT_CONFIG, object_chunk_bytes=64 * 1024)
    tray.init(backend="sim", seed=seed, num_nodes=2, num_cpus=2, config=config)
    try:
        here = tray.get_runtime_context().get_node_id()
        other = [n["NodeID"] for n in tray.nodes() if n["NodeID"] != here][0]

        @tray.remote(scheduling_strategy=NodeAffinitySchedulingStrategy(other, soft=False))
        def make():
            # Several buffers: chunk boundaries fall inside and between them.
            return {"a": np.arange(100_000, dtype=np.int64),
                    "b": np.ones(30_001, dtype=np.float32), "c": b"z" * 70_000}

        value = tray.get(make.remote())
        checksum = int(value["a"].sum()) + int(value["b"].sum()) + len(value["c"])
    finally:
        tray.shutdown()
    return checksum, tray.simtest.trace_digest()


def test_pipelined_pull_in_the_simulator_is_exact_and_replays():
    first = _pull_program(3)
    assert first[0] == 100_000 * 99_999 // 2 + 30_001 + 70_000
    assert _pull_program(3) == first


@pytest.mark.cluster(num_nodes=2)
def test_pull_of_a_multi_chunk_object_between_real_nodes(one_node):
    """20 MB (five 4 MiB chunks, four in flight) made on the other node."""
    from tray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    here = tray.get_runtime_context().get_node_id()
    other = [node["NodeID"] for node in tray.nodes() if node["NodeID"] != here][0]

    @tray.remote(scheduling_strategy=NodeAffinitySchedulingStrategy(other, soft=False))
    def make():
        return [tray.put(np.arange(2_500_000, dtype=np.int64))]

    [inner] = tray.get(make.remote())
    array = tray.get(inner)
    assert array.shape == (2_500_000,)
    assert int(array[::1000].sum()) == sum(range(0, 2_500_000, 1000))
    assert int(array.sum()) == 2_500_000 * 2_499_999 // 2


def _wait_program(seed: int) -> tuple[list, str]:
    tray.init(backend="sim", seed=seed, num_nodes=2, num_cpus=2)
    try:
        refs = [sleepy.remote(0.001 * (i * 7 % 11), i) for i in range(30)]
        order, not_ready = [], refs
        while not_ready:
            ready, not_ready = tray.wait(not_ready, num_returns=min(2, len(not_ready)))
            order.extend(tray.get(ready))
    finally:
        tray.shutdown()
    return order, tray.simtest.trace_digest()


def test_wait_loop_in_the_simulator_replays():
    """Callbacks fire in registration order: the same seed gives the same
    completion order and the same trace."""
    first = _wait_program(5)
    assert sorted(first[0]) == list(range(30))
    assert _wait_program(5) == first


def test_wait_ready_now_answers_only_when_enough_are_ready(one_node):
    """The loop-free answer: the first ready refs in list order, or None."""
    from tray.core.context import get_worker

    getter = get_worker().getter
    pending = sleepy.remote(30, "late")
    done = [tray.put(i) for i in range(3)]
    refs = [done[0], pending, done[1], done[2]]
    # A put from the driver's thread is stored by the loop, later (the thread
    # inbox): until then its entry does not exist and the loop-free answer is
    # None, which sends wait() to the loop, where it sees every put before it.
    assert tray.wait(done, num_returns=3, timeout=0)[0] == done
    assert getter.wait_ready_now(refs, 2, True) == ([done[0], done[1]], [pending, done[2]])
    assert getter.wait_ready_now(refs, 4, True) is None
    # wait() itself gives the same answer.
    assert tray.wait(refs, num_returns=3, timeout=0) == ([done[0], done[1], done[2]], [pending])
    tray.cancel(pending, force=True)


def test_wait_right_after_put_sees_the_put(cluster):
    """Regression (CI, 2026-11-23): the driver's small put is queued for the
    loop; wait and get right after it must still find the object ready."""
    for i in range(50):
        ref = tray.put(i)
        assert tray.wait([ref], num_returns=1, timeout=0) == ([ref], [])
        assert tray.get(ref, timeout=0) == i


# ------------------------------------------------------------ get of many refs

@tray.remote
def fails(message):
    raise ValueError(message)


def _get_or_say(refs):
    try:
        return tray.get(refs)
    except ValueError as error:
        return f"raised {str(error).splitlines()[-1]}"  # (the task's traceback above it)


@tray.remote
def gets_all(refs_box):
    """Get a list in a task: the worker's loop path (ObjectGetter._get)."""
    return _get_or_say(refs_box[0])


@tray.remote
def fails_then_gets_in_list_order():
    """In a task, of refs the task owns (so both errors are known before the
    get): the worker's loop path must pick the first failed in list order."""
    late = fails.options(max_retries=0).remote("late but first")
    early = fails.options(max_retries=0).remote("early")
    for ref in (early, late):
        try:
            tray.get(ref)
        except ValueError:
            pass
    return _get_or_say([tray.put(0), late, sleepy.remote(0.05, 1), early])


def test_get_of_owned_inline_results_takes_no_fetch_per_ref(monkeypatch):
    """Results this process owns, small enough to be inline, are read from
    their entries (at once, or by a callback when made ready): only the
    stored value and the borrowed ref go through ``fetch``."""
    from tray.core.worker.object_getter import ObjectGetter

    tray.init(backend="sim", seed=3, num_nodes=1, num_cpus=2)
    try:
        fetched: list = []
        original = ObjectGetter.fetch

        async def counting(self, object_id, owner):
            fetched.append(object_id)
            return await original(self, object_id, owner)

        @tray.remote
        def big():
            return np.arange(100_000, dtype=np.int64)  # stored, not inline

        @tray.remote
        def inner():
            return [tray.put("borrowed")]

        [borrowed] = tray.get(inner.remote())
        done = tray.put("done")
        refs = [sleepy.remote(0.01 * (i % 3), i) for i in range(40)]
        stored = big.remote()
        monkeypatch.setattr(ObjectGetter, "fetch", counting)
        values = tray.get([done, *refs, stored, borrowed])
        assert values[0] == "done" and values[1:41] == list(range(40))
        assert int(values[41].sum()) == 100_000 * 99_999 // 2 and values[42] == "borrowed"
        assert sorted(fetched) == sorted([stored.object_id(), borrowed.object_id()])
        assert _pending_callbacks() == 0
    finally:
        tray.shutdown()


def test_get_of_many_raises_the_first_failed_in_list_order(one_node):
    """In the driver and in a task: once several have failed, the first in
    list order is what ``get`` raises, whatever order they failed in."""
    late = fails.options(max_retries=0).remote("late but first")
    early = fails.options(max_retries=0).remote("early")
    for ref in (early, late):
        with pytest.raises(ValueError):
            tray.get(ref)
    refs = [tray.put(0), late, sleepy.remote(0.05, 1), early]
    with pytest.raises(ValueError, match="late but first"):
        tray.get(refs)
    # (Not gets_all.remote([refs]): there both refs are borrowed and fetched
    # at once, and whichever error arrives first fails the get; CI, 2026-11-28.)
    assert tray.get(fails_then_gets_in_list_order.remote()) == "raised ValueError: late but first"
    # One failing while the others are pending fails the get at once.
    slow = sleepy.remote(30, "slow")
    started = time.monotonic()
    assert tray.get(gets_all.remote([[slow, fails.options(max_retries=0).remote("now")]])) \
        == "raised ValueError: now"
    assert time.monotonic() - started < 25  # a bound on a hang, not a speed goal
    tray.cancel(slow, force=True)
