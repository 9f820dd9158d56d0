"""Auto-init, as Ray: the first API call that needs a cluster starts the
default local one and logs one line saying so; ``TRAY_AUTO_INIT=0`` keeps
the explicit behaviour (``NotInitializedError``). As in Ray, ``nodes()``,
``cluster_resources()`` and ``available_resources()`` never start one
(Ray's NON_AUTO_INIT_APIS); tray also leaves ``get_runtime_context()`` out
(see README, "Differences from Ray")."""

from __future__ import annotations

import logging
import os

import pytest

import tray
import tray.exceptions as tex


@tray.remote
def add(a, b):
    return a + b


@pytest.fixture
def not_initialized(monkeypatch):
    if tray.is_initialized():
        tray.shutdown()
    monkeypatch.delenv("TRAY_AUTO_INIT", raising=False)
    yield
    if tray.is_initialized():
        tray.shutdown()


needs_local = pytest.mark.skipif(
    "local" not in os.environ.get("TRAY_TEST_BACKENDS", "sim,local"),
    reason="auto-init starts the local backend")


@needs_local
def test_first_call_starts_a_local_cluster_and_says_so(not_initialized, caplog):
    with caplog.at_level(logging.INFO, logger="tray"):
        ref = add.remote(1, 2)
    assert tray.is_initialized()
    started = [r for r in caplog.records if "started a local cluster" in r.getMessage()]
    assert len(started) == 1, [r.getMessage() for r in caplog.records]
    assert "TRAY_AUTO_INIT=0" in started[0].getMessage()
    assert tray.get(ref) == 3
    assert tray.get(tray.put("more")) == "more"  # no second cluster, no second line
    assert len([r for r in caplog.records if "started a local" in r.getMessage()]) == 1


@pytest.mark.parametrize("call", [
    lambda: tray.put(1),
    lambda: add.remote(1, 2),
    lambda: tray.get_actor("anything"),
    lambda: tray.wait([]),
], ids=["put", "task", "get_actor", "wait"])
def test_auto_init_off_raises_not_initialized(not_initialized, monkeypatch, call):
    monkeypatch.setenv("TRAY_AUTO_INIT", "0")
    with pytest.raises(tex.NotInitializedError, match="TRAY_AUTO_INIT=0") as caught:
        call()
    assert "tray.init()" in str(caught.value)
    assert not tray.is_initialized()


@pytest.mark.parametrize("call", [
    tray.nodes, tray.cluster_resources, tray.available_resources, tray.get_runtime_context,
], ids=["nodes", "cluster_resources", "available_resources", "get_runtime_context"])
def test_cluster_queries_never_start_one(not_initialized, call):
    with pytest.raises(tex.NotInitializedError, match="init"):
        call()
    assert not tray.is_initialized()


def test_a_misused_call_starts_nothing(not_initialized):
    with pytest.raises(TypeError):
        add.remote(1, 2, 3)  # checked before any cluster is needed
    assert not tray.is_initialized()
