"""Workers forked by the node's zygote (tray/backends/local/zygote.py): they
are real, separate worker processes — own pid, own random state, output
prefixed with their own pid, deaths reported — and a node whose zygote is
gone, or that is told not to fork, starts them fresh."""

from __future__ import annotations

import os
import random
import signal
import time

import psutil
import pytest

import tray
import tray.exceptions as tex
from tray.backends.local.zygote import WORKER_PROCESS_NAME, ZYGOTE_PROCESS_NAME

pytestmark = pytest.mark.skipif(
    "local" not in os.environ.get("TRAY_TEST_BACKENDS", "sim,local"),
    reason="local backend not selected")


@tray.remote
def who(marker: str):
    print(f"{marker} from {os.getpid()}", flush=True)
    return os.getpid(), psutil.Process().ppid(), random.random()


@tray.remote
class Holder:
    def pid(self):
        return os.getpid()


def _node_pid() -> int:
    node_pids = [p.pid for p in psutil.Process().children()
                 if "tray.backends.local.node" in " ".join(p.cmdline())]
    assert len(node_pids) == 1, node_pids
    return node_pids[0]


def _zygote_of(node_pid: int) -> list[int]:
    found = []
    for child in psutil.Process(node_pid).children():
        try:
            if child.name() == ZYGOTE_PROCESS_NAME:
                found.append(child.pid)
        except psutil.ZombieProcess:
            pass
    return found


def test_workers_are_forked_separate_processes(capfd):
    tray.init(num_cpus=2, include_dashboard=False)
    try:
        [zygote] = _zygote_of(_node_pid())
        results = tray.get([who.remote(f"marker-{i}") for i in range(2)])
        holders = [Holder.remote() for _ in range(2)]
        pids = tray.get([h.pid.remote() for h in holders])
        assert [parent for _, parent, _ in results] == [zygote, zygote]
        # Named for what they are (their command line is the zygote's).
        assert {psutil.Process(pid).name() for pid in pids} == {WORKER_PROCESS_NAME}
        assert len(set(pids)) == 2 and not set(pids) & {os.getpid(), zygote}
        # Forked children do not share the random module's state.
        holders_draws = tray.get([who.options(num_cpus=0).remote("draw") for _ in range(6)])
        assert len({draw for _, _, draw in results + holders_draws}) == len(results + holders_draws)
        time.sleep(0.5)
        out = capfd.readouterr().out
        for i, (pid, _, _) in enumerate(results):
            assert f"(worker pid={pid}) marker-{i} from {pid}" in out, out
    finally:
        tray.shutdown()


def test_a_killed_forked_worker_is_reported_dead():
    tray.init(num_cpus=1, include_dashboard=False)
    try:
        holder = Holder.remote()
        os.kill(tray.get(holder.pid.remote()), signal.SIGKILL)
        with pytest.raises(tex.RayActorError):
            tray.get(holder.pid.remote(), timeout=30)
    finally:
        tray.shutdown()


def test_without_a_zygote_workers_start_fresh(monkeypatch):
    """The zygote killed, or TRAY_WORKER_FORK=0: workers are the node's own
    children, and everything still runs."""
    tray.init(num_cpus=1, include_dashboard=False)
    try:
        node = _node_pid()
        [zygote] = _zygote_of(node)
        os.kill(zygote, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while psutil.pid_exists(zygote):  # reaped by the node
            assert time.monotonic() < deadline, "the node left its zygote a zombie"
            time.sleep(0.05)
        # More actors than the node prestarted workers (one per CPU, forked
        # before the zygote died and living on as orphans): the new ones are
        # the node's own children.
        holders = [Holder.options(num_cpus=0).remote() for _ in range(3)]
        pids = tray.get([holder.pid.remote() for holder in holders], timeout=60)
        parents = {psutil.Process(pid).ppid() for pid in pids}
        assert node in parents and zygote not in parents, (node, parents)
    finally:
        tray.shutdown()
    monkeypatch.setenv("TRAY_WORKER_FORK", "0")
    tray.init(num_cpus=1, include_dashboard=False)
    try:
        node = _node_pid()
        assert _zygote_of(node) == []
        _, parent, _ = tray.get(who.remote("fresh"), timeout=60)
        assert parent == node
    finally:
        tray.shutdown()
