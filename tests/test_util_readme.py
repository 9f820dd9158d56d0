"""README's "Utilities" example must keep working (on the simulator, as
written; the same program on real processes is what the local-backend tests
of each utility cover)."""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys

import pytest

pytest.importorskip("sklearn")

ROOT = pathlib.Path(__file__).resolve().parent.parent
SIM_INIT = 'tray.init(backend="sim", num_nodes=2, num_cpus=2, seed=0)'


def _utilities_example() -> str:
    text = (ROOT / "README.md").read_text()
    section = text.split("\n## Utilities\n", 1)[1].split("\n## ", 1)[0]
    [block] = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    assert SIM_INIT in block
    return block


def test_readme_utilities_example_runs_in_the_simulator(tmp_path):
    script = tmp_path / "utilities.py"
    script.write_text(_utilities_example())
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                            timeout=180, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["the queue is empty", "best C: 1.0"]
