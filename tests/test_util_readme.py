"""The Utilities page's example (docs/utilities.md) must keep working (on the simulator, as
written; the same program on real processes is what the local-backend tests
of each utility cover)."""

from __future__ import annotations

import pathlib

import pytest
import readme_examples  # (tests/ is on sys.path)

pytest.importorskip("sklearn")

ROOT = pathlib.Path(__file__).resolve().parent.parent
SIM_INIT = 'tray.init(backend="sim", num_nodes=2, num_cpus=2, seed=0)'


def _utilities_example() -> str:
    block = readme_examples.block(page="utilities.md")
    assert SIM_INIT in block
    return block


def test_readme_utilities_example_runs_in_the_simulator(tmp_path):
    result = readme_examples.run(_utilities_example(), tmp_path, timeout_s=180)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["the queue is empty", "best C: 1.0"]
