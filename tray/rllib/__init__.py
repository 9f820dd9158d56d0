"""tray.rllib: reinforcement learning on tray's actors, with RLlib's new-stack API.

    from tray.rllib.algorithms.ppo import PPOConfig

    config = (PPOConfig().environment("CartPole-v1")
              .env_runners(num_env_runners=2).training(lr=3e-4))
    algo = config.build()
    result = algo.train()
    result["env_runners"]["episode_return_mean"]

EnvRunner actors sample gymnasium environments with a numpy copy of the
policy; a torch Learner (in the driver, or in learner actors) trains it;
the Algorithm drives both over tray's public API, so it runs on real
processes and, deterministically and under injected faults, in the
simulator. torch is needed by the learners only (``pip install
tray[rllib]``)."""

from tray.rllib.core.rl_module import DEFAULT_MODULE_ID, RLModuleSpec

from .algorithms import Algorithm, AlgorithmConfig, get_algorithm_class
from .env import EnvContext, MultiAgentEnv, register_env

__all__ = ["DEFAULT_MODULE_ID", "Algorithm", "AlgorithmConfig", "EnvContext", "MultiAgentEnv",
           "RLModuleSpec", "get_algorithm_class", "register_env"]
