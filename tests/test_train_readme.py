"""The Train page's example (docs/train.md) runs on real processes (two torch workers) and
prints what it says; examples/train_resnet.py trains its ResNet."""

import pathlib
import re
import subprocess
import sys

import readme_examples  # (tests/ is on sys.path)

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_readme_train_example_runs(tmp_path):
    done = readme_examples.run(readme_examples.block("from tray.train.torch import TorchTrainer",
                                                         page="train.md"),
                               tmp_path, timeout_s=240)
    assert done.returncode == 0, done.stderr[-4000:]
    lines = done.stdout.splitlines()
    assert "4 True" in lines
    assert "['checkpoint_000003', 'checkpoint_000004', 'result.json']" in lines
    assert "5 0" in lines
    assert "TorchTrainer 'readme': 2 worker(s)" in done.stdout  # the progress table
    assert "| iter   | epoch" in done.stdout


def test_resnet_example_trains_on_two_workers():
    done = subprocess.run([sys.executable, str(ROOT / "examples" / "train_resnet.py"),
                           "--epochs", "2"],
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-4000:]
    match = re.search(r"final accuracy ([\d.]+) after 2 epochs on 2 workers, 0 restart",
                      done.stdout)
    assert match, done.stdout[-2000:]
    assert float(match.group(1)) > 0.5  # ten classes: chance is 0.1
