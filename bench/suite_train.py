"""Train's benchmarks, for tray.train and Ray Train with the same code.

Every metric runs a ``TorchTrainer`` with 2 workers (1 CPU each, gloo, one
torch thread each) on a local cluster of 2 CPUs (``tray.init(num_cpus=2)``;
Ray with ``_node_ip_address="127.0.0.1"``, Ray Train's v2 API). The timings
of the per-report and per-epoch rows are taken by rank 0 inside the
training function, between ``report`` calls, so the group's start-up is not
in them: one ``fit()`` does a warm-up, then ``ROUNDS`` timed rounds, and
writes the rounds to a file the driver reads (Ray Train 2.x's ``Result``
keeps only the metrics of reports with a checkpoint).

* ``train: overhead per report``: rounds of ``REPORTS`` back-to-back
  ``train.report({"i": i})`` on both workers (a report is collective in both:
  every worker waits for the others), milliseconds per report.
* ``train: overhead per report with a checkpoint``: the same, each report with
  a checkpoint directory holding one 1 KB file per worker, persisted to
  ``storage_path`` before ``report`` returns (both).
* ``train: time per epoch``: a DDP MLP (64-256-256-10) on 4,096 synthetic
  samples, global batch 128 (a DistributedSampler gives each worker 32 steps
  of 64), then a report with rank 0's checkpoint (model and optimizer state,
  about 0.7 MB): the seconds of one epoch.
* ``train: fit() of a 1-report run``: wall-clock seconds from ``fit()`` to
  its return for a training function that reports once: placing the group,
  starting the workers, the process group, and tearing it down.

The report counts are small because Ray Train 2.60's ``report`` returns
only when its controller has polled the worker, every 2 s by default
(``RAY_TRAIN_HEALTH_CHECK_INTERVAL_S``): a round of 20 reports takes Ray
40 s. Both runtimes run with their defaults. ``--quick`` divides the counts
by 10. Traffic stays on 127.0.0.1.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time

import harness

CPUS = 2
WORKERS = 2
REPORTS = 20
CHECKPOINT_REPORTS = 10
EPOCH_SAMPLES = 4096
GLOBAL_BATCH = 128
FIT_ROUNDS = 3

DEFINITIONS = [
    (f"train: overhead per report (2 workers, {REPORTS} reports a round)", "ms", False),
    (f"train: overhead per report with a checkpoint (2 workers, {CHECKPOINT_REPORTS} reports "
     f"a round)", "ms", False),
    (f"train: time per epoch (2 workers, DDP MLP, {EPOCH_SAMPLES // GLOBAL_BATCH} steps + a "
     f"checkpoint)", "s", False),
    ("train: fit() of a 1-report run (2 workers)", "s", False),
]
NAMES = [name for name, _unit, _better in DEFINITIONS]


def _train_module(runtime: str):
    if runtime == "tray":
        from tray import train
    else:
        from ray import train
    return train


def _loop(config: dict) -> None:
    """The training function of every metric (in a worker process)."""
    import torch

    torch.set_num_threads(1)
    train = _train_module(config["runtime"])
    rank = train.get_context().get_world_rank()
    rounds_s = []
    kind = config["kind"]
    if kind == "once":
        train.report({"done": 1})
        return
    if kind in ("report", "checkpoint"):
        with tempfile.TemporaryDirectory() as directory:
            with open(os.path.join(directory, f"rank-{rank}.bin"), "wb") as file:
                file.write(os.urandom(1024))
            checkpoint = train.Checkpoint.from_directory(directory) \
                if kind == "checkpoint" else None
            for round_index in range(config["rounds"] + 1):  # the first is a warm-up
                start = time.perf_counter()
                for i in range(config["count"]):
                    train.report({"i": i}, checkpoint=checkpoint)
                if round_index:
                    rounds_s.append((time.perf_counter() - start) / config["count"])
    else:
        rounds_s = _epochs(train, config, rank)
    if rank == 0:
        with open(config["out"], "w", encoding="utf-8") as file:
            json.dump(rounds_s, file)


def _epochs(train, config: dict, rank: int) -> list[float]:
    import torch

    if config["runtime"] == "tray":
        from tray.train.torch import prepare_data_loader, prepare_model
    else:
        from ray.train.torch import prepare_data_loader, prepare_model
    generator = torch.Generator().manual_seed(0)
    features = torch.randn(config["samples"], 64, generator=generator)
    labels = torch.randint(0, 10, (config["samples"],), generator=generator)
    loader = prepare_data_loader(torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(features, labels),
        batch_size=GLOBAL_BATCH // WORKERS, shuffle=True))
    torch.manual_seed(0)
    model = prepare_model(torch.nn.Sequential(
        torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256), torch.nn.ReLU(),
        torch.nn.Linear(256, 10)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    rounds_s = []
    for epoch in range(config["rounds"] + 1):  # epoch 0 is a warm-up
        start = time.perf_counter()
        loader.sampler.set_epoch(epoch)
        for inputs, targets in loader:
            loss = torch.nn.functional.cross_entropy(model(inputs), targets)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        with tempfile.TemporaryDirectory() as directory:
            checkpoint = None
            if rank == 0:
                torch.save({"model": model.module.state_dict(),
                            "optimizer": optimizer.state_dict()},
                           os.path.join(directory, "model.pt"))
                checkpoint = train.Checkpoint.from_directory(directory)
            train.report({"epoch": epoch, "loss": loss.item()}, checkpoint=checkpoint)
        if epoch:
            rounds_s.append(time.perf_counter() - start)
    return rounds_s


def _start(runtime: str):
    os.environ["OMP_NUM_THREADS"] = "1"
    if runtime == "tray":
        import tray

        tray.init(num_cpus=CPUS)
        return tray
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    os.environ.setdefault("RAY_TRAIN_V2_ENABLED", "1")
    import ray

    ray.init(num_cpus=CPUS, include_dashboard=False, logging_level="ERROR",
             log_to_driver=False, _node_ip_address="127.0.0.1")
    return ray


def _fit(runtime: str, storage: str, name: str, config: dict) -> float:
    """Seconds that ``fit()`` takes."""
    train = _train_module(runtime)
    if runtime == "tray":
        from tray.train.torch import TorchTrainer

        run_config = train.RunConfig(name=name, storage_path=storage, verbose=0)
    else:
        from ray.train.torch import TorchTrainer

        run_config = train.RunConfig(name=name, storage_path=storage)
    trainer = TorchTrainer(_loop, train_loop_config=dict(config, runtime=runtime),
                           scaling_config=train.ScalingConfig(num_workers=WORKERS),
                           run_config=run_config)
    start = time.perf_counter()
    trainer.fit()
    return time.perf_counter() - start


def metric_for(runtime: str, name: str):
    """The function that measures ``name`` on ``runtime`` (tray or ray)."""

    def inside(kind: str, count: int, scale: float):
        def measure() -> list[float]:
            module = _start(runtime)
            storage = tempfile.mkdtemp(prefix="bench-train-")
            try:
                out = os.path.join(storage, "rounds.json")
                _fit(runtime, storage, kind, {"kind": kind, "count": count,
                                              "samples": count, "rounds": harness.ROUNDS,
                                              "out": out})
                with open(out, encoding="utf-8") as file:
                    return [value * scale for value in json.load(file)]
            finally:
                module.shutdown()
                shutil.rmtree(storage, ignore_errors=True)
        return measure

    def fit_once() -> list[float]:
        module = _start(runtime)
        storage = tempfile.mkdtemp(prefix="bench-train-")
        try:
            _fit(runtime, storage, "warm-up", {"kind": "once"})
            return [_fit(runtime, storage, f"fit{i}", {"kind": "once"})
                    for i in range(min(FIT_ROUNDS, harness.ROUNDS))]
        finally:
            module.shutdown()
            shutil.rmtree(storage, ignore_errors=True)

    return {
        NAMES[0]: inside("report", harness.n(REPORTS), 1000.0),
        NAMES[1]: inside("checkpoint", harness.n(CHECKPOINT_REPORTS), 1000.0),
        NAMES[2]: inside("epoch", harness.n(EPOCH_SAMPLES), 1.0),
        NAMES[3]: fit_once,
    }[name]
