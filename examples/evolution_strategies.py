"""Evolution strategies (Ray 0.1 docs, "Evolution Strategies"; Salimans et
al., 2017) with a shared noise table put once.

A task creates one large block of Gaussian noise; its ref goes to every
``Worker`` actor's constructor, so the block lives once in the object
store and every worker reads it (on one machine, without copying) instead
of drawing its own. A perturbation is then just an offset into the table:
workers send back offsets and returns, never noise. Each iteration the
driver puts the policy parameters once, workers evaluate antithetic pairs
``theta +/- sigma * noise``, and the driver moves ``theta`` along the
rank-weighted noise. The policy is linear, on CartPole.

    python examples/evolution_strategies.py [--sim] [--workers 4] [--iterations 20]
"""

import argparse

import gymnasium
import numpy as np

import tray

PARAMETERS = 2 * 4  # linear policy: 2 actions x 4 observations


@tray.remote
def create_shared_noise(size: int, seed: int):
    return np.random.default_rng(seed).standard_normal(size).astype(np.float32)


@tray.remote
class Worker:
    def __init__(self, noise, seed: int, sigma: float):
        self.noise = noise  # the shared table (a read-only view of the stored object)
        self.env = gymnasium.make("CartPole-v1")
        self.env.reset(seed=seed)
        self.rng = np.random.default_rng(seed)
        self.sigma = sigma

    def rollout(self, theta):
        observation, _ = self.env.reset()
        total, done = 0.0, False
        weights = theta.reshape(2, 4)
        while not done:
            action = int(np.argmax(weights @ observation))
            observation, reward, terminated, truncated, _ = self.env.step(action)
            total += reward
            done = terminated or truncated
        return total

    def do_rollouts(self, theta, pairs: int):
        """Returns of ``pairs`` antithetic perturbations: (offsets, [(r+, r-)])."""
        offsets, returns = [], []
        for _ in range(pairs):
            offset = int(self.rng.integers(0, len(self.noise) - PARAMETERS))
            perturbation = self.sigma * self.noise[offset:offset + PARAMETERS]
            returns.append((self.rollout(theta + perturbation), self.rollout(theta - perturbation)))
            offsets.append(offset)
        return offsets, returns


def centered_ranks(values):
    ranks = np.empty(values.size)
    ranks[values.ravel().argsort()] = np.arange(values.size)
    return (ranks / (values.size - 1) - 0.5).reshape(values.shape)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sim", action="store_true", help="run on a simulated cluster")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--pairs", type=int, default=5, help="perturbation pairs per worker")
    parser.add_argument("--noise-size", type=int, default=10_000_000)
    args = parser.parse_args()
    tray.init(backend="sim", seed=0, num_cpus=4) if args.sim else tray.init()

    sigma, learning_rate = 0.1, 0.05
    noise_id = create_shared_noise.remote(args.noise_size, seed=0)
    noise = tray.get(noise_id)  # the driver reads the same table
    workers = [Worker.remote(noise_id, seed, sigma) for seed in range(args.workers)]
    theta = np.zeros(PARAMETERS, dtype=np.float32)
    for iteration in range(args.iterations):
        theta_id = tray.put(theta)  # the current weights, once for all workers
        results = tray.get([w.do_rollouts.remote(theta_id, args.pairs) for w in workers])
        offsets = [o for offs, _ in results for o in offs]
        returns = np.array([r for _, rets in results for r in rets])  # (n, 2)
        ranks = centered_ranks(returns)
        step = sum((ranks[i, 0] - ranks[i, 1]) * noise[o:o + PARAMETERS]
                   for i, o in enumerate(offsets))
        theta = theta + learning_rate / (len(offsets) * sigma) * step
        if iteration % 5 == 0 or iteration == args.iterations - 1:
            print(f"iteration {iteration}: mean return of the perturbed policies "
                  f"{returns.mean():.1f}")
    final = np.mean(tray.get([w.rollout.remote(theta) for w in workers]))
    print(f"return of the final policy: {final:.1f}")
    tray.shutdown()


if __name__ == "__main__":
    main()
