"""tray.train on real processes: torch.distributed's gloo process group
across worker processes. DDP with two workers gives the weights of one
process training on the same global batches; a worker SIGKILLed in the
middle of an epoch brings the group back from the latest checkpoint, and
the loss curve goes on exactly where it left off."""

from __future__ import annotations

import os
import signal
import tempfile

import pytest

import tray
from tray import train

torch = pytest.importorskip("torch")

SAMPLES = 64
GLOBAL_BATCH = 16
SEED = 3


def make_data():
    generator = torch.Generator().manual_seed(SEED)
    features = torch.randn(SAMPLES, 4, generator=generator)
    labels = (features[:, 0] + 0.5 * features[:, 1] > 0).long()
    return features, labels


def make_model():
    torch.manual_seed(SEED)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))


def make_optimizer(model):
    return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


def mlp_loop(config):
    """DDP training of a small MLP; every epoch rank 0 checkpoints the model and
    optimizer, and every rank reports the epoch's loss over the global batches."""
    import torch.distributed as dist

    from tray.train import torch as train_torch

    torch.set_num_threads(1)
    context = train.get_context()
    world_size = context.get_world_size()
    features, labels = make_data()
    loader = train_torch.prepare_data_loader(torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(features, labels),
        batch_size=GLOBAL_BATCH // world_size, shuffle=False))
    model = make_model()
    optimizer = make_optimizer(model)
    start = 0
    checkpoint = train.get_checkpoint()
    if checkpoint is not None:
        state = torch.load(os.path.join(checkpoint.path, "state.pt"))
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start = state["epoch"] + 1
    model = train_torch.prepare_model(model)
    for epoch in range(start, config["epochs"]):
        total = torch.zeros(1)
        for step, (inputs, targets) in enumerate(loader):
            loss = torch.nn.functional.cross_entropy(model(inputs), targets)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total += loss.detach()
            if epoch == config.get("kill_epoch") and step == 1 and \
                    context.get_world_rank() == 1 and not os.path.exists(config["marker"]):
                open(config["marker"], "w").close()
                os.kill(os.getpid(), signal.SIGKILL)  # mid-epoch, after a step
        dist.all_reduce(total)  # the mean of the global batches' losses
        epoch_loss = total.item() / (world_size * len(loader))
        with tempfile.TemporaryDirectory() as directory:
            report_checkpoint = None
            if context.get_world_rank() == 0:
                torch.save({"model": model.module.state_dict(),
                            "optimizer": optimizer.state_dict(), "epoch": epoch},
                           os.path.join(directory, "state.pt"))
                report_checkpoint = train.Checkpoint.from_directory(directory)
            train.report({"epoch": epoch, "loss": epoch_loss, "pid": os.getpid(),
                          "model": type(model).__name__,
                          "process_group": f"{dist.get_backend()}/{dist.get_world_size()}",
                          "env": [os.environ.get(k) for k in ("MASTER_ADDR", "RANK",
                                                              "WORLD_SIZE", "LOCAL_RANK")]},
                         checkpoint=report_checkpoint)


def single_process(epochs: int) -> tuple[list[float], dict]:
    """The same training in this process, one global batch per step."""
    torch.set_num_threads(1)
    features, labels = make_data()
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(features, labels),
                                         batch_size=GLOBAL_BATCH, shuffle=False)
    model = make_model()
    optimizer = make_optimizer(model)
    losses = []
    for _ in range(epochs):
        total = 0.0
        for inputs, targets in loader:
            loss = torch.nn.functional.cross_entropy(model(inputs), targets)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total += loss.item()
        losses.append(total / len(loader))
    return losses, model.state_dict()


@pytest.fixture
def local():
    tray.init(num_cpus=2)
    yield
    tray.shutdown()


def fit(tmp_path, config, max_failures=0):
    from tray.train.torch import TorchTrainer

    return TorchTrainer(mlp_loop, train_loop_config=config,
                        scaling_config=train.ScalingConfig(num_workers=2),
                        run_config=train.RunConfig(
                            name="mlp", storage_path=str(tmp_path), verbose=0,
                            failure_config=train.FailureConfig(max_failures=max_failures),
                            checkpoint_config=train.CheckpointConfig(num_to_keep=2))).fit()


def final_weights(result) -> dict:
    with result.checkpoint.as_directory() as directory:
        return torch.load(os.path.join(directory, "state.pt"))["model"]


def test_two_ddp_workers_match_one_process_on_the_same_global_batches(local, tmp_path):
    result = fit(tmp_path, {"epochs": 3})
    losses, weights = single_process(3)
    assert result.metrics["model"] == "DistributedDataParallel"
    assert result.metrics["process_group"] == "gloo/2"
    assert result.metrics["env"] == ["127.0.0.1", "0", "2", "0"]
    assert list(result.metrics_dataframe["loss"]) == pytest.approx(losses, rel=1e-5)
    trained = final_weights(result)
    assert sorted(trained) == sorted(weights)
    for name, value in weights.items():
        torch.testing.assert_close(trained[name], value, rtol=1e-5, atol=1e-6)
    assert losses[-1] < losses[0]  # it learned something: the comparison is not vacuous


def test_a_sigkilled_worker_resumes_from_the_last_checkpoint(local, tmp_path):
    marker = str(tmp_path / "killed")
    result = fit(tmp_path, {"epochs": 5, "kill_epoch": 3, "marker": marker}, max_failures=2)
    assert os.path.exists(marker)  # rank 1 really SIGKILLed itself, mid-epoch 3
    assert result.num_restarts == 1
    frame = result.metrics_dataframe
    # Epochs 0-2 from the first group, then the new group resumed from epoch 2's
    # checkpoint: no epoch lost, none repeated.
    assert list(frame["epoch"]) == [0, 1, 2, 3, 4]
    assert list(frame["attempt"]) == [0, 0, 0, 1, 1]
    assert len(set(frame["pid"])) == 2  # rank 0 in a new process after the restart
    # The loss curve continues from the checkpoint: every epoch's loss, before
    # and after the crash, is the uninterrupted single-process run's.
    losses, weights = single_process(5)
    assert list(frame["loss"]) == pytest.approx(losses, rel=1e-5)
    trained = final_weights(result)
    for name, value in weights.items():
        torch.testing.assert_close(trained[name], value, rtol=1e-5, atol=1e-6)
