"""A parameter server (Ray's classic example): an actor holds the model's
weights, workers compute gradients on their data shards and push them.

Synchronous: every step, the driver gets the weights from the server once
(one ref for all workers), each worker returns a gradient, and the server
applies their average. Asynchronous: each worker loops on its own, pulling
the current weights from the server and pushing its gradient, with no
barrier; the server applies gradients in the order they arrive. The model
is logistic regression on a synthetic two-class problem, in numpy.

    python examples/parameter_server.py [--sim] [--workers 4] [--steps 50]
"""

import argparse

import numpy as np

import tray

FEATURES = 20


def make_data(samples: int, seed: int):
    rng = np.random.default_rng(seed)
    true_weights = np.random.default_rng(99).standard_normal(FEATURES)
    xs = rng.standard_normal((samples, FEATURES))
    ys = (xs @ true_weights + 0.5 * rng.standard_normal(samples) > 0).astype(np.float64)
    return xs, ys


def gradient(weights, xs, ys):
    predictions = 1.0 / (1.0 + np.exp(-(xs @ weights)))
    return xs.T @ (predictions - ys) / len(ys)


def accuracy(weights, xs, ys):
    return float((((xs @ weights) > 0) == (ys > 0.5)).mean())


@tray.remote
class ParameterServer:
    def __init__(self, learning_rate: float):
        self.weights = np.zeros(FEATURES)
        self.learning_rate = learning_rate
        self.updates = 0

    def apply_gradients(self, *gradients):
        self.weights = self.weights - self.learning_rate * np.mean(gradients, axis=0)
        self.updates += 1
        return self.weights

    def get_weights(self):
        return self.weights

    def num_updates(self):
        return self.updates


@tray.remote
class DataWorker:
    def __init__(self, seed: int):
        self.xs, self.ys = make_data(500, seed)

    def compute_gradient(self, weights):
        return gradient(weights, self.xs, self.ys)

    def train_async(self, server, steps: int):
        """Pull, compute, push, ``steps`` times, without waiting for anyone."""
        for _ in range(steps):
            weights = tray.get(server.get_weights.remote())
            tray.get(server.apply_gradients.remote(self.compute_gradient(weights)))
        return steps


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sim", action="store_true", help="run on a simulated cluster")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--steps", type=int, default=50)
    args = parser.parse_args()
    tray.init(backend="sim", seed=0, num_cpus=8) if args.sim else tray.init()
    test_xs, test_ys = make_data(2000, seed=1000)

    server = ParameterServer.remote(learning_rate=0.5)
    workers = [DataWorker.remote(seed) for seed in range(args.workers)]
    weights = server.get_weights.remote()
    for _ in range(args.steps):
        gradients = [worker.compute_gradient.remote(weights) for worker in workers]
        weights = server.apply_gradients.remote(*gradients)  # refs in, a ref out: no get
    print(f"synchronous: {args.steps} steps, test accuracy "
          f"{accuracy(tray.get(weights), test_xs, test_ys):.3f}")

    server = ParameterServer.remote(learning_rate=0.5)
    done = tray.get([worker.train_async.remote(server, args.steps) for worker in workers])
    updates = tray.get(server.num_updates.remote())
    print(f"asynchronous: {sum(done)} gradients pushed, {updates} updates applied, test accuracy "
          f"{accuracy(tray.get(server.get_weights.remote()), test_xs, test_ys):.3f}")
    tray.shutdown()


if __name__ == "__main__":
    main()
