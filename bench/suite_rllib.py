"""RLlib's benchmarks, for tray.rllib and Ray's RLlib with the same code.

* ``rllib: PPO CartPole-v1 to return 450``: PPO with the same config on
  both (2 env runners, 1 env each, a local learner, train batch 2,000,
  minibatches of 128, 6 epochs, lr 3e-4, vf_loss_coeff 0.01, 64x64 tanh
  MLPs, seed 0) trains until ``env_runners/episode_return_mean`` (the mean
  of the last 100 episodes) reaches 450; rows: the env steps sampled by
  then, and the wall-clock seconds of ``train()`` calls (building the
  algorithm not included). A run stops at ``STEPS_MAX`` env steps and then
  reports that it did not get there.
* ``rllib: sampling, 2 env runners, CartPole-v1``: env steps per second of
  two env runner actors sampling 2,000-step fragments at once with the
  initial policy (RLlib's ``SingleAgentEnvRunner`` actors, tray's through
  its ``EnvRunnerGroup``).

Both run on a local cluster of 2 CPUs (``tray.init(num_cpus=2)``, Ray with
``_node_ip_address="127.0.0.1"``) with one torch thread in the driver
(``torch.set_num_threads(1)``, ``OMP_NUM_THREADS=1``), one process per
runtime and metric as run.py does; the training metric runs one training
per round, seeded with the round's index, and at most 2 rounds (RLlib takes
a minute or more per training here)."""

from __future__ import annotations

import os
import time

import harness

CPUS = 2
TARGET_RETURN = 450.0
STEPS_MAX = 200_000
BATCH = 2000
SAMPLE_STEPS = 2000

DEFINITIONS = [
    ("rllib: PPO CartPole-v1 to return 450", "steps or s", False, ("env steps", "wall-clock s")),
    ("rllib: sampling, 2 env runners, CartPole-v1", "env steps/s", True, ()),
]
NAMES = [definition[0] for definition in DEFINITIONS]


def _start(runtime: str):
    # One torch thread in the driver (its local learner), for both: on 2
    # cores busy with env runners, more threads only spin against them.
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch

    torch.set_num_threads(1)
    if runtime == "tray":
        import tray

        tray.init(num_cpus=CPUS)
        return tray
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    import ray

    ray.init(num_cpus=CPUS, include_dashboard=False, logging_level="ERROR",
             log_to_driver=False, _node_ip_address="127.0.0.1")
    return ray


def _ppo_config(runtime: str, seed: int):
    if runtime == "tray":
        from tray.rllib.algorithms.ppo import PPOConfig
    else:
        from ray.rllib.algorithms.ppo import PPOConfig
    return (PPOConfig().environment("CartPole-v1")
            .env_runners(num_env_runners=2, num_envs_per_env_runner=1)
            .learners(num_learners=0)
            .training(lr=3e-4, train_batch_size_per_learner=BATCH, minibatch_size=128,
                      num_epochs=6, vf_loss_coeff=0.01)
            .rl_module(model_config={"fcnet_hiddens": [64, 64], "fcnet_activation": "tanh"})
            .debugging(seed=seed))


def _train_to_target(runtime: str, seed: int) -> tuple[float, float]:
    algo = _ppo_config(runtime, seed).build_algo()
    try:
        elapsed = 0.0
        steps = 0
        while steps < STEPS_MAX:
            start = time.perf_counter()
            result = algo.train()
            elapsed += time.perf_counter() - start
            steps = result["num_env_steps_sampled_lifetime"]
            if isinstance(steps, dict):  # pragma: no cover - older result layouts
                steps = sum(steps.values())
            if result["env_runners"].get("episode_return_mean", 0.0) >= TARGET_RETURN:
                return float(steps), elapsed
        raise RuntimeError(f"{runtime}: PPO did not reach {TARGET_RETURN} in {STEPS_MAX} steps")
    finally:
        algo.stop()


def _sampling_rate(runtime: str) -> list[float]:
    steps = harness.n(SAMPLE_STEPS)
    if runtime == "tray":
        import tray
        from tray.rllib.env import EnvRunnerGroup

        config = _ppo_config("tray", 0).env_runners(rollout_fragment_length=steps)
        config.validate()
        import gymnasium

        env = gymnasium.make("CartPole-v1")
        spec = config.module_spec(env.observation_space, env.action_space)
        group = EnvRunnerGroup(config, {"default_policy": spec})
        weights = tray.put({"default_policy": spec.initial_weights(0)})

        def body():
            results = group.sample(weights, 1, num_timesteps=2 * steps)
            return sum(r["env_steps"] for r in results)
        try:
            return harness.throughput(body)
        finally:
            group.stop()
    import ray
    from ray.rllib.env.single_agent_env_runner import SingleAgentEnvRunner

    config = _ppo_config("ray", 0).env_runners(rollout_fragment_length=steps)
    runners = [ray.remote(num_cpus=1)(SingleAgentEnvRunner).remote(config=config,
                                                                    worker_index=index + 1)
               for index in range(2)]

    def body():
        episodes = ray.get([r.sample.remote(num_timesteps=steps, random_actions=False)
                            for r in runners])
        return sum(sum(len(e) for e in batch) for batch in episodes)
    try:
        return harness.throughput(body)
    finally:
        for runner in runners:
            ray.kill(runner)


def metric_for(runtime: str, name: str):
    """The function that measures ``name`` on ``runtime`` (tray or ray)."""

    def to_target():
        module = _start(runtime)
        try:
            runs = [_train_to_target(runtime, seed) for seed in range(max(1, min(2, harness.ROUNDS)))]
        finally:
            module.shutdown()
        return {"env steps": [steps for steps, _ in runs],
                "wall-clock s": [seconds for _, seconds in runs]}

    def sampling():
        module = _start(runtime)
        try:
            return _sampling_rate(runtime)
        finally:
            module.shutdown()

    return {NAMES[0]: to_target, NAMES[1]: sampling}[name]
