"""Batch L-BFGS (Ray 0.1 docs, "Batch L-BFGS"): scipy's optimizer drives,
the loss and gradient are computed in parallel over data shards held as
refs.

The data (a synthetic 10-class classification problem standing in for
MNIST, which is not downloadable here) is split into shards, each ``put``
into the object store once; every call to a ``Network`` actor passes the
refs of one shard, which the worker reads from the store (on one machine
without copying). ``full_loss(theta)`` and ``full_grad(theta)`` put
``theta`` once and sum the shards' results, so to scipy they are plain
functions while the work happens on the actors. The model is softmax
regression.

    python examples/lbfgs.py [--sim] [--shards 4] [--samples 4000] [--iterations 50]
"""

import argparse

import numpy as np
import scipy.optimize

import tray

CLASSES, FEATURES = 10, 32


def make_data(samples: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    centers = rng.standard_normal((CLASSES, FEATURES)) * 0.4  # classes overlap
    labels = rng.integers(0, CLASSES, samples)
    xs = centers[labels] + rng.standard_normal((samples, FEATURES))
    return xs, labels


def loss_and_grad(theta, xs, ys):
    weights = theta.reshape(FEATURES + 1, CLASSES)
    logits = xs @ weights[:-1] + weights[-1]
    logits -= logits.max(axis=1, keepdims=True)
    logp = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
    loss = -logp[np.arange(len(ys)), ys].sum()
    probabilities = np.exp(logp)
    probabilities[np.arange(len(ys)), ys] -= 1.0
    grad = np.vstack([xs.T @ probabilities, probabilities.sum(axis=0)])
    return loss, grad.ravel()


@tray.remote
class Network:
    def loss(self, theta, xs, ys):
        return loss_and_grad(theta, xs, ys)[0]

    def grad(self, theta, xs, ys):
        return loss_and_grad(theta, xs, ys)[1]

    def correct(self, theta, xs, ys):
        weights = theta.reshape(FEATURES + 1, CLASSES)
        return int(((xs @ weights[:-1] + weights[-1]).argmax(axis=1) == ys).sum())


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sim", action="store_true", help="run on a simulated cluster")
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--samples", type=int, default=4000)
    parser.add_argument("--iterations", type=int, default=50)
    args = parser.parse_args()
    tray.init(backend="sim", seed=0, num_cpus=4) if args.sim else tray.init()

    xs, ys = make_data(args.samples)
    batch_ids = [(tray.put(x), tray.put(y))
                 for x, y in zip(np.array_split(xs, args.shards), np.array_split(ys, args.shards),
                                 strict=True)]
    actors = [Network.remote() for _ in batch_ids]
    shards = list(zip(actors, batch_ids, strict=True))

    def full_loss(theta):
        theta_id = tray.put(theta)  # once, not once per actor
        return sum(tray.get([actor.loss.remote(theta_id, x_id, y_id)
                             for actor, (x_id, y_id) in shards])) / args.samples

    def full_grad(theta):
        theta_id = tray.put(theta)
        grads = tray.get([actor.grad.remote(theta_id, x_id, y_id)
                          for actor, (x_id, y_id) in shards])
        return (sum(grads) / args.samples).astype("float64")  # fmin_l_bfgs_b wants float64

    dimension = (FEATURES + 1) * CLASSES
    theta_init = 1e-2 * np.random.default_rng(1).standard_normal(dimension)
    print(f"initial loss {full_loss(theta_init):.4f}")
    theta, final_loss, info = scipy.optimize.fmin_l_bfgs_b(
        full_loss, theta_init, fprime=full_grad, maxiter=args.iterations)
    theta_id = tray.put(theta)
    accuracy = sum(tray.get([actor.correct.remote(theta_id, x_id, y_id)
                             for actor, (x_id, y_id) in shards])) / args.samples
    print(f"final loss {final_loss:.4f} after {info['nit']} iterations "
          f"({info['funcalls']} loss/gradient evaluations); training accuracy {accuracy:.3f}")
    tray.shutdown()


if __name__ == "__main__":
    main()
