"""The Tune page's example (docs/tune.md) runs, and replays: it is on the simulator."""

import pathlib
import subprocess
import sys

import readme_examples  # (tests/ is on sys.path)

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_readme_tune_example_runs_and_replays(tmp_path):
    block = readme_examples.block("from tray import tune", page="tune.md")
    outputs = []
    for _ in range(2):
        done = readme_examples.run(block, tmp_path)
        assert done.returncode == 0, done.stderr
        outputs.append(done.stdout)
    assert "16 trials; best config:" in outputs[0]
    assert "best loss:" in outputs[0]
    assert outputs[0] == outputs[1]  # same seed, same trials, decisions and best


def test_tune_examples_run_on_the_simulator():
    for name, expected in (("hyperparameter_search.py", "stopped early by ASHA"),
                           ("pbt.py", "8 trials, 0 errors")):
        done = subprocess.run([sys.executable, str(ROOT / "examples" / name), "--sim"],
                              capture_output=True, text=True, timeout=180)
        assert done.returncode == 0, done.stderr
        assert expected in done.stdout
        assert "best" in done.stdout
