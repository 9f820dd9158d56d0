"""Ownership and reference counting: objects are freed everywhere once no
reference remains, and not before (borrowers keep them alive)."""

import gc
import time

import numpy as np
import pytest

import tray
import tray.simtest

BIG = 200_000  # float64 elements: 1.6 MB, above the inline threshold


def _store_bytes() -> int:
    return sum(store.used_bytes() for store in tray.simtest.cluster().stores)


def _settle() -> None:
    gc.collect()
    time.sleep(0.5)  # the driver's sleep advances virtual time; frees are messages


def _driver_refs() -> int:
    from tray.core.context import driver

    return driver().statistics().references.objects


@tray.remote
def make_big():
    return np.ones(BIG)


@tray.remote
def total(arrays):
    return float(sum(tray.get(ref).sum() for ref in arrays))


@tray.remote
class Holder:
    def hold(self, refs):
        self.refs = refs
        return True

    def read(self):
        return float(tray.get(self.refs[0]).sum())

    def drop(self):
        self.refs = None
        return True


@pytest.mark.parametrize("num_nodes", [1, 3])
def test_put_object_freed_when_last_ref_dropped(num_nodes):
    tray.init(backend="sim", num_nodes=num_nodes, seed=1)
    try:
        ref = tray.put(np.ones(BIG))
        assert _store_bytes() >= BIG * 8
        del ref
        _settle()
        assert _store_bytes() == 0
        assert _driver_refs() == 0
    finally:
        tray.shutdown()


def test_task_result_freed_on_every_node_it_reached():
    tray.init(backend="sim", num_nodes=3, seed=2)
    try:
        refs = [make_big.options(scheduling_strategy="SPREAD").remote() for _ in range(3)]
        assert tray.get(total.remote(refs)) == 3.0 * BIG
        assert _store_bytes() >= 3 * BIG * 8
        del refs
        _settle()
        assert _store_bytes() == 0
    finally:
        tray.shutdown()


def test_borrower_keeps_object_alive_after_owner_drops_its_ref():
    tray.init(backend="sim", num_nodes=1, seed=3)
    try:
        holder = Holder.remote()
        ref = tray.put(np.ones(BIG))
        assert tray.get(holder.hold.remote([ref]))
        del ref
        _settle()
        assert _store_bytes() >= BIG * 8, "freed while the actor still borrows it"
        assert tray.get(holder.read.remote()) == float(BIG)
        assert tray.get(holder.drop.remote())
        _settle()
        assert _store_bytes() == 0
    finally:
        tray.shutdown()


def test_ref_inside_put_object_lives_as_long_as_the_outer():
    tray.init(backend="sim", num_nodes=1, seed=4)
    try:
        inner = tray.put(np.ones(BIG))
        outer = tray.put([inner])
        del inner
        _settle()
        assert _store_bytes() >= BIG * 8
        (inner_again,) = tray.get(outer)
        assert tray.get(inner_again).sum() == BIG
        del inner_again, outer
        _settle()
        assert _store_bytes() == 0
    finally:
        tray.shutdown()


# ====================================== a worker owner drops dead borrowers


@tray.remote
class _Owner:
    """An actor that owns an object and lends it out."""

    def lend(self):
        self.ref = tray.put(np.ones(BIG))
        return [self.ref]  # a ref inside a value: whoever reads it borrows it

    def drop(self):
        self.ref = None
        return True

    def owned_objects(self) -> int:
        from tray.core.context import get_worker

        return get_worker().statistics().references.owned


@tray.remote
class _Borrower:
    def hold(self, boxed):
        self.held = boxed[0]
        return True

    def crash(self):
        import os

        os._exit(1)


def _eventually(condition, timeout_s: float) -> bool:
    """Poll (virtual time in the simulator, wall time on real processes)."""
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return condition()


def test_a_worker_that_owns_an_object_drops_a_borrower_that_died(one_node):
    # Regression: on real processes the worker's own peer-closed callback
    # replaced the reference counter's, so a worker never dropped a dead
    # borrower and the object leaked (the simulator did drop it).
    owner = _Owner.remote()
    borrower = _Borrower.options(max_restarts=0).remote()
    boxed = owner.lend.remote()
    assert tray.get(borrower.hold.remote(boxed)) is True
    del boxed
    gc.collect()
    assert tray.get(owner.drop.remote()) is True
    assert tray.get(owner.owned_objects.remote()) == 1  # the borrower keeps it
    borrower.crash.remote()
    assert _eventually(lambda: tray.get(owner.owned_objects.remote()) == 0, timeout_s=20.0)
