"""Policy gradients with rollout actors (Ray 0.1 docs, "Policy Gradient
Methods"), written against the core API: REINFORCE with a linear softmax
policy on CartPole, in numpy.

The driver puts the policy's weights in the object store once per batch
(one ``put``, shared by every actor), each rollout actor plays one episode
with them and returns the episode's gradient and return, and the driver
averages the gradients and takes an Adam step. tray.rllib's ``PG`` and
``PPO`` are the library form of this loop.

    python examples/policy_gradient.py [--sim] [--workers 4] [--batches 30]
"""

import argparse

import gymnasium
import numpy as np

import tray

GAMMA = 0.99


def policy_probabilities(weights, observation):
    logits = weights @ observation
    logits -= logits.max()
    probabilities = np.exp(logits)
    return probabilities / probabilities.sum()


@tray.remote
class RolloutWorker:
    def __init__(self, seed: int):
        self.env = gymnasium.make("CartPole-v1")
        self.env.reset(seed=seed)
        self.rng = np.random.default_rng(seed)

    def compute_gradient(self, weights):
        """Play one episode; return d(sum_t logp(a_t|s_t) * G_t)/dW and the return."""
        observation, _ = self.env.reset()
        observations, actions, rewards = [], [], []
        done = False
        while not done:
            probabilities = policy_probabilities(weights, observation)
            action = int(self.rng.choice(len(probabilities), p=probabilities))
            observations.append(observation)
            actions.append(action)
            observation, reward, terminated, truncated, _ = self.env.step(action)
            rewards.append(reward)
            done = terminated or truncated
        returns = np.zeros(len(rewards))
        running = 0.0
        for t in reversed(range(len(rewards))):
            running = rewards[t] + GAMMA * running
            returns[t] = running
        returns = (returns - returns.mean()) / (returns.std() + 1e-8)
        gradient = np.zeros_like(weights)
        for observation, action, advantage in zip(observations, actions, returns, strict=True):
            probabilities = policy_probabilities(weights, observation)
            one_hot = np.eye(len(probabilities))[action]
            gradient += advantage * np.outer(one_hot - probabilities, observation)
        return gradient, float(sum(rewards))


class Adam:
    def __init__(self, shape, lr=0.05):
        self.lr, self.m, self.v, self.t = lr, np.zeros(shape), np.zeros(shape), 0

    def ascend(self, weights, gradient):
        self.t += 1
        self.m = 0.9 * self.m + 0.1 * gradient
        self.v = 0.999 * self.v + 0.001 * gradient ** 2
        m_hat, v_hat = self.m / (1 - 0.9 ** self.t), self.v / (1 - 0.999 ** self.t)
        return weights + self.lr * m_hat / (np.sqrt(v_hat) + 1e-8)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sim", action="store_true", help="run on a simulated cluster")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--batches", type=int, default=30)
    args = parser.parse_args()
    tray.init(backend="sim", seed=0, num_cpus=4) if args.sim else tray.init()

    weights = np.zeros((2, 4))
    optimizer = Adam(weights.shape)
    workers = [RolloutWorker.remote(seed) for seed in range(args.workers)]
    first = None
    for batch in range(args.batches):
        weights_ref = tray.put(weights)  # one copy, read by every worker
        results = tray.get([w.compute_gradient.remote(weights_ref) for w in workers])
        gradient = np.mean([g for g, _ in results], axis=0)
        weights = optimizer.ascend(weights, gradient)
        mean_return = float(np.mean([r for _, r in results]))
        first = mean_return if first is None else first
        if batch % 5 == 0 or batch == args.batches - 1:
            print(f"batch {batch}: mean return {mean_return:.1f}")
    print(f"mean return went from {first:.1f} to {mean_return:.1f}")
    tray.shutdown()


if __name__ == "__main__":
    main()
