"""The house's size limits, read from the tree: one concern per file keeps
every module under ``tray/`` at most ``FILE_LINES_MAX`` lines, the core
worker's facade class under ``CORE_WORKER_LINES_MAX`` (its work is in its
components), and the README short (the rest is the docs site)."""

from __future__ import annotations

import ast
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
FILE_LINES_MAX = 800
CORE_WORKER_LINES_MAX = 400
README_LINES_MAX = 600


def _lines(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines())


def oversized(paths, limit: int, root: Path = REPO_ROOT) -> list[str]:
    return [f"{path.relative_to(root)}: {_lines(path)} lines" for path in paths
            if _lines(path) > limit]


def class_lines(source: str, name: str) -> int:
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef) and node.name == name:
            return node.end_lineno - node.lineno + 1
    raise LookupError(name)


def test_no_module_under_tray_is_over_the_limit():
    paths = sorted((REPO_ROOT / "tray").rglob("*.py"))
    assert len(paths) > 100
    assert oversized(paths, FILE_LINES_MAX) == []


def test_the_core_worker_facade_stays_small():
    source = (REPO_ROOT / "tray/core/worker/core_worker.py").read_text(encoding="utf-8")
    assert class_lines(source, "CoreWorker") <= CORE_WORKER_LINES_MAX


def test_the_readme_stays_short():
    assert _lines(REPO_ROOT / "README.md") <= README_LINES_MAX


def test_the_checks_can_fail(tmp_path):
    big = tmp_path / "big.py"
    big.write_text("x = 1\n" * (FILE_LINES_MAX + 1))
    assert oversized([big], FILE_LINES_MAX, tmp_path) == [f"big.py: {FILE_LINES_MAX + 1} lines"]
    assert class_lines("class A:\n    x = 1\n    y = 2\n", "A") == 3
