"""The Data page (docs/data.md): its example must run and print what it says,
and the batch inference example must run."""

import pathlib
import subprocess
import sys

import readme_examples  # (tests/ is on sys.path)

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_readme_data_example_runs(tmp_path):
    result = readme_examples.run(readme_examples.block(page="data.md"), tmp_path)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "6666"
    assert lines[1] == "[{'label': 1, 'count()': 3333}, {'label': 2, 'count()': 3333}]"
    assert lines[2] == "5000 1666"
    assert "MapBatches(Model)" in result.stdout


def test_batch_inference_example_runs(tmp_path):
    result = subprocess.run([sys.executable, str(ROOT / "examples" / "batch_inference.py"),
                             "--sim", "--dir", str(tmp_path)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "scored 2000 rows" in result.stdout
    assert "accuracy" in result.stdout
