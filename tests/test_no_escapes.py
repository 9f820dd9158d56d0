"""An error about one call fails that call, never the process around it.

Each test here crashed a whole simulated cluster (or the real head node)
before: an exception escaped from a background task of the core into its
process's root nursery. Now the one call fails with a clear error, and the
cluster runs on."""

from __future__ import annotations

import time

import pytest

import tray
import tray.simtest
from tray import exceptions as tex
from tray.core.config import Config


@tray.remote
def square(x):
    return x * x


@tray.remote
def slow(x, sleep_s: float = 5.0):
    time.sleep(sleep_s)
    return x


@tray.remote
def slow_failure(sleep_s: float = 5.0):
    time.sleep(sleep_s)
    raise ValueError("the argument failed")


@tray.remote
class Echo:
    def echo(self, x):
        return x

    def slow_echo(self, x, sleep_s: float = 1.0):
        time.sleep(sleep_s)
        return x


def _sim(**config) -> None:
    tray.init(backend="sim", num_nodes=1, num_cpus=2, seed=0, config=Config(**config))


def test_pending_actor_creation_survives_a_gcs_outage_longer_than_the_timeout():
    # The owner holds a pending actor's constructor arguments until the GCS
    # says it is alive; when the GCS stayed down past gcs_reconnect_timeout_s
    # that wait raised TrayError in a background task and the driver died.
    _sim(gcs_reconnect_timeout_s=10.0)
    try:
        pending = Echo.options(num_cpus=64).remote()  # no node has 64 CPUs: it stays pending
        cluster = tray.simtest.cluster()
        cluster.restart_gcs(down_for_s=30.0)
        cluster.advance(20.0)  # past the timeout, GCS still down
        cluster.advance(15.0)  # the GCS is back
        assert tray.get(square.remote(7)) == 49  # the driver and the cluster live on
        ready, _ = tray.wait([pending.echo.remote(1)], timeout=1.0)
        assert ready == []  # still pending, not crashed
    finally:
        tray.shutdown()


def test_calls_an_actor_refuses_at_its_limit_fail_alone():
    # Calls that arrive before an earlier call of the same caller wait at
    # the actor, at most actor_pending_calls_max of them; one more raised
    # ActorError inside the caller's background task and the cluster crashed.
    _sim(actor_pending_calls_max=2)
    try:
        echo = Echo.remote()
        assert tray.get(echo.echo.remote(0)) == 0
        first = echo.echo.remote(slow.remote(1))  # sent only when its argument exists
        later = [echo.echo.remote(x) for x in range(2, 7)]  # sent at once: they wait for it
        assert tray.get(first) == 1
        # Calls sent at once may arrive in any order: the first two to arrive
        # wait, the other three are refused.
        answered, refused = [], 0
        for x, ref in zip(range(2, 7), later, strict=True):
            try:
                answered.append((x, tray.get(ref)))
            except tex.ActorError as error:
                assert "actor_pending_calls_max=2" in str(error)
                refused += 1
        assert refused == 3 and all(x == value for x, value in answered)
        assert tray.get(echo.echo.remote(7)) == 7  # the refused calls left no gap
    finally:
        tray.shutdown()


def test_a_call_whose_argument_failed_does_not_hold_back_later_calls(backend):
    # The failed call is never sent, so the actor never learned that its
    # sequence number was abandoned: a later call, sent already, waited for
    # it forever. Now the caller tells the actor its new floor.
    tray.init(backend=backend, num_cpus=2)
    sleep_s = 5.0 if backend == "sim" else 1.0
    try:
        echo = Echo.remote()
        assert tray.get(echo.echo.remote(0)) == 0
        failed = echo.echo.remote(slow_failure.remote(sleep_s))
        later = echo.echo.remote(5)
        with pytest.raises(ValueError, match="the argument failed"):
            tray.get(failed)
        assert tray.get(later, timeout=30.0) == 5
    finally:
        tray.shutdown()


def test_max_pending_calls_refuses_calls_at_remote(backend):
    tray.init(backend=backend, num_cpus=2)
    try:
        echo = Echo.options(max_pending_calls=2).remote()
        pending = [echo.slow_echo.remote(x) for x in range(2)]
        with pytest.raises(tex.PendingCallsLimitExceeded, match="max_pending_calls=2"):
            echo.slow_echo.remote(2)
        assert tray.get(pending) == [0, 1]
        assert tray.get(echo.slow_echo.remote(3)) == 3  # room again
        assert tex.PendingCallsLimitExceeded.__module__ == "tray.exceptions"
    finally:
        tray.shutdown()


def test_max_pending_calls_must_be_minus_one_or_positive():
    with pytest.raises(ValueError, match="max_pending_calls"):
        Echo.options(max_pending_calls=0)
    with pytest.raises(ValueError, match="max_pending_calls"):
        Echo.options(max_pending_calls=-2)


def test_actors_beyond_the_worker_cap_wait_instead_of_killing_the_node():
    # Starting a worker beyond workers_per_node_max raised RuntimeError in
    # the node's lease handler; the GCS's actor scheduling did not catch it
    # and the head (GCS and node manager) exited.
    _sim(workers_per_node_max=3)
    try:
        actors = [Echo.remote() for _ in range(5)]
        calls = [actor.echo.remote(i) for i, actor in enumerate(actors)]
        done, pending = tray.wait(calls, num_returns=5, timeout=30.0)
        assert len(done) == 3 and len(pending) == 2  # three fit, two wait
        for ref in done[:2]:
            tray.kill(actors[calls.index(ref)])
        assert sorted(tray.get(pending, timeout=60.0)) == \
            sorted(calls.index(ref) for ref in pending)
    finally:
        tray.shutdown()


def test_lineage_beyond_its_limit_is_evicted_with_a_clear_error():
    import numpy as np

    @tray.remote(max_retries=1)
    def make(x):
        return np.full(50_000, x)  # in a node's store, so its lineage is kept

    tray.init(backend="sim", num_nodes=2, num_cpus=1, seed=3,
              config=Config(lineage_tasks_max=2))
    try:
        cluster = tray.simtest.cluster()
        other = cluster.node_ids()[1]
        pin = tray.util.scheduling_strategies.NodeAffinitySchedulingStrategy(other, soft=False)
        refs = []
        for x in range(3):  # one after another, so the first is the oldest lineage
            refs.append(make.options(scheduling_strategy=pin).remote(x))
            tray.wait(refs[-1:], fetch_local=False)  # the only copies are there
        cluster.kill_node(other)
        cluster.advance(15.0)  # declared dead
        with pytest.raises(tex.ObjectReconstructionFailedError, match="lineage_tasks_max=2"):
            tray.get(refs[0])  # the oldest: its lineage went
        with pytest.raises(tex.TaskError, match="not alive"):
            tray.get(refs[2])  # kept: re-run, which fails only for want of its node
    finally:
        tray.shutdown()
