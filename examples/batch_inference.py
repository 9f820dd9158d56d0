"""Batch inference with tray.data: a model (a callable class) on a pool of
actors scores a parquet dataset, streamed within the object store's budget.

    python examples/batch_inference.py          # real processes on this machine
    python examples/batch_inference.py --sim    # a simulated cluster (deterministic)

The "model" is a logistic regression whose weights the constructor loads
once per actor — where a real one would load a checkpoint — so the pool pays
for loading twice, not once per batch."""

import argparse
import os
import tempfile

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

import tray
import tray.data

FEATURES = 4


def write_dataset(directory: str, files: int = 4, rows_per_file: int = 500) -> None:
    """Some parquet files of features and a label the model should predict."""
    rng = np.random.default_rng(0)
    true_weights = np.array([1.5, -2.0, 0.5, 1.0])
    for index in range(files):
        x = rng.normal(size=(rows_per_file, FEATURES))
        label = (x @ true_weights > 0).astype(np.int64)
        table = pa.table({f"f{i}": x[:, i] for i in range(FEATURES)} | {"label": label})
        pq.write_table(table, os.path.join(directory, f"part-{index}.parquet"))


class Classifier:
    """Loaded once per actor; called on batches of NumPy arrays."""

    def __init__(self, weights: list) -> None:
        self.weights = np.asarray(weights)  # a real model: torch.load(...) here

    def __call__(self, batch: dict) -> dict:
        x = np.stack([batch[f"f{i}"] for i in range(FEATURES)], axis=1)
        probability = 1 / (1 + np.exp(-(x @ self.weights)))
        return {"label": batch["label"], "probability": probability,
                "prediction": (probability > 0.5).astype(np.int64)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sim", action="store_true", help="run on a simulated cluster")
    parser.add_argument("--dir", default=None, help="where to write the input and output")
    args = parser.parse_args()
    if args.sim:
        tray.init(backend="sim", num_nodes=2, num_cpus=2, seed=0)
    else:
        tray.init(num_cpus=2)
    directory = args.dir or tempfile.mkdtemp(prefix="tray-batch-inference-")
    inputs = os.path.join(directory, "inputs")
    os.makedirs(inputs, exist_ok=True)
    write_dataset(inputs)

    predictions = tray.data.read_parquet(inputs).map_batches(
        Classifier, concurrency=2, batch_size=250, fn_constructor_args=([1.4, -1.9, 0.6, 0.9],),
        num_cpus=0.5)  # two actors take one CPU of two: the reads need the other
    predictions.write_parquet(os.path.join(directory, "predictions"))

    scored = tray.data.read_parquet(os.path.join(directory, "predictions"))
    total = scored.count()
    correct = scored.filter(lambda row: row["prediction"] == row["label"]).count()
    print(f"scored {total} rows into {directory}/predictions")
    print(f"accuracy {correct / total:.3f}")
    tray.shutdown()


if __name__ == "__main__":
    main()
