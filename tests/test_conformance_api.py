"""Core API names Ray programs use (Ray's tests: test_basic*.py, test_actor*.py):
``f._remote(args=, kwargs=, **options)`` and ``ActorClass._remote(...)``;
``@tray.remote(max_calls=N)``; ``tray.ObjectID``; ``tray.init()``'s context
object; ``tray.job_config.JobConfig``."""

from __future__ import annotations

import os
import time

import psutil
import pytest

import tray
from tray.job_config import JobConfig


@tray.remote
def combine(a, b=0, *, scale=1):
    return (a + b) * scale


@tray.remote
def pair(x):
    return x, -x


@tray.remote
class Box:
    def __init__(self, start=0):
        self.value = start

    def add(self, amount=1):
        self.value += amount
        return self.value


# ================================================================= _remote


def test_function_underscore_remote(one_node):
    assert tray.get(combine._remote(args=[1, 2], kwargs={"scale": 3})) == 9
    assert tray.get(combine._remote(args=(4,))) == 4
    assert tray.get(combine._remote(kwargs={"a": 5})) == 5
    # Options as keywords, as .options() takes them.
    plus, minus = pair._remote(args=[7], num_returns=2, num_cpus=0.5)
    assert tray.get([plus, minus]) == [7, -7]
    with pytest.raises(TypeError):
        combine._remote(args=[1, 2, 3])  # the signature is checked as by .remote()
    with pytest.raises(ValueError, match="bogus"):
        combine._remote(args=[1], bogus=1)


def test_actor_class_and_method_underscore_remote(one_node):
    box = Box._remote(args=[3], name="underscore-box")
    assert tray.get(box.add._remote(args=[2])) == 5
    assert tray.get(tray.get_actor("underscore-box").add._remote(kwargs={"amount": 1})) == 6
    with pytest.raises(TypeError):
        Box._remote(args=[1, 2])


# ================================================================ max_calls


@tray.remote(max_calls=1)
def one_call_per_worker():
    return os.getpid(), tray.get_runtime_context().get_worker_id()


@tray.remote(max_calls=2)
def two_calls_per_worker():
    return tray.get_runtime_context().get_worker_id()


def test_max_calls_one_gives_each_call_a_fresh_worker(one_node):
    seen = [tray.get(one_call_per_worker.remote()) for _ in range(3)]
    workers = [worker for _, worker in seen]
    assert len(set(workers)) == 3, workers
    if not one_node.is_sim:
        # The worker process exits after its call (resources released).
        first_pid = seen[0][0]
        deadline = time.monotonic() + 30
        while psutil.pid_exists(first_pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not psutil.pid_exists(first_pid)


@pytest.mark.cluster(num_cpus=1)  # one worker at a time: each runs its two calls
def test_max_calls_two_runs_two_calls_per_worker(one_node):
    workers = [tray.get(two_calls_per_worker.remote()) for _ in range(4)]
    assert workers[0] == workers[1] and workers[2] == workers[3], workers
    assert workers[1] != workers[2], workers


def test_max_calls_releases_the_workers_resources():
    tray.init(backend="sim", num_cpus=2)
    for _ in range(5):
        tray.get(one_call_per_worker.remote())
    time.sleep(5)  # virtual: the last worker's exit is noticed
    assert tray.available_resources().get("CPU") == 2


def test_max_calls_under_a_queue_of_tasks(one_node):
    # Many queued calls of a max_calls function all complete (a call that
    # reached a retiring worker is retried on a fresh one).
    refs = [one_call_per_worker.remote() for _ in range(6)]
    workers = [worker for _, worker in tray.get(refs, timeout=120 * one_node.tick_s)]
    assert len(set(workers)) == 6


def test_max_calls_worker_takes_no_task_after_its_last(one_node):
    # Regression (CI): the owner reused the lease of a worker that was
    # exiting after its max_calls-th call, so queued tasks reached it, died
    # with it and spent their retries. Its reply now says it is exiting, and
    # the lease goes back: with no retries at all, every task still runs.
    calls = one_call_per_worker.options(max_retries=0)
    refs = [calls.remote() for _ in range(8)]
    workers = [worker for _, worker in tray.get(refs, timeout=120 * one_node.tick_s)]
    assert len(set(workers)) == 8


def test_max_calls_options():
    with pytest.raises(ValueError, match="max_calls"):
        one_call_per_worker.options(max_calls=3)  # as Ray: only in @remote
    with pytest.raises(ValueError, match="max_calls"):
        tray.remote(max_calls=1)(Box._cls)  # actors have no max_calls
    with pytest.raises(TypeError, match="max_calls"):
        tray.remote(max_calls=1.5)(lambda: 1)
    with pytest.raises(ValueError, match="max_calls"):
        tray.remote(max_calls=-1)(lambda: 1)
    # Other options keep the limit.
    assert one_call_per_worker.options(num_cpus=0.5)._options["max_calls"] == 1


# ============================================================== ObjectID


def test_object_id_is_object_ref(one_node):
    assert tray.ObjectID is tray.ObjectRef
    assert isinstance(tray.put(1), tray.ObjectID)


# ========================================================= init's context


def test_init_returns_a_context(backend):
    context = tray.init(backend=backend, num_cpus=1)
    assert isinstance(context, tray.TrayContext)
    assert context["address"] == context.address_info["address"]
    assert context.address_info["gcs_address"] == context["address"]
    assert context.address_info["node_id"] == tray.get_runtime_context().get_node_id()
    assert context["backend"] == backend  # tray's own keys still read as before
    assert context.dashboard_url == context.address_info.get("webui_url")  # None in the sim
    assert "address" in context and len(context) == len(context.address_info)
    again = tray.init(backend=backend, ignore_reinit_error=True)
    assert again.address_info == context.address_info


def test_init_context_manager_shuts_down(backend):
    with tray.init(backend=backend, num_cpus=1) as context:
        assert tray.is_initialized()
        assert tray.get(tray.put("inside")) == "inside"
        assert context.address_info["address"]
    assert not tray.is_initialized()


def test_sim_context_keeps_its_keys():
    context = tray.init(backend="sim", seed=5, num_nodes=2)
    assert (context["seed"], context["num_nodes"]) == (5, 2)


# ============================================================ JobConfig


@tray.remote
def my_namespace():
    return tray.get_runtime_context().namespace


def test_job_config_namespace():
    tray.init(backend="sim", job_config=JobConfig(ray_namespace="from-config",
                                                  metadata={"team": "a"}))
    assert tray.get_runtime_context().namespace == "from-config"
    assert tray.get(my_namespace.remote()) == "from-config"
    box = Box.options(name="in-config").remote()  # noqa: F841 - alive while held
    assert tray.get(tray.get_actor("in-config").add.remote()) == 1
    with pytest.raises(ValueError):
        tray.get_actor("in-config", namespace="elsewhere")


def test_init_namespace_wins_over_job_config():
    tray.init(backend="sim", namespace="explicit",
              job_config=JobConfig(ray_namespace="from-config"))
    assert tray.get_runtime_context().namespace == "explicit"


def test_job_config_setters_and_json():
    config = JobConfig()
    config.set_metadata("owner", "me")
    config.set_ray_namespace("ns")
    config.set_default_actor_lifetime("non_detached")
    assert (config.metadata, config.ray_namespace) == ({"owner": "me"}, "ns")
    loaded = JobConfig.from_json({"ray_namespace": "json-ns", "metadata": {"k": "v"}})
    assert (loaded.ray_namespace, loaded.metadata) == ("json-ns", {"k": "v"})
    with pytest.raises(ValueError, match="lifetime"):
        config.set_default_actor_lifetime("forever")
    with pytest.raises(TypeError):
        JobConfig(code_search_path="not-a-list")


@pytest.mark.parametrize("config,named", [
    (JobConfig(jvm_options=["-Xmx1g"]), "jvm_options"),
    (JobConfig(code_search_path=["/opt/code"]), "code_search_path"),
    (JobConfig(default_actor_lifetime="detached"), "default_actor_lifetime"),
], ids=["jvm_options", "code_search_path", "detached"])
def test_job_config_fields_tray_does_not_support_are_refused(config, named):
    with pytest.raises(NotImplementedError, match=named):
        tray.init(backend="sim", job_config=config)
    assert not tray.is_initialized()


def test_job_config_of_the_wrong_type():
    with pytest.raises(TypeError, match="JobConfig"):
        tray.init(backend="sim", job_config={"ray_namespace": "x"})
    assert not tray.is_initialized()
