"""The tutorial (README.md and docs/tutorial.md, the same program), the fault
tolerance example (docs/fault-tolerance.md) and the first example program must
keep working."""

import pathlib
import subprocess
import sys

import pytest
import readme_examples  # (tests/ is on sys.path)

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_readme_tutorial_runs(tmp_path):
    tutorial = readme_examples.block(page="tutorial.md")
    blocks = readme_examples.python_blocks()
    assert blocks, "README has no python example"
    assert blocks[0] == tutorial, "README's tutorial is not docs/tutorial.md's"
    result = readme_examples.run(tutorial, tmp_path)
    assert result.returncode == 0, result.stderr
    assert "bad input" in result.stdout


def test_readme_fault_tolerance_example_runs(tmp_path):
    [block] = [b for b in readme_examples.python_blocks(page="fault-tolerance.md")
               if "sim.kill_node" in b and "sim.advance" in b]
    result = readme_examples.run(block, tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "1000000.0"


@pytest.mark.parametrize("flags", [[], ["--sim"]], ids=["local", "sim"])
def test_first_example_program_runs(flags):
    result = subprocess.run([sys.executable, str(ROOT / "examples" / "hello.py"), *flags],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "sum of 16 arrays of ones: 16000.0" in result.stdout
    assert "counter: [1, 2, 3, 4, 5]" in result.stdout


def test_cli_sim_prints_a_reproducible_digest():
    command = [sys.executable, "-m", "tray.scripts.cli", "sim", str(ROOT / "examples" / "hello.py"),
               "--sim"]
    first = subprocess.run(command, capture_output=True, text=True, timeout=120)
    second = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert first.returncode == 0, first.stderr
    digest_lines = [line for line in first.stdout.splitlines() if line.startswith("trace digest")]
    assert len(digest_lines) == 1
    assert first.stdout == second.stdout
