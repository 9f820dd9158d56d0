"""Test your own tray program on a simulated cluster, over many seeds.

Enable the plugin (in ``conftest.py``: ``pytest_plugins = ["tray.simtest.pytest_plugin"]``)
and mark a test::

    @pytest.mark.simtest(seeds=20, num_nodes=3, num_cpus=2)
    def test_survives_a_node_crash(sim):
        sim.at(0.05, lambda: sim.kill_node(sim.node_ids()[1], restart_after_s=1.0))
        ...  # the test body: plain tray code

The test runs once per seed (``seeds=20`` means seeds 0..19, or give a list
or range), each time on a fresh simulated cluster started with
``tray.init(backend="sim", seed=seed, ...)``; the ``sim`` fixture is the
running cluster (``tray.simtest.cluster()``: the fault API, ``advance``,
``at``, ``spawn``) with ``sim.seed`` set. ``faults="default"`` (or any
profile of ``tray simtest``) also injects that profile's seeded faults
while the body runs. When a seed fails, the report names the seed, the
fault schedule, the trace digest and the command that reruns just that
seed: ``pytest 'path::test[seed7]'``.

``simtest_cluster(seed, ...)`` is the same as a context manager, for tests
that loop over seeds themselves.
"""

from __future__ import annotations

import contextlib
import random

import pytest

import tray

from . import cluster as current_cluster
from . import faults as faults_module

DEFAULT_SEEDS = 10


def _seeds(value) -> list[int]:
    if isinstance(value, int):
        return list(range(value))
    return list(value)


@contextlib.contextmanager
def simtest_cluster(seed: int, *, faults: str = "none", num_nodes: int = 3, num_cpus=2,
                    **init_kwargs):
    """A simulated cluster for one seed, with ``faults`` (a profile name)
    injected from the seed; yields the cluster (``tray.simtest.cluster()``)."""
    if tray.is_initialized():
        tray.shutdown()
    tray.init(backend="sim", seed=seed, num_nodes=num_nodes, num_cpus=num_cpus, **init_kwargs)
    sim = current_cluster()
    sim.seed = seed
    schedule = faults_module.plan(seed, faults, faults_module.available_kinds(sim), num_nodes)
    injector = faults_module.Injector(sim, seed, schedule)
    sim.simtest_injector = injector
    injector.start()
    try:
        yield sim
    finally:
        if tray.is_initialized():
            tray.shutdown()


def pytest_configure(config) -> None:
    config.addinivalue_line(
        "markers", "simtest(seeds=10, faults='none', **init_kwargs): run the test on a "
                   "simulated tray cluster once per seed (fixture: sim)")


def pytest_generate_tests(metafunc) -> None:
    marker = metafunc.definition.get_closest_marker("simtest")
    if marker is None or "sim" not in metafunc.fixturenames:
        return
    seeds = _seeds(marker.kwargs.get("seeds", DEFAULT_SEEDS))
    if "_simtest_seed" not in metafunc.fixturenames:
        metafunc.fixturenames.append("_simtest_seed")
    metafunc.parametrize("_simtest_seed", seeds, ids=[f"seed{s}" for s in seeds])


@pytest.fixture
def sim(request):
    """The running simulated cluster for this seed (see the module doc)."""
    marker = request.node.get_closest_marker("simtest")
    kwargs = dict(marker.kwargs) if marker is not None else {}
    kwargs.pop("seeds", None)
    callspec = getattr(request.node, "callspec", None)
    seed = callspec.params["_simtest_seed"] if callspec is not None and \
        "_simtest_seed" in callspec.params else \
        random.Random(request.node.nodeid).randrange(2**16)
    with simtest_cluster(seed, **kwargs) as cluster:
        request.node._simtest = cluster
        yield cluster
        request.node._simtest_digest = cluster.digest()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    cluster = getattr(item, "_simtest", None)
    if cluster is None or not report.failed:
        return
    injector = getattr(cluster, "simtest_injector", None)
    schedule = "; ".join(injector.applied) if injector is not None and injector.applied \
        else "(no injected faults)"
    report.sections.append((
        "tray simtest",
        f"seed {cluster.seed} failed; fault schedule: {schedule}\n"
        f"trace digest so far: {cluster.digest()}\n"
        f"rerun this seed: pytest '{item.nodeid}'"))
