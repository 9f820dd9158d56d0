"""Asynchronous advantage actor-critic (Ray 0.1 docs, "A3C"): runner actors
compute gradients from short rollouts with the parameters they were given,
and the driver applies each gradient as soon as it arrives.

Each ``Runner`` actor keeps its own CartPole running across calls. The
driver starts one ``compute_gradient`` per runner; then, whenever any one
finishes (``tray.wait(..., num_returns=1)``), it applies that gradient to
the global model and gives that runner the newest parameters to go on with.
No runner waits for the others: this is asynchronous, and a gradient may
be computed with parameters a few updates old. The policy and the critic
are linear, in numpy.

    python examples/a3c.py [--sim] [--workers 4] [--updates 400] [--steps 20]
"""

import argparse

import gymnasium
import numpy as np

import tray

GAMMA = 0.99


def probabilities(theta, observation):
    logits = theta["pi"] @ observation
    logits -= logits.max()
    e = np.exp(logits)
    return e / e.sum()


@tray.remote
class Runner:
    def __init__(self, actor_id: int):
        self.id = actor_id
        self.env = gymnasium.make("CartPole-v1")
        self.observation, _ = self.env.reset(seed=actor_id)
        self.rng = np.random.default_rng(actor_id)
        self.episode_return = 0.0
        self.finished_returns = []

    def compute_gradient(self, theta, steps: int):
        """Up to ``steps`` steps with ``theta``; the n-step actor-critic gradient."""
        observations, actions, rewards = [], [], []
        done = False
        for _ in range(steps):
            p = probabilities(theta, self.observation)
            action = int(self.rng.choice(2, p=p))
            observations.append(self.observation)
            actions.append(action)
            self.observation, reward, terminated, truncated, _ = self.env.step(action)
            rewards.append(reward)
            self.episode_return += reward
            done = terminated or truncated
            if done:
                self.finished_returns.append(self.episode_return)
                self.episode_return = 0.0
                self.observation, _ = self.env.reset()
                break
        bootstrap = 0.0 if done else float(theta["v"] @ self.observation)
        gradient = {"pi": np.zeros_like(theta["pi"]), "v": np.zeros_like(theta["v"])}
        running = bootstrap
        for t in reversed(range(len(rewards))):
            running = rewards[t] + GAMMA * running
            value = float(theta["v"] @ observations[t])
            advantage = running - value
            one_hot = np.eye(2)[actions[t]]
            gradient["pi"] += advantage * np.outer(one_hot - probabilities(theta,
                                                                           observations[t]),
                                                   observations[t])
            gradient["v"] += advantage * observations[t]  # ascent on -(R - V)^2 / 2
        info = {"id": self.id, "size": len(rewards), "returns": self.finished_returns}
        self.finished_returns = []
        return gradient, info


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sim", action="store_true", help="run on a simulated cluster")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--updates", type=int, default=400)
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    tray.init(backend="sim", seed=0, num_cpus=4) if args.sim else tray.init()

    theta = {"pi": np.zeros((2, 4)), "v": np.zeros(4)}
    learning_rate = {"pi": 0.005, "v": 0.005}
    agents = [Runner.remote(i) for i in range(args.workers)]
    in_flight = [agent.compute_gradient.remote(theta, args.steps) for agent in agents]
    returns, steps = [], 0
    for update in range(args.updates):
        [done], in_flight = tray.wait(in_flight, num_returns=1)
        gradient, info = tray.get(done)
        for name in theta:
            theta[name] = theta[name] + learning_rate[name] * gradient[name]
        steps += info["size"]
        returns.extend(info["returns"])
        in_flight.append(agents[info["id"]].compute_gradient.remote(theta, args.steps))
        if (update + 1) % 100 == 0 and returns:
            print(f"update {update + 1}: {steps} steps, mean return of the last 20 episodes "
                  f"{np.mean(returns[-20:]):.1f}")
    tray.get(in_flight)
    print(f"first 20 episodes: {np.mean(returns[:20]):.1f}, last 20: {np.mean(returns[-20:]):.1f}")
    tray.shutdown()


if __name__ == "__main__":
    main()
