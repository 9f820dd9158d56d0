"""The EnvRunner for MultiAgentEnvs: each agent acts with the module that
``policy_mapping_fn(agent_id, episode)`` names, and each agent's
trajectory goes to that module's learner.

It samples whole episodes (as ``batch_mode="complete_episodes"``): a call
runs until the episodes finished during it hold ``num_timesteps`` env steps
and returns those episodes; one still running when the target is reached
is carried over to the next call. Cutting a multi-agent episode in the
middle would need a bootstrap observation for an agent that is waiting for
its turn, which turn-based games do not have."""

from __future__ import annotations

import numpy as np

from tray.rllib.core.rl_module import NumpyPolicy, env_action

from ..utils import spaces as spaces_module
from ..utils.packing import unpack
from .env_runner import _get, _incarnation
from .registry import make_env

STEPS_PER_EPISODE_MAX = 1_000_000  # an env that never ends must not hang a runner


class _AgentTrack:
    def __init__(self, agent_id, module_id: str) -> None:
        self.agent_id = agent_id
        self.module_id = module_id
        self.obs: list = []
        self.actions: list = []
        self.rewards: list = []
        self.logp: list = []
        self.dist_inputs: list = []
        self.total_return = 0.0
        self.terminated = False
        self.truncated = False

    def waiting_for_obs(self) -> bool:
        return len(self.actions) == len(self.obs) and bool(self.actions)

    def chunk(self, eps_id: str, all_terminated: bool) -> dict:
        if self.waiting_for_obs():
            self.obs.append(self.obs[-1])  # no next observation came: not used (terminal)
        terminated = self.terminated or (all_terminated and not self.truncated)
        return {"eps_id": eps_id, "agent_id": self.agent_id, "t_started": 0,
                "obs": np.stack(self.obs).astype(np.float32),
                "actions": np.asarray(self.actions),
                "rewards": np.asarray(self.rewards, dtype=np.float32),
                "action_logp": np.asarray(self.logp, dtype=np.float32),
                "action_dist_inputs": np.stack(self.dist_inputs).astype(np.float32),
                "terminated": bool(terminated), "truncated": bool(not terminated)}


class _Episode:
    def __init__(self, eps_id: str, obs: dict) -> None:
        self.eps_id = eps_id
        self.obs = obs
        self.length = 0
        self.agents: dict = {}
        self.module_of: dict = {}
        self.rewards_before_acting: dict = {}


class MultiAgentEnvRunner:
    def __init__(self, config, worker_index: int = 0, num_workers: int = 0,
                 module_specs: dict | None = None, evaluation: bool = False) -> None:
        config, module_specs = unpack(config), unpack(module_specs)
        self.config = config
        self.worker_index = worker_index
        self.num_envs = int(config.num_envs_per_env_runner)
        seed = config.seed if config.seed is not None else 0
        base = [seed & 0xFFFFFFFF, worker_index, 1 if evaluation else 0]
        self.rng = np.random.default_rng(base)
        self.envs = [make_env(config.env, config.env_config, worker_index=worker_index,
                              num_workers=num_workers, vector_index=i)
                     for i in range(self.num_envs)]
        self.env_seeds = [int(np.random.default_rng([*base, 2, i]).integers(2**31))
                          for i in range(self.num_envs)]
        self.mapping_fn = config.policy_mapping_fn
        self.specs = module_specs or {}
        self.policies = {mid: NumpyPolicy(spec) for mid, spec in self.specs.items()}
        self.weights_version = -1
        self.episodes_started = 0
        self.episodes: list[_Episode | None] = [None] * self.num_envs
        self.writer = None
        if config.output and not evaluation:
            from ..offline.io import OfflineWriter

            self.writer = OfflineWriter(config.output, config.output_format, worker_index,
                                        incarnation=f"-{_incarnation()}")

    def ping(self) -> str:
        return "pong"

    def apply(self, fn, *args):
        """``fn(self, *args)``: EnvRunnerGroup.foreach_env_runner's way in."""
        return fn(self, *args)

    def get_spaces(self) -> dict:
        env = self.envs[0]
        found: dict = {}
        for agent_id in list(getattr(env, "possible_agents", []) or []):
            module_id = self.mapping_fn(agent_id, None)
            found.setdefault(module_id, (env.get_observation_space(agent_id),
                                         env.get_action_space(agent_id)))
        return found

    def set_weights(self, weights, version: int) -> None:
        if version != self.weights_version:
            weights = _get(weights)
            for module_id, module_weights in weights.items():
                if module_id in self.policies:
                    self.policies[module_id].set_weights(module_weights)
            self.weights_version = version

    def sample(self, weights=None, version: int = 0, *, num_timesteps: int | None = None,
               num_episodes: int | None = None, explore: bool | None = None,
               random_actions: bool = False, force_reset: bool = False) -> dict:
        if weights is not None:
            self.set_weights(weights, version)
        if (num_timesteps is None) == (num_episodes is None):
            raise ValueError("sample() takes exactly one of num_timesteps and num_episodes")
        explore = self.config.explore if explore is None else explore
        if force_reset or num_episodes is not None:
            self.episodes = [None] * self.num_envs
        for index in range(self.num_envs):
            if self.episodes[index] is None:
                self._reset(index)
        chunks: dict = {}
        finished: list = []
        env_steps = agent_steps = steps_in_finished = 0
        while True:
            if num_episodes is not None and len(finished) >= num_episodes:
                break
            if num_timesteps is not None and steps_in_finished >= num_timesteps:
                break
            for index in range(self.num_envs):
                done, acted = self._step(index, explore, random_actions)
                env_steps += 1
                agent_steps += acted
                if done is not None:
                    episode_chunks, stats = done
                    for chunk in episode_chunks:
                        chunks.setdefault(chunk.pop("module_id"), []).append(chunk)
                    finished.append(stats)
                    steps_in_finished += stats["length"]
        if num_episodes is not None:
            self.episodes = [None] * self.num_envs
        if self.writer is not None:
            self.writer.write(chunks)
        return {"chunks": chunks, "episodes": finished, "env_steps": env_steps,
                "agent_steps": agent_steps, "weights_version": self.weights_version,
                "runner_index": self.worker_index}

    def stop(self) -> None:
        for env in self.envs:
            env.close()

    # ------------------------------------------------------------ stepping

    def _reset(self, index: int) -> None:
        seed = self.env_seeds[index]
        self.env_seeds[index] = None
        obs, _infos = self.envs[index].reset(seed=seed)
        self.episodes[index] = _Episode(f"{self.worker_index}-{index}-{self.episodes_started}",
                                        obs)
        self.episodes_started += 1

    def _module_of(self, episode: _Episode, agent_id) -> str:
        module_id = episode.module_of.get(agent_id)
        if module_id is None:
            module_id = self.mapping_fn(agent_id, episode)
            if module_id not in self.policies:
                raise ValueError(f"policy_mapping_fn mapped agent {agent_id!r} to "
                                 f"{module_id!r}, which is not one of the policies "
                                 f"{sorted(self.policies)}")
            episode.module_of[agent_id] = module_id
        return module_id

    def _step(self, index: int, explore: bool, random_actions: bool):
        env = self.envs[index]
        episode = self.episodes[index]
        by_module: dict = {}
        for agent_id in episode.obs:
            module_id = self._module_of(episode, agent_id)
            by_module.setdefault(module_id, []).append(agent_id)
        actions: dict = {}
        for module_id in sorted(by_module):
            agent_ids = by_module[module_id]
            policy = self.policies[module_id]
            space = policy.spec.observation_space
            flat = spaces_module.flatten_observations(space, [episode.obs[a] for a in agent_ids])
            if random_actions:
                chosen = [policy.spec.action_space.sample() for _ in agent_ids]
                logps = np.zeros(len(agent_ids), dtype=np.float32)
                dist = np.zeros((len(agent_ids), spaces_module.action_dist_size(
                    policy.spec.action_space)), dtype=np.float32)
            else:
                chosen, logps, dist = policy.act(flat, self.rng, explore)
            for row, agent_id in enumerate(agent_ids):
                track = episode.agents.get(agent_id)
                if track is None:
                    track = episode.agents[agent_id] = _AgentTrack(agent_id, module_id)
                    track.total_return += episode.rewards_before_acting.pop(agent_id, 0.0)
                if len(track.obs) == len(track.actions):  # this observation is new
                    track.obs.append(flat[row])
                track.actions.append(chosen[row])
                track.rewards.append(0.0)
                track.logp.append(float(logps[row]))
                track.dist_inputs.append(dist[row])
                actions[agent_id] = env_action(policy.spec.action_space, chosen[row])
        obs, rewards, terminateds, truncateds, _infos = env.step(actions)
        episode.length += 1
        for agent_id, reward in rewards.items():
            track = episode.agents.get(agent_id)
            if track is None:
                episode.rewards_before_acting[agent_id] = \
                    episode.rewards_before_acting.get(agent_id, 0.0) + float(reward)
                continue
            track.rewards[-1] += float(reward)
            track.total_return += float(reward)
        for agent_id, agent_obs in obs.items():
            track = episode.agents.get(agent_id)
            if track is not None and track.waiting_for_obs():
                space = self.policies[track.module_id].spec.observation_space
                track.obs.append(spaces_module.flatten_observations(space, [agent_obs])[0])
        for agent_id, flag in terminateds.items():
            if agent_id != "__all__" and flag and agent_id in episode.agents:
                episode.agents[agent_id].terminated = True
        for agent_id, flag in truncateds.items():
            if agent_id != "__all__" and flag and agent_id in episode.agents:
                episode.agents[agent_id].truncated = True
        # Agents that are done leave the observation dict for good.
        done_agents = {a for a, t in episode.agents.items() if t.terminated or t.truncated}
        episode.obs = {a: o for a, o in obs.items() if a not in done_agents}
        all_done = bool(terminateds.get("__all__")) or bool(truncateds.get("__all__"))
        if episode.length >= STEPS_PER_EPISODE_MAX:
            all_done = True
        if not all_done:
            return None, len(actions)
        all_terminated = bool(terminateds.get("__all__"))
        episode_chunks = []
        for agent_id in sorted(episode.agents, key=str):
            track = episode.agents[agent_id]
            if track.actions:
                chunk = track.chunk(episode.eps_id, all_terminated)
                chunk["module_id"] = track.module_id
                episode_chunks.append(chunk)
        module_returns: dict = {}
        for track in episode.agents.values():
            module_returns[track.module_id] = module_returns.get(track.module_id, 0.0) + \
                track.total_return
        stats = {"return": sum(t.total_return for t in episode.agents.values()),
                 "length": episode.length, "module_returns": module_returns,
                 "agent_returns": {str(a): t.total_return for a, t in episode.agents.items()}}
        self._reset(index)
        return (episode_chunks, stats), len(actions)
