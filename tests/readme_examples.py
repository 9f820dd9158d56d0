"""The examples of the README and of the documentation pages (docs/*.md) as
tests run them: a ```python block, found by a marker it contains (or as the
only one of a page or section), run as a script of its own in a fresh
process (so it starts the way a user's program does).

Every ```python block of a page is a program (docs/development.md, "Writing
the docs"): tests/test_docs_site.py runs it, unless the line above its fence
says ``<!-- not a program -->`` or ``<!-- run by tests/test_x.py -->`` (that
test finds it here and runs it itself)."""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"

# A ```python block, with the HTML comment on the line above its fence, if any.
_BLOCK = re.compile(r"(?:^<!-- (.*?) -->\n)?^```python\n(.*?)^```", flags=re.S | re.M)


def page_text(page: str | None = None) -> str:
    """The README (``page=None``) or a page of docs/ (``"data.md"``)."""
    return (README if page is None else DOCS / page).read_text()


def section(heading: str, page: str | None = None) -> str:
    """A page (the README by default) from ``heading`` (``"## Data"``,
    ``"### Jobs"``) to the next heading of the same level or a higher one
    (down to ``##``: a line that starts ``# `` is a comment in a code block)."""
    text = page_text(page)
    level = heading.split(" ", 1)[0]
    start = text.index(f"\n{heading}\n")
    ends = [text.find(f"\n{'#' * n} ", start + 1) for n in range(2, len(level) + 1)]
    ends = [end for end in ends if end != -1]
    return text[start:min(ends) if ends else len(text)]


def annotated_blocks(text: str) -> list[tuple[str, str]]:
    """Each ```python block of ``text`` as (the comment above its fence, or
    "", its source)."""
    return [(comment, source) for comment, source in _BLOCK.findall(text)]


def python_blocks(text: str | None = None, *, page: str | None = None) -> list[str]:
    """The ```python blocks of ``text``, else of ``page`` (the README by default)."""
    return [source for _, source in annotated_blocks(page_text(page) if text is None else text)]


def block(containing: str | None = None, *, text: str | None = None,
          page: str | None = None) -> str:
    """The one python block of ``text`` (else of ``page``, else of the
    README) that contains ``containing``; with None, the only block there."""
    blocks = python_blocks(text, page=page)
    if containing is not None:
        blocks = [b for b in blocks if containing in b]
    where = "the text" if text is not None else page or "README.md"
    assert len(blocks) == 1, f"{len(blocks)} python blocks of {where} match {containing!r}"
    return blocks[0]


def run(source: str, tmp_path, name: str = "readme_example.py", *, timeout_s: float = 120,
        env: dict | None = None) -> subprocess.CompletedProcess:
    """Run ``source`` as ``tmp_path/name`` in a new interpreter (cwd
    ``tmp_path``); the finished process, output as text."""
    script = tmp_path / name
    script.write_text(source)
    return subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=timeout_s, cwd=tmp_path, env=env)
