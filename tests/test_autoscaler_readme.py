"""The README's Autoscaling example runs, and replays: it is on the simulator."""

import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_readme_autoscaling_example_runs_and_replays(tmp_path):
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), flags=re.S)
    [block] = [b for b in blocks if "autoscaler.start(" in b]
    script = tmp_path / "autoscaling_example.py"
    script.write_text(block)
    outputs = []
    for _ in range(2):
        done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                              timeout=120, cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        outputs.append(done.stdout)
    out = outputs[0]
    assert "sum: 276" in out
    assert "======== Autoscaler status ========" in out
    assert "launch cpu4" in out
    assert "launch gpu" not in out  # GPU nodes are kept for GPU work
    assert "live nodes after idling: 1" in out
    assert outputs[0] == outputs[1]  # same seed: same launches, boots and removals
