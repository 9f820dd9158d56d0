"""Every message a service answers is in its facade's handler table.

The core worker, the node manager and the GCS each list the messages they
answer, by component, when they are built (``rpc.add_handlers``): message
``<name>`` goes to a component's ``handle_<name>``. A ``handle_*`` method
that no table lists is never called, so these tests report one, and one
listed under another name."""

from __future__ import annotations

import pytest

import tray
from tray.core.gcs.gcs_server import GcsServer
from tray.core.node.node_manager import NodeManager
from tray.core.node.worker_pool import WorkerPool
from tray.core.rpc import add_handlers
from tray.core.worker.core_worker import CoreWorker
from tray.simtest import cluster as current_cluster

FACADES = (CoreWorker, NodeManager, GcsServer)


@tray.remote
def one() -> int:
    return 1


def _handler_methods(component) -> list[str]:
    return [name for name in dir(type(component)) if name.startswith("handle_")]


def table_problems(facade) -> list[str]:
    """What is wrong with a built facade's handler table: a ``handle_*``
    method of the facade or of one of its components (its attributes that
    have any) that is not served under its name, and an entry that does
    not name its handler."""
    served = facade.endpoint.handlers
    problems = [f"message {name!r} is answered by {handler.__qualname__}"
                for name, handler in sorted(served.items())
                if handler.__name__ != f"handle_{name}"]
    components = [facade] + [value for value in vars(facade).values()
                             if value is not facade and _handler_methods(value)]
    for component in components:
        for attribute in _handler_methods(component):
            name = attribute[len("handle_"):]
            if served.get(name) != getattr(component, attribute):
                problems.append(f"{type(component).__name__}.{attribute} is not in "
                                f"{type(facade).__name__}'s handler table as {name!r}")
    return problems


def _facades() -> list:
    """The core workers, node managers and GCS of a running simulated cluster."""
    processes = current_cluster().processes
    return [process.component for _, process in sorted(processes.items())
            if isinstance(process.component, FACADES)]


@pytest.fixture
def sim():
    tray.init(backend="sim", seed=1, num_cpus=1)
    try:
        assert tray.get(one.remote()) == 1  # a worker process, too
        yield
    finally:
        tray.shutdown()


def test_every_handler_of_every_component_is_in_its_service_table(sim):
    facades = _facades()
    assert {type(facade) for facade in facades} == set(FACADES)
    assert sum(isinstance(facade, CoreWorker) for facade in facades) >= 2  # driver, worker
    for facade in facades:
        assert table_problems(facade) == [], type(facade).__name__


def test_a_handler_missing_from_its_table_is_reported(sim, monkeypatch):
    def handle_planted(self, conn) -> None:
        return None

    monkeypatch.setattr(WorkerPool, "handle_planted", handle_planted, raising=False)
    node_manager = next(facade for facade in _facades() if isinstance(facade, NodeManager))
    assert table_problems(node_manager) == [
        "WorkerPool.handle_planted is not in NodeManager's handler table as 'planted'"]


def test_a_handler_listed_under_another_name_is_reported(sim):
    gcs = next(facade for facade in _facades() if isinstance(facade, GcsServer))
    handlers = gcs.endpoint.handlers
    handlers["get_views"] = handlers.pop("get_view")
    problems = table_problems(gcs)
    handlers["get_view"] = handlers.pop("get_views")
    assert problems == [
        "message 'get_views' is answered by NodeTable.handle_get_view",
        "NodeTable.handle_get_view is not in GcsServer's handler table as 'get_view'"]


def test_a_name_served_twice_is_an_error_when_the_service_is_built():
    handlers: dict = {}
    add_handlers(handlers, {"ping": print})
    with pytest.raises(AssertionError, match="two handlers for 'ping'"):
        add_handlers(handlers, {"pong": repr}, {"ping": repr})
