"""What libraries ask the simulator through tray's public API: whether they
run simulated (``tray.simtest.is_simulated``) and a random generator that a
seed replays (``tray.simtest.rng``), on both backends."""

from __future__ import annotations

import random

import tray
import tray.simtest


@tray.remote
def inside_a_task():
    return tray.simtest.is_simulated(), tray.simtest.rng("lib:draw").random()


def test_is_simulated_on_each_backend(one_node):
    expected = one_node.backend == "sim"
    assert tray.simtest.is_simulated() is expected
    simulated, _ = tray.get(inside_a_task.remote())
    assert simulated is expected


def test_no_cluster_is_not_simulated():
    assert not tray.is_initialized()
    assert tray.simtest.is_simulated() is False
    assert isinstance(tray.simtest.rng("x"), random.Random)


def test_rng_replays_from_the_seed_and_differs_by_name():
    draws = []
    for seed in (7, 7, 8):
        tray.init(backend="sim", seed=seed, num_cpus=1)
        try:
            here = tray.simtest.rng("lib:draw").random()
            other = tray.simtest.rng("lib:other").random()
            _, in_task = tray.get(inside_a_task.remote())
        finally:
            tray.shutdown()
        assert here != other
        assert in_task == here  # the same name draws the same numbers anywhere in the run
        draws.append(here)
    assert draws[0] == draws[1] == random.Random("7:lib:draw").random()
    assert draws[2] != draws[0]
