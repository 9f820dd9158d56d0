"""The simulated driver on the real driver's thread path.

``tray.init(backend="sim", _driver_thread_path=True)`` builds the driver's
core worker as the local backend does (``loop_in_other_thread``, a
``thread_condition``: tray/backends/sim/processes.SimThreadCondition), so
the user's code runs tray/core/worker/thread_inbox.py and thread_waits.py,
the code a real driver runs, in a deterministic run. These tests: a program
gives the same values on both paths, each path is deterministic (digest
twice, and in a fresh process), and the thread path's code is what ran."""

from __future__ import annotations

import collections
import subprocess
import sys
import textwrap

import pytest

import tray
from tray.core.worker import thread_inbox, thread_waits

PROGRAM = textwrap.dedent('''
    import tray

    def program():
        @tray.remote
        def double(x):
            return x * 2

        @tray.remote
        def slow(x):
            import time
            time.sleep(5)
            return x

        @tray.remote
        def fails():
            raise ValueError("no")

        @tray.remote
        class Counter:
            def __init__(self):
                self.n = 0

            def add(self, k):
                self.n += k
                return self.n

        out = []
        out.append(tray.get([double.remote(i) for i in range(10)]))
        counter = Counter.remote()
        out.append(tray.get([counter.add.remote(i) for i in range(5)]))
        out.append(tray.get(tray.put(list(range(5)))))
        out.append(tray.get(double.remote(tray.put(21))))
        big = tray.put(b"x" * 300_000)  # through the node's store, not the inbox
        out.append(len(tray.get(big)))
        pending = slow.remote(7)
        try:
            tray.get(pending, timeout=1)
            out.append("no timeout")
        except tray.exceptions.GetTimeoutError:
            out.append("timeout")
        try:
            tray.get([pending], timeout=0.5)
            out.append("no timeout")
        except tray.exceptions.GetTimeoutError:
            out.append("timeout")
        ready, not_ready = tray.wait([pending, double.remote(3)], num_returns=1, timeout=10)
        out.append((len(ready), len(not_ready), tray.get(ready)))
        ready, not_ready = tray.wait([pending], num_returns=1, timeout=0.5)
        out.append((len(ready), len(not_ready)))
        ready, not_ready = tray.wait([pending], num_returns=1, timeout=0)
        out.append((len(ready), len(not_ready)))
        out.append(tray.get(pending))
        try:
            tray.get(fails.remote())
        except ValueError as error:
            out.append(f"error: {error}")
        refs = [double.remote(i) for i in range(20)]
        done = []
        while refs:
            ready, refs = tray.wait(refs, num_returns=1)
            done.extend(tray.get(ready))
        out.append(sorted(done))
        return out
''')

namespace: dict = {}
exec(compile(PROGRAM, "<thread-path program>", "exec"), namespace)  # noqa: S102 - our own text


def run(thread_path: bool, seed: int = 3) -> tuple[list, str, float]:
    tray.init(backend="sim", seed=seed, num_nodes=2, num_cpus=2, validate_every_steps=50,
              _driver_thread_path=thread_path)
    try:
        from tray.simtest import cluster

        sim = cluster()
        values = namespace["program"]()
        return values, sim.digest(), sim.clock.current_time()
    finally:
        tray.shutdown()


@pytest.fixture
def calls(monkeypatch):
    """Counts the calls of the thread path's functions (wrapped, not replaced)."""
    counts: dict = {}

    def count(cls, name):
        original = getattr(cls, name)

        def counted(*args, **kwargs):
            counts[name] = counts.get(name, 0) + 1
            return original(*args, **kwargs)
        monkeypatch.setattr(cls, name, counted)

    for name in ("get_ready", "get_from_thread", "wait_from_thread", "_sleep_in_thread",
                 "_watch_for_thread", "_watch_wait_for_thread"):
        count(thread_waits.ThreadWaits, name)
    for name in ("put", "_drain"):
        count(thread_inbox.ThreadInbox, name)
    return counts


def test_same_values_on_both_paths_and_the_thread_path_runs_its_code(calls):
    loop_values, loop_digest, _ = run(False)
    assert calls == {}, calls  # the simulator's own path: none of it
    thread_values, thread_digest, _ = run(True)
    assert thread_values == loop_values
    assert loop_values[4:10] == [300_000, "timeout", "timeout", (1, 1, [6]), (0, 1), (0, 1)]
    assert thread_digest != loop_digest  # (another way through the core: another trace)
    for name in ("get_ready", "get_from_thread", "wait_from_thread", "_sleep_in_thread",
                 "_watch_for_thread", "_watch_wait_for_thread", "put", "_drain"):
        assert calls.get(name, 0) > 0, (name, calls)


@pytest.mark.parametrize("thread_path", [False, True])
def test_each_path_is_deterministic(thread_path):
    first = run(thread_path)
    second = run(thread_path)
    assert first == second


def test_thread_path_digest_is_the_same_in_a_fresh_process():
    here = run(True)
    script = PROGRAM + textwrap.dedent('''
        tray.init(backend="sim", seed=3, num_nodes=2, num_cpus=2, validate_every_steps=50,
                  _driver_thread_path=True)
        from tray.simtest import cluster
        values = program()
        print(cluster().digest())
        tray.shutdown()
    ''')
    fresh = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                           timeout=120, check=True)
    assert fresh.stdout.split()[-1] == here[1]


def test_a_timed_out_thread_wait_ends_at_its_virtual_deadline():
    """get(timeout) on the thread path sleeps on the condition, which steps
    the run for exactly the timeout in virtual time, then gives up."""
    tray.init(backend="sim", seed=1, _driver_thread_path=True)
    try:
        from tray.simtest import cluster

        sim = cluster()

        @tray.remote
        def slow():
            import time
            time.sleep(100)
            return 1

        ref = slow.remote()
        tray.wait([ref], timeout=0)
        start = sim.clock.current_time()
        with pytest.raises(tray.exceptions.GetTimeoutError):
            tray.get(ref, timeout=2.5)
        assert sim.clock.current_time() == pytest.approx(start + 2.5, abs=1e-9)
        assert sim.driver.thread_waits.statistics().threads_waiting == 0
        assert tray.get(ref) == 1
    finally:
        tray.shutdown()


def test_simtest_draws_the_path_per_seed():
    from tray.simtest import runner

    drawn = [runner.driver_thread_path(seed) for seed in range(200)]
    assert drawn == [runner.driver_thread_path(seed) for seed in range(200)]
    assert 60 < sum(drawn) < 140


# ------------------------------------------- bugs planted in the thread path
# simtest's sweeps draw the thread path for about half the seeds
# (runner.driver_thread_path): a bug in thread_inbox or thread_waits is
# caught by the invariants every seed checks. Each runs the first few seeds
# that draw the thread path (0, 1, 3, 8, ...) of mixed with default faults.

def _thread_path_seeds(count: int) -> list:
    from tray.simtest import runner

    return [seed for seed in range(100) if runner.driver_thread_path(seed)][:count]


def _first_failure(count: int, *invariants: str):
    """The first of ``count`` thread-path seeds of mixed that fails on one
    of ``invariants`` (the checks that see the planted bug first: the
    paths piece's own judgement of get/wait, or the values after)."""
    from tray.simtest import runner

    seen = []
    for seed in _thread_path_seeds(count):
        result = runner.run_seed(seed, "mixed", "default")
        if not result.ok:
            seen.append((seed, result.invariant))
            if result.invariant in invariants:
                return result
    pytest.fail(f"the planted bug went unnoticed (failures on other invariants: {seen})")


def test_a_thread_wait_answering_unready_refs_ready_is_caught_within_2_seeds(monkeypatch):
    from tray.core.worker.object_getter import split_at

    def hasty(self, refs, num_returns, timeout, fetch_local):
        return split_at(refs, list(range(num_returns)))  # "ready" without looking

    monkeypatch.setattr(thread_waits.ThreadWaits, "wait_from_thread", hasty)
    result = _first_failure(2, "wait-ready-means-ready", "api-outcome-as-ray",
                            "get-returns-model-value")
    if result.invariant == "wait-ready-means-ready":
        assert "get did not answer" in result.message


def test_an_inbox_running_newest_first_is_caught_within_2_seeds(monkeypatch):
    class NewestFirst(collections.deque):
        def popleft(self):
            return self.pop()

    original = thread_inbox.ThreadInbox.__init__

    def newest_first(self, *args, **kwargs):
        original(self, *args, **kwargs)
        self._ops = NewestFirst()

    monkeypatch.setattr(thread_inbox.ThreadInbox, "__init__", newest_first)
    _first_failure(2, "actor-calls-in-submission-order")


def test_a_ready_read_that_returns_errors_as_values_is_caught_within_2_seeds(monkeypatch):
    from tray.core.serialization import deserialize

    def get_ready(self, refs):
        table = self._references.refs
        values = []
        for ref in refs:
            entry = table.get(ref._id)
            if entry is None or not entry.owned or not entry.ready or entry.inline is None \
                    or entry.inline.contained:
                return None
            values.append(deserialize(entry.inline))  # an error too, not raised
        return values

    monkeypatch.setattr(thread_waits.ThreadWaits, "get_ready", get_ready)
    _first_failure(2, "get-returns-model-value")


def test_a_thread_get_that_ignores_its_timeout_is_caught_within_3_seeds(monkeypatch):
    original = thread_waits.ThreadWaits._sleep_in_thread

    def no_timeout(self, waiter, watch, timeout, unwatch):
        return original(self, waiter, watch, None, unwatch)

    monkeypatch.setattr(thread_waits.ThreadWaits, "_sleep_in_thread", no_timeout)
    _first_failure(3, "get-returns-model-value", "api-outcome-as-ray")
