"""Shared fixtures: a tray cluster per test, parametrized over backends and node counts.

Every integration test runs through the public API against each backend in
``BACKENDS``; the local backend joins by appending to that list, without any
test being rewritten.

Fixtures:

* ``backend``     -- the backend name, for tests that call ``tray.init`` themselves.
* ``cluster``     -- a started cluster, parametrized over backend x {1, 3} nodes
                     (ids ``sim-1node`` / ``sim-3nodes``).
* ``one_node``    -- a started single-node cluster, parametrized over backend only.
* ``three_nodes`` -- a started three-node cluster, parametrized over backend only.
* ``local_node``  -- a started single-node cluster of real processes, for what
                     only they have (threads, processes); skipped when the
                     local backend is not under test.

A test tunes ``tray.init`` through ``@pytest.mark.cluster(**kwargs)``; the
defaults are ``num_cpus=4`` and (sim only) ``seed=0``.
"""

from __future__ import annotations

import dataclasses
import os

import pytest

import tray

# TRAY_TEST_BACKENDS=sim (or local) narrows a run to one backend.
BACKENDS = [b for b in os.environ.get("TRAY_TEST_BACKENDS", "sim,local").split(",") if b]

DEFAULT_INIT_KWARGS = {"num_cpus": 4}

# The unit of "a short while" in tests that compare durations, in seconds.
# In the simulator time is virtual, so ticks are free and can be generous;
# real backends pay for each second of wall clock.
TICK_S = {"sim": 1.0, "local": 0.5}


@dataclasses.dataclass(frozen=True)
class Cluster:
    backend: str
    num_nodes: int
    init_kwargs: dict
    tick_s: float

    @property
    def is_sim(self) -> bool:
        return self.backend == "sim"


def _node_suffix(num_nodes: int) -> str:
    return "1node" if num_nodes == 1 else f"{num_nodes}nodes"


def _start(request, backend: str, num_nodes: int):
    kwargs = dict(DEFAULT_INIT_KWARGS)
    if backend == "sim":
        kwargs["seed"] = 0
    marker = request.node.get_closest_marker("cluster")
    if marker is not None:
        if marker.args:
            raise TypeError("@pytest.mark.cluster takes keyword arguments only")
        kwargs.update(marker.kwargs)
    kwargs.setdefault("num_nodes", num_nodes)
    num_nodes = kwargs.pop("num_nodes")
    tray.init(backend=backend, num_nodes=num_nodes, **kwargs)
    try:
        yield Cluster(
            backend=backend,
            num_nodes=num_nodes,
            init_kwargs=dict(kwargs, num_nodes=num_nodes),
            tick_s=TICK_S.get(backend, 0.5),
        )
    finally:
        tray.shutdown()


_CLUSTER_PARAMS = [(b, n) for b in BACKENDS for n in (1, 3)]


@pytest.fixture(params=BACKENDS)
def backend(request) -> str:
    return request.param


@pytest.fixture(
    params=_CLUSTER_PARAMS,
    ids=[f"{b}-{_node_suffix(n)}" for b, n in _CLUSTER_PARAMS],
)
def cluster(request):
    backend_name, num_nodes = request.param
    yield from _start(request, backend_name, num_nodes)


@pytest.fixture(params=BACKENDS, ids=[f"{b}-1node" for b in BACKENDS])
def one_node(request):
    yield from _start(request, request.param, 1)


@pytest.fixture(params=BACKENDS, ids=[f"{b}-3nodes" for b in BACKENDS])
def three_nodes(request):
    yield from _start(request, request.param, 3)


@pytest.fixture
def local_node(request):
    if "local" not in BACKENDS:
        pytest.skip("the local backend is not under test")
    yield from _start(request, "local", 1)


@pytest.fixture(autouse=True)
def _shutdown_leftover_cluster():
    """A test that calls tray.init itself (or fails half-way) must not leak
    its cluster into the next test."""
    yield
    if tray.is_initialized():
        tray.shutdown()
    from tray import _trio_private

    if _trio_private.has_run():
        # A trio run (a simulated cluster's) left behind: every later
        # simulated cluster in this process would fail to start ("run() from
        # inside a run()"). Blame this test, and let the next ones run.
        _trio_private.abandon_run()
        pytest.fail("the test left a trio run behind in this thread")
