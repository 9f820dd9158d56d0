"""The seed docs' hyperparameter search (Ray 0.1, "Hyperparameter
Optimization"), redone with tray.tune.

In 2017 the example launched ``train_cnn_and_compute_accuracy.remote(...)``
for random hyperparameters, processed accuracies with ``ray.wait`` as they
finished, and in its adaptive variant trained in segments and dropped the
poorly performing models. Tune does all of that: the search space replaces
``generate_hyperparameters()``, ``with_parameters`` replaces the
``ray.put`` of the dataset, each ``tune.report`` is the end of a segment,
and ASHA is the "aggressively terminate" policy.

The model is a small two-layer network in NumPy on a synthetic two-rings
dataset (no TensorFlow download needed). ``--sim`` runs it on a simulated
cluster (deterministic: the same best trial every run).

    python examples/hyperparameter_search.py [--sim] [--trials 20] [--segments 10]
"""

import argparse
import tempfile

import numpy as np

import tray
from tray import tune


def make_data(n: int, seed: int):
    """Two noisy concentric rings: label 1 is the outer one."""
    rng = np.random.default_rng(seed)
    label = rng.integers(0, 2, n)
    angle = rng.uniform(0, 2 * np.pi, n)
    radius = np.where(label == 1, 1.0, 0.5) + rng.normal(0, 0.1, n)
    x = np.stack([radius * np.cos(angle), radius * np.sin(angle)], axis=1)
    return x, label


def train_network(config, train_images=None, train_labels=None, validation_images=None,
                  validation_labels=None):
    """Train for ``segments`` segments, reporting validation accuracy after each."""
    rng = np.random.default_rng(int(config["seed"]))
    hidden = 32
    w1 = rng.normal(0, config["stddev"], (2, hidden))
    b1 = np.zeros(hidden)
    w2 = rng.normal(0, config["stddev"], (hidden, 1))
    b2 = np.zeros(1)
    lr, batch = config["learning_rate"], int(config["batch_size"])
    keep = 1.0 - config["dropout"]
    for _segment in range(config["segments"]):
        for _ in range(config["steps_per_segment"]):
            idx = rng.integers(0, len(train_images), batch)
            x, y = train_images[idx], train_labels[idx][:, None]
            h = np.tanh(x @ w1 + b1)
            mask = (rng.random(h.shape) < keep) / keep
            logits = np.clip((h * mask) @ w2 + b2, -30, 30)
            grad_out = (1.0 / (1.0 + np.exp(-logits)) - y) / batch
            grad_h = (grad_out @ w2.T) * mask * (1 - h ** 2)
            w2 -= lr * ((h * mask).T @ grad_out)
            b2 -= lr * grad_out.sum(axis=0)
            w1 -= lr * (x.T @ grad_h)
            b1 -= lr * grad_h.sum(axis=0)
        h = np.tanh(validation_images @ w1 + b1)
        accuracy = float(np.mean(((h @ w2 + b2)[:, 0] > 0) == (validation_labels == 1)))
        tune.report({"accuracy": accuracy})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sim", action="store_true", help="run on a simulated cluster")
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--segments", type=int, default=10)
    parser.add_argument("--steps-per-segment", type=int, default=50)
    args = parser.parse_args()
    if args.sim:
        tray.init(backend="sim", num_nodes=2, num_cpus=4, seed=7)
    else:
        tray.init()

    train_images, train_labels = make_data(2000, seed=0)
    validation_images, validation_labels = make_data(500, seed=1)
    trainable = tune.with_parameters(  # the dataset goes into the object store once
        train_network, train_images=train_images, train_labels=train_labels,
        validation_images=validation_images, validation_labels=validation_labels)
    # generate_hyperparameters(), as a search space.
    param_space = {
        "learning_rate": tune.loguniform(1e-3, 10.0),
        "batch_size": tune.randint(1, 100),
        "dropout": tune.uniform(0.0, 0.5),
        "stddev": tune.loguniform(1e-2, 10.0),
        "seed": tune.randint(0, 10_000),
        "segments": args.segments,
        "steps_per_segment": args.steps_per_segment,
    }
    tuner = tune.Tuner(
        trainable, param_space=param_space,
        tune_config=tune.TuneConfig(
            metric="accuracy", mode="max", num_samples=args.trials,
            search_alg=tune.search.BasicVariantGenerator(random_state=42),
            scheduler=tune.schedulers.ASHAScheduler(max_t=args.segments, grace_period=1,
                                                    reduction_factor=3)),
        run_config=tune.RunConfig(name="hyperparameter_search",
                                  storage_path=tempfile.mkdtemp(prefix="tray-tune-"),
                                  verbose=1, progress_interval_s=30))
    results = tuner.fit()
    best = results.get_best_result()
    print(f"best accuracy: {best.metrics['accuracy']:.3f} after "
          f"{best.metrics['training_iteration']} segments")
    print("best hyperparameters:", {k: (round(v, 4) if isinstance(v, float) else v)
                                    for k, v in best.config.items()})
    stopped = sum(1 for r in results if r.metrics["training_iteration"] < args.segments)
    print(f"{len(results)} trials, {stopped} stopped early by ASHA")
    tray.shutdown()


if __name__ == "__main__":
    main()
