"""ResNet on several workers with tray.train (the seed docs' "ResNet" example,
redone with a TorchTrainer).

The 2017 example created one actor per GPU, gave each a copy of the data,
ran a few training steps in each, and averaged their weights in the driver
every round. Data-parallel training does the same averaging at every step:
each worker computes the gradients of its share of the global batch, and
DistributedDataParallel averages them across workers (an all-reduce over
torch.distributed's gloo backend, nccl on GPUs) before the optimizer step, so
every worker holds the same weights all along. tray.train adds what the
example left to the user: the workers are placed together (all or none),
every epoch ends with a checkpoint on storage, and a worker that dies brings
the group back from the latest one.

The data is synthetic (CIFAR-shaped images whose class is a bright patch at a
class-specific place, under noise), so the example needs no download.

    python examples/train_resnet.py [--num-workers 2] [--epochs 4] [--kill-a-worker]

``--kill-a-worker`` SIGKILLs rank 1 in the middle of epoch 2: the run goes on
from epoch 1's checkpoint and says so.
"""

import argparse
import os
import signal
import tempfile

import torch
from torch import nn

import tray
from tray import train
from tray.train.torch import TorchTrainer, prepare_data_loader, prepare_model

CLASSES = 10
SIZE = 16


def synthetic_images(samples: int, seed: int):
    generator = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, CLASSES, (samples,), generator=generator)
    images = 0.5 * torch.randn(samples, 3, SIZE, SIZE, generator=generator)
    for index, label in enumerate(labels.tolist()):
        row, col = divmod(label, 4)
        images[index, label % 3, 4 * row:4 * row + 4, 4 * col:4 * col + 4] += 2.0
    return torch.utils.data.TensorDataset(images, labels)


class BasicBlock(nn.Module):
    def __init__(self, channels_in: int, channels_out: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels_in, channels_out, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels_out)
        self.conv2 = nn.Conv2d(channels_out, channels_out, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels_out)
        self.shortcut = nn.Sequential()
        if stride != 1 or channels_in != channels_out:
            self.shortcut = nn.Sequential(nn.Conv2d(channels_in, channels_out, 1, stride,
                                                    bias=False), nn.BatchNorm2d(channels_out))

    def forward(self, x):
        out = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


class ResNet(nn.Module):
    """A small ResNet: a stem and three stages of one basic block each."""

    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 3, 1, 1, bias=False),
                                  nn.BatchNorm2d(width), nn.ReLU())
        self.stages = nn.Sequential(BasicBlock(width, width, 1),
                                    BasicBlock(width, 2 * width, 2),
                                    BasicBlock(2 * width, 4 * width, 2))
        self.head = nn.Linear(4 * width, CLASSES)

    def forward(self, x):
        out = self.stages(self.stem(x))
        return self.head(torch.flatten(nn.functional.adaptive_avg_pool2d(out, 1), 1))


def train_loop_per_worker(config: dict) -> None:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    context = train.get_context()
    train_data = synthetic_images(config["samples"], seed=1)
    test_data = synthetic_images(config["samples"] // 4, seed=2)
    # Each worker reads its own share (a DistributedSampler) of every global batch.
    train_loader = prepare_data_loader(torch.utils.data.DataLoader(
        train_data, batch_size=config["batch_size"] // context.get_world_size(), shuffle=True))
    test_loader = prepare_data_loader(torch.utils.data.DataLoader(test_data, batch_size=256))
    model = ResNet()
    optimizer = torch.optim.SGD(model.parameters(), lr=config["lr"], momentum=0.9)
    first_epoch = 0
    checkpoint = train.get_checkpoint()
    if checkpoint is not None:  # a restart: go on from the latest checkpoint
        with checkpoint.as_directory() as directory:
            state = torch.load(os.path.join(directory, "model.pt"))
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        first_epoch = state["epoch"] + 1
    model = prepare_model(model)  # DDP: gradients averaged across the workers

    for epoch in range(first_epoch, config["epochs"]):
        if context.get_world_size() > 1:
            train_loader.sampler.set_epoch(epoch)
        model.train()
        for step, (images, labels) in enumerate(train_loader):
            loss = nn.functional.cross_entropy(model(images), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if config["kill_marker"] and epoch == 2 and step == 1 and \
                    context.get_world_rank() == 1 and not os.path.exists(config["kill_marker"]):
                open(config["kill_marker"], "w").close()
                os.kill(os.getpid(), signal.SIGKILL)
        model.eval()
        correct = total = 0
        with torch.no_grad():
            for images, labels in test_loader:
                correct += (model(images).argmax(1) == labels).sum().item()
                total += len(labels)
        with tempfile.TemporaryDirectory() as directory:
            checkpoint = None
            if context.get_world_rank() == 0:
                torch.save({"model": model.module.state_dict() if hasattr(model, "module")
                            else model.state_dict(),
                            "optimizer": optimizer.state_dict(), "epoch": epoch},
                           os.path.join(directory, "model.pt"))
                checkpoint = train.Checkpoint.from_directory(directory)
            train.report({"epoch": epoch, "loss": round(loss.item(), 4),
                          "accuracy": correct / total}, checkpoint=checkpoint)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--samples", type=int, default=1024)
    parser.add_argument("--kill-a-worker", action="store_true",
                        help="SIGKILL rank 1 in epoch 2, to watch the run recover")
    args = parser.parse_args()
    tray.init(num_cpus=max(2, args.num_workers))
    storage = tempfile.mkdtemp(prefix="train_resnet_")
    trainer = TorchTrainer(
        train_loop_per_worker,
        train_loop_config={"epochs": args.epochs, "samples": args.samples, "batch_size": 64,
                           "lr": 0.05,
                           "kill_marker": os.path.join(storage, "killed")
                           if args.kill_a_worker else ""},
        scaling_config=train.ScalingConfig(num_workers=args.num_workers),
        run_config=train.RunConfig(name="resnet", storage_path=storage,
                                   checkpoint_config=train.CheckpointConfig(num_to_keep=2),
                                   failure_config=train.FailureConfig(max_failures=2)))
    result = trainer.fit()
    print(f"final accuracy {result.metrics['accuracy']:.3f} after {args.epochs} epochs on "
          f"{args.num_workers} workers, {result.num_restarts} restart(s); "
          f"checkpoint: {result.checkpoint.path}")
    tray.shutdown()


if __name__ == "__main__":
    main()
