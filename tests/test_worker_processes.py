"""Worker processes as Ray's: OMP_NUM_THREADS follows a task's CPUs (unless
the user set it), CUDA_VISIBLE_DEVICES is left unset on a node without
GPUs, work with GPUs never shares a worker process with CPU-only work, and
a burst of short tasks does not grow the pool beyond what the CPUs need."""

from __future__ import annotations

import glob
import os

import pytest

import tray
import tray.simtest
from tray.api import state

local_only = pytest.mark.skipif(
    "local" not in os.environ.get("TRAY_TEST_BACKENDS", "sim,local"),
    reason="local backend not selected")


@tray.remote
def environment():
    return (os.getpid(), os.environ.get("OMP_NUM_THREADS"),
            os.environ.get("CUDA_VISIBLE_DEVICES", "<unset>"))


@tray.remote
def worker_id():
    return tray.get_runtime_context().get_worker_id()


@tray.remote
class Environment:
    def read(self):
        return os.environ.get("OMP_NUM_THREADS"), os.environ.get("CUDA_VISIBLE_DEVICES",
                                                                 "<unset>")


def _workers_started() -> int:
    """Worker processes the local cluster started so far (each gets its own
    log file in the session)."""
    session_dir = state.runtime.info["session_dir"]
    return len(glob.glob(os.path.join(session_dir, "logs", "worker-*.out")))


@local_only
def test_omp_num_threads_follows_cpus_and_cuda_is_left_unset(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    tray.init(backend="local", num_cpus=2, num_gpus=0)
    try:
        _, omp, cuda = tray.get(environment.remote())
        assert (omp, cuda) == ("1", "<unset>")
        assert tray.get(environment.options(num_cpus=2).remote())[1:] == ("2", "<unset>")
        assert tray.get(environment.options(num_cpus=0.5).remote())[1] == "1"
        assert tray.get(environment.options(num_cpus=0).remote())[1] == "1"
        # An actor's CPUs hold for its calls.
        big = Environment.options(num_cpus=2).remote()
        assert tray.get(big.read.remote()) == ("2", "<unset>")
        del big
        assert tray.get(Environment.remote().read.remote())[0] == "1"
    finally:
        tray.shutdown()


@local_only
def test_users_omp_num_threads_wins(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    tray.init(backend="local", num_cpus=2, num_gpus=0)
    try:
        assert tray.get(environment.options(num_cpus=2).remote())[1] == "3"
        assert tray.get(environment.remote())[1] == "3"
    finally:
        tray.shutdown()


@local_only
def test_gpu_and_cpu_only_tasks_never_share_a_worker_process(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    tray.init(backend="local", num_cpus=2, num_gpus=1)
    try:
        cpu_before = {pid for pid, _, cuda in tray.get([environment.remote() for _ in range(6)])}
        gpu = tray.get([environment.options(num_gpus=1).remote() for _ in range(3)])
        cpu_after = tray.get([environment.remote() for _ in range(6)])
        gpu_pids = {pid for pid, _, _ in gpu}
        assert not gpu_pids & cpu_before, (gpu_pids, cpu_before)
        assert not gpu_pids & {pid for pid, _, _ in cpu_after}, (gpu_pids, cpu_after)
        assert {cuda for _, _, cuda in gpu} == {"0"}
        # On a node with GPUs, a CPU-only task sees none of them.
        assert {cuda for _, _, cuda in cpu_after} == {""}
    finally:
        tray.shutdown()


@local_only
def test_burst_of_short_tasks_starts_no_more_workers_than_cpus():
    tray.init(backend="local", num_cpus=2, num_gpus=0)
    try:
        pids = {pid for pid, _, _ in tray.get([environment.remote() for _ in range(300)])}
        assert len(pids) <= 2, pids
        assert _workers_started() <= 2, _workers_started()
    finally:
        tray.shutdown()


@pytest.mark.parametrize("seed", [0, 1])
def test_sim_gpu_work_gets_workers_of_its_own(seed):
    tray.init(backend="sim", seed=seed, num_cpus=2, num_gpus=1)
    try:
        cpu_before = set(tray.get([worker_id.remote() for _ in range(6)]))
        gpu = set(tray.get([worker_id.options(num_gpus=1).remote() for _ in range(3)]))
        cpu_after = set(tray.get([worker_id.remote() for _ in range(6)]))
        assert not gpu & cpu_before and not gpu & cpu_after, (gpu, cpu_before, cpu_after)
    finally:
        tray.shutdown()


def test_sim_burst_starts_no_more_workers_than_cpus():
    tray.init(backend="sim", seed=0, num_cpus=2)
    try:
        ids = set(tray.get([worker_id.remote() for _ in range(300)]))
        assert len(ids) <= 2, ids
        assert len(tray.simtest.cluster().workers()) <= 2
    finally:
        tray.shutdown()
