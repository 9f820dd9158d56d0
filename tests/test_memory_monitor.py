"""The memory monitor (Ray's OOM prevention): above the memory usage
threshold a node kills the worker of the most recently started retriable
task (of the owner with the most tasks there); the owner retries it (if it
had other tasks there, on a budget of its own), or fails it with
OutOfMemoryError naming the task, the node and the memory numbers.

In the simulator memory is simulated (tasks allocate it through
``tray.simtest.cluster().allocate_memory``; a test sets a node's background
use); on the local backend a task allocates a real NumPy array while the
threshold sits just above the machine's use at the start of the test."""

from __future__ import annotations

import dataclasses
import os
import time

import psutil
import pytest

import tray
import tray.simtest
from tray import exceptions
from tray.core.config import DEFAULT_CONFIG
from tray.core.node.lease_manager import Lease
from tray.core.node.memory_monitor import choose_victim

GiB = 1024**3
MACHINE_BYTES = 16 * GiB  # a simulated machine's memory


@pytest.fixture
def sim_cluster():
    tray.init(backend="sim", seed=3, num_cpus=8,
              config=dataclasses.replace(DEFAULT_CONFIG, oom_retry_delay_base_s=0.5))
    try:
        yield tray.simtest.cluster()
    finally:
        tray.shutdown()


@tray.remote
class Attempts:
    """Counts the runs of each named task (a task's attempt number)."""

    def __init__(self):
        self.counts = {}

    def start(self, name):
        self.counts[name] = self.counts.get(name, 0) + 1
        return self.counts[name]

    def get(self):
        return dict(self.counts)


# ------------------------------------------------------------- the policy


def _lease(granted, owner="a", retriable=True, actor=None):
    """A lease granted ``granted``-th (its lease id is unrelated)."""
    return Lease(100 - granted, f"w{granted}", owner, {"CPU": 1.0}, [], for_actor=actor,
                 retriable=retriable, granted=granted)


def test_policy_prefers_retriable_tasks_then_tasks_then_actors():
    actor = _lease(9, actor="actor-1")
    plain = _lease(8, retriable=False)
    retriable = _lease(2)
    # The last task of its owner here is not retried (it would be killed again).
    assert choose_victim([retriable, plain, actor]) == (retriable, False)
    assert choose_victim([retriable, _lease(1), plain]) == (retriable, True)
    assert choose_victim([plain, actor]) == (plain, False)
    assert choose_victim([actor]) == (actor, False)
    assert choose_victim([]) is None
    # A lease without a worker yet holds no memory: it is never chosen.
    assert choose_victim([Lease(3, "", "a", {}, [])]) is None


def test_policy_kills_the_newest_task_of_the_largest_owner_group():
    leases = [_lease(1, "a"), _lease(2, "b"), _lease(3, "a"), _lease(4, "c"), _lease(5, "b"),
              _lease(6, "a")]
    assert choose_victim(leases)[0].granted == 6  # a has 3 tasks; its newest
    leases = [_lease(1, "a"), _lease(2, "b"), _lease(3, "b"), _lease(4, "a"), _lease(7, "c")]
    # a and b tie at 2: b's first lease is newer, so b's newest goes.
    assert choose_victim(leases)[0].granted == 3
    # Non-retriable tasks form one group whatever their owners.
    plain = [_lease(1, "a", retriable=False), _lease(5, "b", retriable=False)]
    assert choose_victim(plain)[0].granted == 5


# ---------------------------------------------------------- the simulator


@pytest.mark.parametrize("max_retries", [0, 3])
def test_sim_out_of_memory_error_names_task_node_and_numbers(sim_cluster, max_retries):
    """Not retriable, or its owner's only task on the node: not retried."""
    @tray.remote(max_retries=max_retries)
    def hog():
        tray.simtest.cluster().allocate_memory(MACHINE_BYTES)
        time.sleep(100)
        return "survived"

    with pytest.raises(exceptions.OutOfMemoryError) as caught:
        tray.get(hog.remote())
    message = str(caught.value)
    node_id = sim_cluster.node_ids()[0]
    assert "hog (" in message and node_id in message, message
    assert "16.00 GiB used of 16.00 GiB" in message and "threshold 0.95" in message, message
    assert ("max_retries=0" if max_retries == 0 else "last task of its owner") in message, \
        message
    assert "attempts=1" in message, message
    assert not isinstance(caught.value, exceptions.WorkerCrashedError)
    # The killed worker gave its memory back.
    assert sim_cluster.memory_usage(node_id).used_bytes == 0


@tray.remote
def _companion(seconds):
    """Another task of the same owner on the node, so a killed one is retried."""
    time.sleep(seconds)
    return "done"


def test_sim_killed_task_is_retried_apart_from_max_retries(sim_cluster):
    attempts = Attempts.remote()

    @tray.remote(max_retries=1)
    def first_attempts_hog(attempts, hogging_attempts):
        attempt = tray.get(attempts.start.remote("first"))
        if attempt <= hogging_attempts:
            tray.simtest.cluster().allocate_memory(MACHINE_BYTES)
            time.sleep(100)
        return attempt

    companion = _companion.remote(60)
    time.sleep(1)  # (virtual) the companion runs first: the hog is the newer lease
    # Killed 3 times: more than max_retries, which OOM kills do not spend.
    assert tray.get(first_attempts_hog.remote(attempts, 3)) == 4
    assert tray.get(companion) == "done"


def test_sim_fails_when_its_memory_retries_are_used_up():
    config = dataclasses.replace(DEFAULT_CONFIG, task_oom_retries=2, oom_retry_delay_base_s=0.5)
    tray.init(backend="sim", seed=5, num_cpus=4, config=config)
    try:
        attempts = Attempts.remote()

        @tray.remote(max_retries=5)
        def always_hogs(attempts):
            tray.get(attempts.start.remote("always"))
            tray.simtest.cluster().allocate_memory(MACHINE_BYTES)
            time.sleep(100)

        companion = _companion.remote(60)
        time.sleep(1)
        with pytest.raises(exceptions.OutOfMemoryError,
                           match=r"retries for memory are used up \(task_oom_retries=2\) "
                                 r"\(attempts=3\)"):
            tray.get(always_hogs.remote(attempts))
        assert tray.get(attempts.get.remote()) == {"always": 3}
        assert tray.get(companion) == "done"
    finally:
        tray.shutdown()


def test_sim_prefers_retriable_task_of_largest_owner_group(sim_cluster):
    """Three retriable tasks of the driver, one retriable task owned by a
    non-retriable task, and an actor: when the last of them allocates, the
    machine passes the threshold; the newest task of the driver's group is
    killed (and retried), nothing else."""
    node_id = sim_cluster.node_ids()[0]
    sim_cluster.set_memory_usage(node_id, 12 * GiB)  # 12 + 4 x 1 GiB > 0.95 x 16 GiB
    attempts = Attempts.remote()

    @tray.remote(max_retries=1)
    def worker_task(attempts, name, total):
        attempt = tray.get(attempts.start.remote(name))
        if attempt == 1:
            while len(tray.get(attempts.get.remote())) < total:
                time.sleep(0.1)
            tray.simtest.cluster().allocate_memory(GiB)
        time.sleep(3)
        return attempt

    @tray.remote(max_retries=0)
    def parent(attempts):
        return tray.get(worker_task.remote(attempts, "child", 4))

    parent_ref = parent.remote(attempts)
    refs = [worker_task.remote(attempts, f"x{i}", 4) for i in range(3)]
    results = tray.get(refs)
    assert tray.get(parent_ref) == 1  # the child (its own owner's only task) was spared
    assert sorted(results) == [1, 1, 2], results  # the newest of the driver's three was retried
    assert tray.get(attempts.get.remote())["child"] == 1
    assert sim_cluster.memory_usage(node_id).used_bytes == 12 * GiB + 3 * GiB


def test_sim_actor_killed_for_memory_dies_with_the_cause(sim_cluster):
    @tray.remote(max_restarts=0)
    class Hog:
        def hog(self):
            tray.simtest.cluster().allocate_memory(MACHINE_BYTES)

        def ping(self):
            return "pong"

    hog = Hog.remote()
    tray.get(hog.hog.remote())
    time.sleep(1)  # (virtual) the monitor's next readings
    with pytest.raises(exceptions.ActorError, match="killed by the memory monitor"):
        tray.get(hog.ping.remote())


def test_sim_memory_monitor_replays_bit_for_bit():
    def run() -> str:
        tray.init(backend="sim", seed=11, num_cpus=2)
        try:
            @tray.remote(max_retries=1)
            def hog(i):
                if i % 2:
                    tray.simtest.cluster().allocate_memory(MACHINE_BYTES)
                    time.sleep(10)
                return i

            for ref in [hog.remote(i) for i in range(4)]:
                try:
                    tray.get(ref)
                except exceptions.OutOfMemoryError:
                    pass
            return tray.simtest.trace_digest()
        finally:
            tray.shutdown()

    assert run() == run()


def test_sim_monitor_off_with_zero_refresh():
    tray.init(backend="sim", seed=1, num_cpus=2,
              config=dataclasses.replace(DEFAULT_CONFIG, memory_monitor_refresh_s=0))
    try:
        @tray.remote(max_retries=0)
        def hog():
            tray.simtest.cluster().allocate_memory(MACHINE_BYTES)
            time.sleep(1)
            return "survived"

        assert tray.get(hog.remote()) == "survived"
    finally:
        tray.shutdown()


def test_sim_allocate_memory_outside_a_task_is_an_error(sim_cluster):
    with pytest.raises(exceptions.TrayError, match="inside a simulated task"):
        sim_cluster.allocate_memory(GiB)
    with pytest.raises(ValueError, match="non-negative"):
        sim_cluster.set_memory_usage(sim_cluster.node_ids()[0], -1)


# ------------------------------------------------------- the local backend


def test_local_bad_memory_settings_fail_at_init(monkeypatch):
    monkeypatch.setenv("RAY_memory_usage_threshold", "1.5")
    with pytest.raises(ValueError, match="RAY_memory_usage_threshold"):
        tray.init(backend="local", num_cpus=1)
    monkeypatch.setenv("RAY_memory_usage_threshold", "0.9")
    monkeypatch.setenv("RAY_memory_monitor_refresh_ms", "soon")
    with pytest.raises(ValueError, match="RAY_memory_monitor_refresh_ms"):
        tray.init(backend="local", num_cpus=1)


CHUNK_BYTES = 128 * 1024**2


@tray.remote
def _wait_for_file(path: str, timeout_s: float):
    open(path + ".running", "w").close()
    deadline = time.monotonic() + timeout_s
    while not os.path.exists(path + ".retried") and time.monotonic() < deadline:
        time.sleep(0.05)
    return "done"


@tray.remote
def _hog_real_memory(marker: str, limit_bytes: int):
    """Allocate real memory in chunks (touching every page) until killed;
    on a run after the first (``marker`` exists), return at once."""
    import numpy as np

    if os.path.exists(marker):
        open(marker + ".retried", "w").close()
        return "retried"
    with open(marker, "w") as file:
        file.write(str(os.getpid()))
    chunks = []
    while len(chunks) * CHUNK_BYTES < limit_bytes:
        chunks.append(np.ones(CHUNK_BYTES // 8))
        time.sleep(0.02)
    time.sleep(30)  # bounded: not killed means the test fails below
    return "survived"


@pytest.mark.skipif("local" not in os.environ.get("TRAY_TEST_BACKENDS", "sim,local"),
                    reason="local backend not selected")
def test_local_real_memory_kill_retry_and_out_of_memory(monkeypatch, tmp_path):
    memory = psutil.virtual_memory()
    used = memory.total - memory.available
    # The threshold sits 768 MiB above the machine's use now; the task
    # allocates up to 3 GiB, far past it.
    threshold = (used + 768 * 1024**2) / memory.total
    if threshold >= 0.9:
        pytest.skip("this machine has too little free memory for the test")
    monkeypatch.setenv("RAY_memory_usage_threshold", f"{threshold:.6f}")
    monkeypatch.setenv("RAY_memory_monitor_refresh_ms", "50")
    tray.init(backend="local", num_cpus=2)
    try:
        # A companion task of the same owner holds the other CPU, so the hog
        # (the newer lease) is not its owner's last task there: retried.
        companion = _wait_for_file.remote(str(tmp_path / "a"), 120)
        # Running before the hog starts (CI, loaded machine: a second's wait
        # was not enough, the hog was its owner's only task there and was
        # not retried).
        deadline = time.monotonic() + 60
        while not os.path.exists(tmp_path / "a.running") and time.monotonic() < deadline:
            time.sleep(0.05)
        retried = _hog_real_memory.options(max_retries=1).remote(str(tmp_path / "a"), 3 * GiB)
        assert tray.get(retried, timeout=120) == "retried"
        assert tray.get(companion, timeout=120) == "done"
        with pytest.raises(exceptions.OutOfMemoryError) as caught:
            tray.get(_hog_real_memory.options(max_retries=0).remote(str(tmp_path / "b"),
                                                                    3 * GiB), timeout=120)
        message = str(caught.value)
        assert "_hog_real_memory" in message and "GiB used of" in message, message
        assert f"threshold {float(f'{threshold:.6f}')}" in message, message
    finally:
        tray.shutdown()
