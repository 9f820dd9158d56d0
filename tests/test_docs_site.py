"""The documentation site (docs/, mkdocs.yml): it builds with `mkdocs build
--strict` without a warning, and every ```python block of its pages is a
program that runs (docs/development.md, "Writing the docs"): here, as a
script of its own, or in the test the comment above its fence names."""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

import pytest
import readme_examples  # (tests/ is on sys.path)

ROOT = pathlib.Path(__file__).resolve().parent.parent
PAGES = sorted(path.name for path in readme_examples.DOCS.glob("*.md"))
RUN_BY = re.compile(r"run by (tests/test_\w+\.py)")


def _blocks() -> list[tuple[str, int, str, str]]:
    """(page, index on the page, the comment above the fence, the source)
    of every python block of every page."""
    return [(page, index, comment, source)
            for page in PAGES
            for index, (comment, source)
            in enumerate(readme_examples.annotated_blocks(readme_examples.page_text(page)))]


BLOCKS = _blocks()
PROGRAMS = [(page, index, source) for page, index, comment, source in BLOCKS if not comment]


def test_the_site_builds_with_no_warning(tmp_path):
    # NO_MKDOCS_2_WARNING: the Material theme's banner about MkDocs' future,
    # printed on every build; not a warning about this site.
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file",
         str(ROOT / "mkdocs.yml"), "--site-dir", str(tmp_path / "site")],
        capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert "WARNING" not in output, output
    for page in PAGES:
        built = "index.html" if page == "index.md" else f"{page[:-3]}/index.html"
        assert (tmp_path / "site" / built).exists(), page


def test_every_page_has_a_title_and_the_nav_names_every_page():
    nav = (ROOT / "mkdocs.yml").read_text()
    for page in PAGES:
        assert readme_examples.page_text(page).startswith("# "), page
        assert re.search(rf":\s+{re.escape(page)}\s*$", nav, flags=re.M), page


def test_the_comment_above_a_block_says_what_runs_it():
    for page, index, comment, _ in BLOCKS:
        if comment and comment != "not a program":
            match = RUN_BY.fullmatch(comment)
            assert match, f"{page}, block {index}: unknown comment <!-- {comment} -->"
            test = ROOT / match.group(1)
            assert test.exists(), f"{page}, block {index}: {match.group(1)} does not exist"
            assert page in test.read_text(), \
                f"{page}, block {index}: {match.group(1)} does not read {page}"


def test_the_readme_s_programs_are_the_docs():
    docs = {source for _, _, _, source in BLOCKS}
    for source in readme_examples.python_blocks():
        assert source in docs, f"a README program no docs page has:\n{source[:300]}"


@pytest.mark.parametrize(("page", "index", "source"), PROGRAMS,
                         ids=[f"{page}:{index}" for page, index, _ in PROGRAMS])
def test_a_program_of_the_docs_runs(page, index, source, tmp_path):
    done = readme_examples.run(source, tmp_path, f"{page[:-3].replace('-', '_')}_{index}.py")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
