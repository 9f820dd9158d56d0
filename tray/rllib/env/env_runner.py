"""The EnvRunner: an actor that holds environments and samples them with
the current policy weights.

One runner steps ``num_envs_per_env_runner`` copies of the env in lockstep
(one batched forward pass per step for all of them). A call to
``sample()`` returns trajectory *chunks*: for each env, the stretch of its
current episode stepped during the call, with the observation after the
last step (for the learner's bootstrap value) and whether the episode
terminated, was truncated, or was merely cut by the call's end. Episodes
run on across calls in ``"truncate_episodes"`` mode (RLlib's default);
``"complete_episodes"`` returns only finished episodes, keeping the ones in
progress for the next call.

Weights arrive as ``[ref]`` (a list, so that the runtime does not resolve
the ref on every call) with a version number; the runner fetches them only
when the version is new, so a broadcast costs one ``put`` by the driver
and one fetch per runner per iteration.

Determinism: a runner's randomness (action sampling, env seeds) comes from
``numpy.random.default_rng([seed, worker_index])``; ids of episodes are
``"<worker>-<env>-<count>"``. A restarted runner starts over from the same
seeds: it replays its own first episodes, which is deterministic, and RL
does not mind."""

from __future__ import annotations

import numpy as np

from tray.rllib.core.rl_module import DEFAULT_MODULE_ID, NumpyPolicy, env_action

from ..utils import spaces as spaces_module
from ..utils.packing import unpack
from .registry import make_env

BATCH_MODES = ("truncate_episodes", "complete_episodes")
EPISODES_PER_CALL_MAX = 100_000  # bounds an evaluation call that asks for too much


def _get(value):
    """A boxed ref or value (``[ref]``) as its value."""
    if isinstance(value, list) and len(value) == 1:
        value = value[0]
    try:
        import tray
        from tray import ObjectRef
    except ImportError:  # pragma: no cover - tray is always importable here
        return value
    return tray.get(value) if isinstance(value, ObjectRef) else value


class _Track:
    """One env's episode in progress, and the chunk of it sampled so far."""

    def __init__(self, eps_id: str, obs_flat: np.ndarray) -> None:
        self.eps_id = eps_id
        self.length = 0
        self.total_return = 0.0
        self.new_chunk(obs_flat)

    def new_chunk(self, obs_flat: np.ndarray) -> None:
        self.t_started = self.length
        self.obs = [obs_flat]
        self.actions, self.rewards, self.logp, self.dist_inputs = [], [], [], []

    def chunk(self, terminated: bool, truncated: bool) -> dict:
        return {"eps_id": self.eps_id, "t_started": self.t_started,
                "obs": np.stack(self.obs).astype(np.float32),
                "actions": np.asarray(self.actions),
                "rewards": np.asarray(self.rewards, dtype=np.float32),
                "action_logp": np.asarray(self.logp, dtype=np.float32),
                "action_dist_inputs": np.stack(self.dist_inputs).astype(np.float32)
                if self.dist_inputs else np.zeros((0, 0), dtype=np.float32),
                "terminated": bool(terminated), "truncated": bool(truncated)}


class SingleAgentEnvRunner:
    """Samples ``num_envs_per_env_runner`` gymnasium envs with a numpy policy."""

    def __init__(self, config, worker_index: int = 0, num_workers: int = 0,
                 module_spec=None, evaluation: bool = False) -> None:
        config, module_spec = unpack(config), unpack(module_spec)
        self.config = config
        self.worker_index = worker_index
        self.evaluation = evaluation
        self.num_envs = int(config.num_envs_per_env_runner)
        seed = config.seed if config.seed is not None else 0
        base = [seed & 0xFFFFFFFF, worker_index, 1 if evaluation else 0]
        self.rng = np.random.default_rng(base)
        self.envs = [make_env(config.env, config.env_config, worker_index=worker_index,
                              num_workers=num_workers, vector_index=i)
                     for i in range(self.num_envs)]
        self.observation_space = self.envs[0].observation_space
        self.action_space = self.envs[0].action_space
        spaces_module.check_observation_space(self.observation_space)
        spaces_module.check_action_space(self.action_space)
        self.spec = module_spec
        self.policy = NumpyPolicy(module_spec) if module_spec is not None else None
        self.weights_version = -1
        self.env_seeds = [int(np.random.default_rng([*base, 2, i]).integers(2**31))
                          for i in range(self.num_envs)]
        self.episodes_started = 0
        self.tracks: list[_Track | None] = [None] * self.num_envs
        self.env_steps_lifetime = 0
        self.writer = None
        if config.output and not evaluation:
            from ..offline.io import OfflineWriter

            self.writer = OfflineWriter(config.output, config.output_format, worker_index,
                                        incarnation=f"-{_incarnation()}")

    # -------------------------------------------------------------- public

    def ping(self) -> str:
        return "pong"

    def apply(self, fn, *args):
        """``fn(self, *args)``: EnvRunnerGroup.foreach_env_runner's way in."""
        return fn(self, *args)

    def get_spaces(self) -> dict:
        return {DEFAULT_MODULE_ID: (self.observation_space, self.action_space)}

    def set_weights(self, weights, version: int) -> None:
        if version != self.weights_version:
            weights = _get(weights)
            if isinstance(weights, dict) and DEFAULT_MODULE_ID in weights:
                weights = weights[DEFAULT_MODULE_ID]
            self.policy.set_weights(weights)
            self.weights_version = version

    def sample(self, weights=None, version: int = 0, *, num_timesteps: int | None = None,
               num_episodes: int | None = None, explore: bool | None = None,
               random_actions: bool = False, force_reset: bool = False,
               epsilon: float | None = None) -> dict:
        """Step the envs for ``num_timesteps`` env steps in all (rounded up
        to a multiple of the number of envs) or until ``num_episodes``
        episodes finish; return chunks and finished-episode statistics."""
        if weights is not None:
            self.set_weights(weights, version)
        if not random_actions and (self.policy is None or self.policy.weights is None):
            raise ValueError("this env runner has no weights yet: pass weights to sample() or "
                             "use random_actions=True")
        if (num_timesteps is None) == (num_episodes is None):
            raise ValueError("sample() takes exactly one of num_timesteps and num_episodes")
        explore = self.config.explore if explore is None else explore
        complete = self.config.batch_mode == "complete_episodes" or num_episodes is not None
        if force_reset or num_episodes is not None:
            self.tracks = [None] * self.num_envs
        for index in range(self.num_envs):
            if self.tracks[index] is None:
                self._reset(index)
        chunks: list[dict] = []
        episodes: list[dict] = []
        steps = 0
        steps_in_finished = 0
        target_steps = num_timesteps if num_timesteps is not None else 0
        steps_per_env = -(-target_steps // self.num_envs) if not complete else 0
        while True:
            if num_episodes is not None:
                if len(episodes) >= min(num_episodes, EPISODES_PER_CALL_MAX):
                    break
            elif complete:
                if steps_in_finished >= target_steps:
                    break
            elif steps >= steps_per_env * self.num_envs:
                break
            for _index, finished in self._step(explore, random_actions, epsilon):
                chunks.append(finished[0])
                episodes.append(finished[1])
                steps_in_finished += finished[1]["length"]
            steps += self.num_envs
        if not complete:
            # Cut every episode in progress: its chunk goes to the learner,
            # which bootstraps from the value of the last observation.
            for track in self.tracks:
                if track.actions:
                    chunks.append(track.chunk(terminated=False, truncated=False))
                    track.new_chunk(track.obs[-1])
        if num_episodes is not None:
            self.tracks = [None] * self.num_envs
        self.env_steps_lifetime += steps
        chunks = [c for c in chunks if len(c["rewards"])]
        if self.writer is not None:
            self.writer.write({DEFAULT_MODULE_ID: chunks})
        return {"chunks": {DEFAULT_MODULE_ID: chunks}, "episodes": episodes,
                "env_steps": steps, "agent_steps": steps,
                "weights_version": self.weights_version, "runner_index": self.worker_index}

    def stop(self) -> None:
        for env in self.envs:
            env.close()

    # ------------------------------------------------------------ stepping

    def _reset(self, index: int) -> None:
        seed = self.env_seeds[index]
        self.env_seeds[index] = None  # seed once; later resets continue the env's RNG
        obs, _info = self.envs[index].reset(seed=seed)
        eps_id = f"{self.worker_index}-{index}-{self.episodes_started}"
        self.episodes_started += 1
        self.tracks[index] = _Track(eps_id, self._flat([obs])[0])

    def _flat(self, observations) -> np.ndarray:
        return spaces_module.flatten_observations(self.observation_space, observations)

    def _step(self, explore: bool, random_actions: bool, epsilon: float | None = None):
        obs = np.stack([track.obs[-1] for track in self.tracks])
        if random_actions:
            actions = self._random_actions(len(self.tracks))
            logp = np.zeros(len(self.tracks), dtype=np.float32)
            dist_inputs = np.zeros((len(self.tracks), spaces_module.action_dist_size(
                self.action_space)), dtype=np.float32)
        else:
            actions, logp, dist_inputs = self.policy.act(obs, self.rng, explore, epsilon)
        finished = []
        for index, track in enumerate(self.tracks):
            new_obs, reward, terminated, truncated, _info = self.envs[index].step(
                env_action(self.action_space, actions[index]))
            track.actions.append(actions[index])
            track.rewards.append(float(reward))
            track.logp.append(logp[index])
            track.dist_inputs.append(dist_inputs[index])
            track.obs.append(self._flat([new_obs])[0])
            track.length += 1
            track.total_return += float(reward)
            if terminated or truncated:
                chunk = track.chunk(terminated, truncated)
                stats = {"return": track.total_return, "length": track.length,
                         "module_returns": {DEFAULT_MODULE_ID: track.total_return},
                         "agent_returns": {"default_agent": track.total_return}}
                finished.append((index, (chunk, stats)))
                self._reset(index)
        return finished

    def _random_actions(self, count: int) -> np.ndarray:
        space = self.action_space
        if spaces_module.is_discrete(space):
            return self.rng.integers(0, int(space.n), size=count)
        low = np.where(np.isfinite(space.low), space.low, -1.0)
        high = np.where(np.isfinite(space.high), space.high, 1.0)
        return self.rng.uniform(low, high, size=(count, *space.shape)).astype(np.float32)


def _incarnation() -> str:
    """Tells a restarted runner's output files from its predecessor's: the
    actor's id and a counter of constructions in this process."""
    global _CONSTRUCTED
    _CONSTRUCTED += 1
    try:
        import tray

        actor_id = tray.get_runtime_context().get_actor_id() or "driver"
    except Exception:  # noqa: BLE001 - outside a tray process
        actor_id = "local"
    return f"{str(actor_id)[:8]}{_CONSTRUCTED}"


_CONSTRUCTED = 0
