"""A gym environment held in an actor (Ray 0.1 docs, "Actors": the
``GymEnvironment`` example), with today's gymnasium.

Each actor owns one environment, constructed on its worker; its state (the
simulator) lives there between calls, and calls from the driver run in
order. Two actors step two environments in parallel.

    python examples/gym_actor.py [--sim] [--env CartPole-v1] [--steps 50]
"""

import argparse

import gymnasium
import numpy as np

import tray


@tray.remote
class GymEnvironment:
    def __init__(self, name: str, seed: int):
        self.env = gymnasium.make(name)
        self.observation, _ = self.env.reset(seed=seed)
        self.total_reward = 0.0
        self.episodes = 0

    def step(self, action):
        self.observation, reward, terminated, truncated, _ = self.env.step(action)
        self.total_reward += reward
        if terminated or truncated:
            self.episodes += 1
            self.observation, _ = self.env.reset()
        return self.observation

    def stats(self):
        return {"total_reward": self.total_reward, "episodes": self.episodes}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sim", action="store_true", help="run on a simulated cluster")
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--steps", type=int, default=50)
    args = parser.parse_args()
    tray.init(backend="sim", seed=0) if args.sim else tray.init()

    a1 = GymEnvironment.remote(args.env, seed=1)
    a2 = GymEnvironment.remote(args.env, seed=2)
    rng = np.random.default_rng(0)
    for _ in range(args.steps):
        # Both actors step at once; the driver waits for the pair.
        tray.get([a1.step.remote(int(rng.integers(2))), a2.step.remote(int(rng.integers(2)))])
    for name, actor in (("env 1", a1), ("env 2", a2)):
        stats = tray.get(actor.stats.remote())
        print(f"{name}: {args.steps} steps, {stats['episodes']} episode(s) finished, "
              f"total reward {stats['total_reward']:.0f}")
    tray.shutdown()


if __name__ == "__main__":
    main()
