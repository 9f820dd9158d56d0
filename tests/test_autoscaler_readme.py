"""The Autoscaling page's example (docs/autoscaling.md) runs, and replays: it is on the
simulator."""

import readme_examples  # (tests/ is on sys.path)


def test_readme_autoscaling_example_runs_and_replays(tmp_path):
    block = readme_examples.block(page="autoscaling.md")
    outputs = []
    for _ in range(2):
        done = readme_examples.run(block, tmp_path, "autoscaling_example.py")
        assert done.returncode == 0, done.stderr
        outputs.append(done.stdout)
    out = outputs[0]
    assert "sum: 276" in out
    assert "======== Autoscaler status ========" in out
    assert "launch cpu4" in out
    assert "launch gpu" not in out  # GPU nodes are kept for GPU work
    assert "live nodes after idling: 1" in out
    assert outputs[0] == outputs[1]  # same seed: same launches, boots and removals
