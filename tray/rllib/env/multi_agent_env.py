"""RLlib's MultiAgentEnv API (the new stack's form).

``reset()`` returns ``(obs, infos)`` and ``step(actions)`` returns ``(obs,
rewards, terminateds, truncateds, infos)``, each a dict keyed by agent id;
``terminateds``/``truncateds`` carry ``"__all__"`` for the whole episode.
An agent acts at a step when its id is in the last observation dict; its
reward is what ``rewards`` says for it until it observes again (so
turn-based games work). ``observation_spaces``/``action_spaces`` are dicts
by agent id (``get_observation_space(agent_id)`` reads them)."""

from __future__ import annotations


class MultiAgentEnv:
    """Base class for environments with several agents."""

    observation_spaces: dict = None
    action_spaces: dict = None
    possible_agents: list = []
    agents: list = []

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        raise NotImplementedError

    def step(self, action_dict: dict):
        raise NotImplementedError

    def get_observation_space(self, agent_id):
        if not self.observation_spaces or agent_id not in self.observation_spaces:
            raise ValueError(f"{type(self).__name__} has no observation space for agent "
                             f"{agent_id!r}: set self.observation_spaces = {{agent_id: space}}")
        return self.observation_spaces[agent_id]

    def get_action_space(self, agent_id):
        if not self.action_spaces or agent_id not in self.action_spaces:
            raise ValueError(f"{type(self).__name__} has no action space for agent "
                             f"{agent_id!r}: set self.action_spaces = {{agent_id: space}}")
        return self.action_spaces[agent_id]

    def close(self) -> None:
        pass


class MultiAgentCartPole(MultiAgentEnv):
    """``num_agents`` independent CartPoles in one env, agent ids 0..n-1 (as
    RLlib's example env of the same name); the episode ends when every pole
    has fallen or been truncated."""

    def __init__(self, config: dict | None = None) -> None:
        import gymnasium

        config = config or {}
        count = int(config.get("num_agents", 2))
        self.envs = [gymnasium.make("CartPole-v1") for _ in range(count)]
        self.possible_agents = list(range(count))
        self.agents = list(self.possible_agents)
        self.observation_spaces = {i: env.observation_space for i, env in enumerate(self.envs)}
        self.action_spaces = {i: env.action_space for i, env in enumerate(self.envs)}
        self._done: set = set()

    def reset(self, *, seed=None, options=None):
        self._done = set()
        self.agents = list(self.possible_agents)
        obs, infos = {}, {}
        for i, env in enumerate(self.envs):
            obs[i], infos[i] = env.reset(seed=None if seed is None else seed + i)
        return obs, infos

    def step(self, action_dict):
        obs, rewards, terminateds, truncateds, infos = {}, {}, {}, {}, {}
        for i in sorted(action_dict):
            o, r, term, trunc, info = self.envs[i].step(action_dict[i])
            obs[i], rewards[i], terminateds[i], truncateds[i], infos[i] = o, r, term, trunc, info
            if term or trunc:
                self._done.add(i)
        self.agents = [i for i in self.possible_agents if i not in self._done]
        # The per-agent flags say whether each agent's ending was terminal;
        # "__all__" only says that the episode is over.
        terminateds["__all__"] = len(self._done) == len(self.possible_agents)
        truncateds["__all__"] = False
        return obs, rewards, terminateds, truncateds, infos
