"""Hyperparameter search with ``wait`` (Ray 0.1 docs, "Hyperparameter
Optimization"), on the core API: random search that processes results as
they finish, then the adaptive variant that trains in segments and keeps
only the promising experiments. (tray.tune packages the same ideas:
examples/hyperparameter_search.py.)

The "network" is a two-layer perceptron in numpy on a synthetic two-moons
dataset, put once in the object store; each experiment is a task.

    python examples/hyperopt_wait.py [--sim] [--trials 12] [--segments 6]
"""

import argparse

import numpy as np

import tray


def make_data(samples: int, seed: int):
    rng = np.random.default_rng(seed)
    angles = rng.uniform(0, np.pi, samples)
    labels = rng.integers(0, 2, samples)
    xs = np.stack([np.cos(angles) + labels, np.sin(angles) * (1 - 2 * labels) + 0.5 * labels], 1)
    return xs + 0.15 * rng.standard_normal(xs.shape), labels


def init_model(hyperparameters, seed: int):
    rng = np.random.default_rng(seed)
    hidden = hyperparameters["hidden"]
    return {"W1": rng.standard_normal((2, hidden)) * hyperparameters["stddev"],
            "b1": np.zeros(hidden), "W2": rng.standard_normal(hidden) * 0.1, "b2": 0.0}


def predict(model, xs):
    hidden = np.tanh(xs @ model["W1"] + model["b1"])
    return 1.0 / (1.0 + np.exp(-(hidden @ model["W2"] + model["b2"]))), hidden


@tray.remote
def train_and_evaluate(hyperparameters, data, model=None, steps=200, seed=0):
    """Train (more) and return (validation accuracy, the model)."""
    train_x, train_y, valid_x, valid_y = data
    model = dict(model) if model is not None else init_model(hyperparameters, seed)
    rng = np.random.default_rng(seed)
    lr, batch = hyperparameters["learning_rate"], hyperparameters["batch_size"]
    for _ in range(steps):
        rows = rng.integers(0, len(train_y), batch)
        xs, ys = train_x[rows], train_y[rows]
        p, hidden = predict(model, xs)
        error = (p - ys) / batch
        d_hidden = np.outer(error, model["W2"]) * (1 - hidden ** 2)
        model["W2"] = model["W2"] - lr * hidden.T @ error
        model["b2"] = model["b2"] - lr * error.sum()
        model["W1"] = model["W1"] - lr * xs.T @ d_hidden
        model["b1"] = model["b1"] - lr * d_hidden.sum(0)
    accuracy = float(((predict(model, valid_x)[0] > 0.5) == valid_y).mean())
    return accuracy, model


def generate_hyperparameters(rng):
    return {"learning_rate": 10 ** rng.uniform(-3, 0.5), "batch_size": int(rng.integers(8, 64)),
            "hidden": int(rng.integers(2, 32)), "stddev": 10 ** rng.uniform(-2, 0.5)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sim", action="store_true", help="run on a simulated cluster")
    parser.add_argument("--trials", type=int, default=12)
    parser.add_argument("--segments", type=int, default=6)
    args = parser.parse_args()
    tray.init(backend="sim", seed=0, num_cpus=4) if args.sim else tray.init()
    rng = np.random.default_rng(0)
    train_x, train_y = make_data(1000, seed=1)
    valid_x, valid_y = make_data(500, seed=2)
    data = tray.put((train_x, train_y, valid_x, valid_y))  # once, for every experiment

    # Random search, processing results as they become available.
    remaining = {}
    for trial in range(4):
        hp = generate_hyperparameters(rng)
        remaining[train_and_evaluate.remote(hp, data, seed=trial)] = hp
    best = (0.0, None)
    for trial in range(4, 4 + args.trials):
        [ready], _ = tray.wait(list(remaining), num_returns=1)
        hp = remaining.pop(ready)
        accuracy, _model = tray.get(ready)
        best = max(best, (accuracy, trial), key=lambda pair: pair[0])
        hp_new = generate_hyperparameters(rng)  # start a new experiment at once
        remaining[train_and_evaluate.remote(hp_new, data, seed=trial)] = hp_new
    for accuracy, _model in tray.get(list(remaining)):
        best = max(best, (accuracy, -1), key=lambda pair: pair[0])
    print(f"random search: {args.trials + 4} experiments, best validation accuracy "
          f"{best[0]:.3f}")

    # Adaptive: train in segments; continue the promising, replace the others.
    running = {}
    for trial in range(4):
        hp = generate_hyperparameters(rng)
        running[train_and_evaluate.remote(hp, data, steps=100, seed=trial)] = (hp, 1)
    best_accuracy, segments_done = 0.0, 0
    for trial in range(args.segments * 4):
        [ready], _ = tray.wait(list(running), num_returns=1)
        hp, segment = running.pop(ready)
        accuracy, model = tray.get(ready)
        segments_done += 1
        best_accuracy = max(best_accuracy, accuracy)
        if accuracy >= 0.8 * best_accuracy and segment < args.segments:
            ref = train_and_evaluate.remote(hp, data, model=model, steps=100, seed=trial)
            running[ref] = (hp, segment + 1)
        else:
            hp = generate_hyperparameters(rng)
            running[train_and_evaluate.remote(hp, data, steps=100, seed=100 + trial)] = (hp, 1)
    tray.get(list(running))
    print(f"adaptive search: {segments_done} segments, best validation accuracy "
          f"{best_accuracy:.3f}")
    tray.shutdown()


if __name__ == "__main__":
    main()
