"""Canary: the private trio hooks tray relies on still exist and
still make runs repeatable (ARCHITECTURE.md, "Determinism"). Every private
name tray touches is listed in ``tray._trio_private.PRIVATE_NAMES``."""

import importlib

import pytest
import trio

import tray
import tray.simtest
from tray import _trio_private


def _resolve(dotted: str):
    """The object at ``dotted``: its longest importable module prefix, then
    attributes."""
    parts = dotted.split(".")
    for split in range(len(parts), 0, -1):
        try:
            found = importlib.import_module(".".join(parts[:split]))
        except ImportError:
            continue
        for attribute in parts[split:]:
            found = getattr(found, attribute)
        return found
    raise ImportError(dotted)


@pytest.mark.parametrize("dotted", _trio_private.PRIVATE_NAMES)
def test_each_private_trio_name_tray_uses_still_exists(dotted):
    assert dotted.startswith("trio."), dotted
    _resolve(dotted)


def test_the_walk_fails_on_a_name_trio_lacks():
    with pytest.raises(AttributeError):
        _resolve("trio._core._run.GuestState.no_such_field")


def test_deterministic_scheduling_rng_still_seeds_and_shuffles():
    rng = _resolve("trio._core._run._r")
    assert hasattr(rng, "seed") and hasattr(rng, "shuffle")


def _scheduling_order(seed: int) -> list[int]:
    order: list[int] = []

    async def child(i: int) -> None:
        await trio.sleep(0)
        order.append(i)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            for i in range(20):
                nursery.start_soon(child, i)

    saved = _trio_private.scheduling_state()
    _trio_private.schedule_deterministically(seed)
    try:
        trio.run(main)
    finally:
        _trio_private.restore_scheduling(saved)
    return order


def test_seeded_scheduling_is_repeatable_and_seed_dependent():
    assert _scheduling_order(1) == _scheduling_order(1)
    assert _scheduling_order(1) != _scheduling_order(2)


def test_driver_calls_do_not_wait_for_the_next_heartbeat():
    # Regression: in guest mode a call queued by the driver was seen only
    # after the clock jumped to the next deadline (0.5 s of virtual time).
    tray.init(backend="sim", seed=0)
    try:
        @tray.remote
        def now():
            import time
            return time.time()

        start = tray.simtest.cluster().clock.current_time()
        tray.get(now.remote())
        assert tray.simtest.cluster().clock.current_time() - start < 0.1
    finally:
        tray.shutdown()
