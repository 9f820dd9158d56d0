"""The README's examples as tests run them: a ```python block, found by a
marker it contains (or as the only one of a section), run as a script of
its own in a fresh process (so it starts the way a user's program does)."""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys

README = pathlib.Path(__file__).resolve().parent.parent / "README.md"


def section(heading: str) -> str:
    """The README from ``heading`` (``"## Data"``, ``"### Jobs"``) to the
    next heading of the same level or a higher one (down to ``##``: a line
    that starts ``# `` is a comment in a code block)."""
    text = README.read_text()
    level = heading.split(" ", 1)[0]
    start = text.index(f"\n{heading}\n")
    ends = [text.find(f"\n{'#' * n} ", start + 1) for n in range(2, len(level) + 1)]
    ends = [end for end in ends if end != -1]
    return text[start:min(ends) if ends else len(text)]


def python_blocks(text: str | None = None) -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text() if text is None else text,
                      flags=re.S)


def block(containing: str | None = None, *, text: str | None = None) -> str:
    """The one python block (of ``text``, the README by default) that
    contains ``containing``; with None, the only block of ``text``."""
    blocks = python_blocks(text)
    if containing is not None:
        blocks = [b for b in blocks if containing in b]
    assert len(blocks) == 1, f"{len(blocks)} README python blocks match {containing!r}"
    return blocks[0]


def run(source: str, tmp_path, name: str = "readme_example.py", *, timeout_s: float = 120,
        env: dict | None = None) -> subprocess.CompletedProcess:
    """Run ``source`` as ``tmp_path/name`` in a new interpreter (cwd
    ``tmp_path``); the finished process, output as text."""
    script = tmp_path / name
    script.write_text(source)
    return subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=timeout_s, cwd=tmp_path, env=env)
