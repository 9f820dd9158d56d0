"""tray.rllib on real processes (the local backend): env runner and learner
actors in their own worker processes, and an env runner killed with
SIGKILL while the algorithm trains."""

from __future__ import annotations

import os
import signal

import pytest

pytest.importorskip("torch")
pytest.importorskip("gymnasium")

import tray  # noqa: E402
from tray.rllib.algorithms.ppo import PPOConfig  # noqa: E402


@pytest.fixture
def local_cluster():
    tray.init(num_cpus=4)
    yield
    tray.shutdown()


def _config():
    return (PPOConfig().environment("CartPole-v1")
            .env_runners(num_env_runners=2, num_envs_per_env_runner=2)
            .training(lr=3e-4, train_batch_size=400, minibatch_size=100, num_epochs=2,
                      model={"fcnet_hiddens": [16, 16]})
            .debugging(seed=0))


def test_ppo_on_real_processes_with_a_learner_actor(local_cluster):
    algo = _config().learners(num_learners=1).build()
    results = [algo.train() for _ in range(2)]
    pids = algo.env_runner_group.foreach_env_runner(lambda runner: os.getpid())
    assert len(set(pids)) == 2 and os.getpid() not in pids  # runners are processes of their own
    last = results[-1]
    assert last["num_env_steps_sampled_lifetime"] == 800
    assert last["learners"]["default_policy"]["num_module_steps_trained"] == 400
    assert last["env_runners"]["num_episodes_lifetime"] > 0
    evaluation = algo.evaluate()["env_runners"]
    assert evaluation["num_episodes"] == 10
    algo.stop()


def test_env_runner_killed_with_sigkill_is_restarted(local_cluster):
    algo = _config().build()
    algo.train()
    [victim_pid, other_pid] = algo.env_runner_group.foreach_env_runner(lambda r: os.getpid())
    os.kill(victim_pid, signal.SIGKILL)
    results = [algo.train() for _ in range(3)]
    assert all(r["env_runners"]["num_env_steps_sampled"] >= 400 for r in results)
    last = results[-1]
    assert last["fault_tolerance"]["num_healthy_workers"] == 2
    pids = algo.env_runner_group.foreach_env_runner(lambda r: os.getpid())
    assert victim_pid not in pids and other_pid in pids
    # The request in flight to the killed runner (if any) was lost and
    # counted; a request sent after its death waited for the restart.
    assert last["fault_tolerance"]["num_lost_sample_requests"] == \
        last["fault_tolerance"]["num_remote_worker_restarts"]
    algo.stop()
