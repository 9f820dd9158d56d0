"""Environments and the EnvRunner actors that sample them."""

from .env_runner import SingleAgentEnvRunner
from .env_runner_group import EnvRunnerGroup
from .multi_agent_env import MultiAgentCartPole, MultiAgentEnv
from .multi_agent_env_runner import MultiAgentEnvRunner
from .registry import EnvContext, register_env

__all__ = ["EnvContext", "EnvRunnerGroup", "MultiAgentCartPole", "MultiAgentEnv",
           "MultiAgentEnvRunner", "SingleAgentEnvRunner", "register_env"]
