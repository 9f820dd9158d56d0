"""Canary: the private trio hooks the simulator relies on still exist and
still make runs repeatable (ARCHITECTURE.md, "Determinism")."""

import trio
import trio._core._run as trio_run

import tray
import tray.simtest
from tray.backends.sim.cluster import _GuestTicks  # noqa: F401  (must import)


def test_deterministic_scheduling_hooks_exist():
    assert hasattr(trio_run, "_ALLOW_DETERMINISTIC_SCHEDULING")
    assert hasattr(trio_run, "_r")
    assert hasattr(trio_run._r, "seed") and hasattr(trio_run._r, "shuffle")


def test_guest_state_has_the_fields_the_simulator_drives_its_ticks_with():
    # _GuestTicks sends the run generator its I/O events itself.
    for field in ("runner", "unrolled_run_gen", "unrolled_run_next_send"):
        assert field in trio_run.GuestState.__annotations__, field


def _scheduling_order(seed: int) -> list[int]:
    order: list[int] = []

    async def child(i: int) -> None:
        await trio.sleep(0)
        order.append(i)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            for i in range(20):
                nursery.start_soon(child, i)

    saved = trio_run._ALLOW_DETERMINISTIC_SCHEDULING, trio_run._r.getstate()
    trio_run._ALLOW_DETERMINISTIC_SCHEDULING = True
    trio_run._r.seed(seed)
    try:
        trio.run(main)
    finally:
        trio_run._ALLOW_DETERMINISTIC_SCHEDULING = saved[0]
        trio_run._r.setstate(saved[1])
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
