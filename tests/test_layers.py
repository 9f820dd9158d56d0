"""The layers of ``docs/architecture.md`` section 1, both ways, read from the source.

``tests/test_layer_rule.py`` checks what the core must not *do* (sockets,
threads, wall time, global randomness). This file checks what every part of
``tray/`` may *import*, so that the layers hold in both directions:

* the core (``tray/core``) imports only the standard library modules it is
  allowed, trio's public API, the two libraries it is built on
  (``CORE_THIRD_PARTY``), its own modules and ``tray.exceptions`` -- nothing
  above it, not even inside a function -- and reads no environment variable;
* no module outside the core uses a core-private name (``_x``);
* one module, ``tray/_trio_private.py``, holds every access to trio's private
  internals (the canary test walks its list);
* each library (``LIBRARIES``) imports only tray's public API: no ``tray.core``,
  backend or transport, and no underscore module of another package;
* the import graph of ``tray/`` (every import statement, in functions too)
  has no circle.

Every check is a function of one module's source (``imports_of``) or of the
whole graph, and planted snippets below prove that each can fail."""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
TRAY = REPO_ROOT / "tray"

# The standard library modules the core may import (top-level names). Those
# that reach the world (socket, threading, subprocess, time, ...) are absent;
# ``os`` and ``random`` are here for their pure parts (os.path; the
# ``random.Random`` type), which test_layer_rule.py polices attribute by attribute.
CORE_STDLIB = {
    "__future__", "abc", "bisect", "collections", "contextlib", "contextvars", "copy",
    "dataclasses", "enum", "functools", "hashlib", "heapq", "inspect", "io", "itertools",
    "json", "logging", "math", "mmap", "numbers", "operator", "os", "pickle", "random",
    "re", "struct", "traceback", "types", "typing", "weakref",
}
# Third-party libraries the core is built on, and why each is allowed.
CORE_THIRD_PARTY = {
    "trio": "the core's event loop (its public API only: see CORE_TRIO_FORBIDDEN)",
    "cloudpickle": "how functions, classes and values are serialized",
    "greenback": "a blocking tray.get inside a task suspends its trio task (no thread)",
}
# Public trio modules that still reach outside the core's world.
CORE_TRIO_FORBIDDEN = ("trio.from_thread", "trio.to_thread", "trio.socket", "trio.testing")

# The libraries (each package, or module, that a user could have written on
# tray's public API). tray.util's state API and metrics are not among them:
# they are tray's own observability, which reads the core's state directly.
LIBRARIES = ("data", "serve", "tune", "train", "rllib", "util/actor_pool.py", "util/queue.py",
             "util/multiprocessing", "util/joblib")

TRIO_PRIVATE_MODULE = "tray._trio_private"


@dataclass(frozen=True)
class Import:
    """One imported name: ``module`` (absolute) and ``name`` (None for ``import module``)."""
    line: int
    module: str
    name: str | None

    def targets(self) -> list[str]:
        """What it may refer to: the module, and ``module.name`` (a submodule or attribute)."""
        return [self.module] if self.name is None else [self.module, f"{self.module}.{self.name}"]


def _absolute(module: str | None, level: int, package: str) -> str:
    if level == 0:
        return module or ""
    parts = package.split(".")[: len(package.split(".")) - (level - 1)]
    return ".".join(parts + ([module] if module else []))


def imports_of(source: str, package: str) -> list[Import]:
    """Every import in a module's source, functions included; ``package`` is
    the package a relative import is relative to."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [Import(node.lineno, alias.name, None) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            module = _absolute(node.module, node.level, package)
            found += [Import(node.lineno, module, alias.name) for alias in node.names]
    return found


def _attribute_chains(source: str):
    """(line, "a.b.c") for every outermost dotted attribute chain in the source."""
    tree = ast.parse(source)
    inner = {id(node.value) for node in ast.walk(tree)
             if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and id(node) not in inner:
            parts, value = [], node
            while isinstance(value, ast.Attribute):
                parts.append(value.attr)
                value = value.value
            if isinstance(value, ast.Name):
                yield node.lineno, ".".join([value.id, *reversed(parts)])


# ------------------------------------------------------------------ checks of one module

def core_violations(source: str, package: str = "tray.core") -> list[str]:
    problems = []
    for imp in imports_of(source, package):
        top = imp.module.split(".")[0]
        if imp.module == "tray" or imp.module.startswith("tray."):
            target = imp.targets()[-1]
            if not (imp.module.startswith("tray.core") or imp.module == "tray.exceptions" or
                    target == "tray.exceptions"):
                problems.append(f"{imp.line}: imports {target} (above the core)")
        elif top == "trio":
            for target in imp.targets():
                if target.startswith(CORE_TRIO_FORBIDDEN) or "._" in f".{target}":
                    problems.append(f"{imp.line}: imports {target} (not trio's public API "
                                    f"for the core)")
                    break
        elif top not in CORE_STDLIB and top not in CORE_THIRD_PARTY:
            problems.append(f"{imp.line}: imports {imp.module} (not allowed in the core)")
    for line, chain in _attribute_chains(source):
        if chain.startswith(("os.environ", "os.getenv", "os.putenv", "os.unsetenv")):
            problems.append(f"{line}: reads the environment ({chain})")
        if chain.startswith("trio.") and any(part.startswith("_") for part in chain.split(".")):
            problems.append(f"{line}: uses trio's private {chain}")
    return problems


def _is_core_private(target: str) -> bool:
    parts = target.split(".")
    return target.startswith("tray.core.") and parts[-1].startswith("_") and \
        not parts[-1].startswith("__")


def outside_core_violations(source: str, package: str) -> list[str]:
    """Core-private names used outside the core."""
    return [f"{imp.line}: uses the core's private {imp.module}.{imp.name}"
            for imp in imports_of(source, package)
            if imp.name is not None and _is_core_private(f"{imp.module}.{imp.name}")]


def trio_private_violations(source: str, package: str) -> list[str]:
    """Private trio access outside tray/_trio_private.py."""
    problems = []
    for imp in imports_of(source, package):
        for target in imp.targets():
            if target.split(".")[0] == "trio" and any(
                    part.startswith("_") for part in target.split(".")[1:]):
                problems.append(f"{imp.line}: imports trio's private {target} (only "
                                f"{TRIO_PRIVATE_MODULE} may)")
                break
    for line, chain in _attribute_chains(source):
        if chain.startswith("trio.") and any(part.startswith("_") for part in chain.split(".")[1:]):
            problems.append(f"{line}: uses trio's private {chain} (only {TRIO_PRIVATE_MODULE} may)")
    return problems


def library_violations(source: str, package: str) -> list[str]:
    """A library's imports of tray that are not tray's public API."""
    library = ".".join(package.split(".")[:3 if package.startswith("tray.util.") else 2])
    problems = []
    for imp in imports_of(source, package):
        for target in imp.targets():
            if not target.startswith("tray.") or target == library or \
                    target.startswith(library + "."):
                continue
            parts = target.split(".")
            if parts[1] in ("core", "backends", "transports", "simtest"):
                if parts[1] == "simtest" and target in ("tray.simtest", "tray.simtest.cluster"):
                    continue
                problems.append(f"{imp.line}: imports {target} (not tray's public API)")
                break
            # An underscore module of another package; a module's own private
            # attribute (the last part, when it is a name in a public module) too.
            if any(part.startswith("_") and not part.startswith("__") for part in parts[1:]):
                problems.append(f"{imp.line}: imports {target} (private to another package)")
                break
    return problems


# ------------------------------------------------------------------ the tree

def _module_name(path: Path) -> str:
    rel = path.relative_to(REPO_ROOT).with_suffix("")
    parts = list(rel.parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _package_of(path: Path) -> str:
    name = _module_name(path)
    return name if path.name == "__init__.py" else name.rpartition(".")[0]


def tray_files() -> list[Path]:
    return sorted(TRAY.rglob("*.py"))


def _report(kind: str, found: dict[str, list[str]]) -> None:
    if found:
        listing = "\n".join(f"  {path}:{problem}" for path, problems in sorted(found.items())
                            for problem in problems)
        pytest.fail(f"{kind}:\n{listing}", pytrace=False)


def _scan(paths, check) -> dict[str, list[str]]:
    found = {}
    for path in paths:
        problems = check(path.read_text(encoding="utf-8"), _package_of(path))
        if problems:
            found[path.relative_to(REPO_ROOT).as_posix()] = problems
    return found


def test_the_tree_is_there():
    assert (TRAY / "core" / "__init__.py").is_file() and len(tray_files()) > 100
    for library in LIBRARIES:
        assert (TRAY / library).exists(), library


def test_the_core_imports_only_what_it_may():
    _report("tray/core reaches outside its layer",
            _scan(sorted((TRAY / "core").rglob("*.py")), core_violations))


def test_no_module_outside_the_core_uses_its_private_names():
    outside = [path for path in tray_files() if "core" not in path.relative_to(TRAY).parts[:1]]
    _report("core-private names used outside the core", _scan(outside, outside_core_violations))


def test_private_trio_is_touched_in_one_module_only():
    others = [path for path in tray_files() if _module_name(path) != TRIO_PRIVATE_MODULE]
    _report("private trio internals outside tray/_trio_private.py",
            _scan(others, trio_private_violations))


def test_libraries_import_only_trays_public_api():
    paths = [path for library in LIBRARIES for path in
             ([TRAY / library] if library.endswith(".py") else sorted((TRAY / library).rglob("*.py")))]
    _report("libraries importing more than tray's public API", _scan(paths, library_violations))


def import_graph(files: dict[str, tuple[str, str]]) -> dict[str, set[str]]:
    """module -> the tray modules it imports; ``files`` maps a module name to
    (its package, its source)."""
    graph = {}
    for module, (package, source) in files.items():
        edges = set()
        for imp in imports_of(source, package):
            for target in reversed(imp.targets()):  # module.name first: a submodule
                while target and target not in files:
                    target = target.rpartition(".")[0]
                if target:
                    break
            if target and target != module:
                edges.add(target)
        graph[module] = edges
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The graph's strongly connected components of more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in sorted(graph.get(node, ())):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                other = stack.pop()
                on_stack.discard(other)
                component.append(other)
                if other == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10 * len(graph) + 100))
    try:
        for node in sorted(graph):
            if node not in index:
                visit(node)
    finally:
        sys.setrecursionlimit(limit)
    return found


def test_the_import_graph_has_no_circle():
    files = {_module_name(path): (_package_of(path), path.read_text(encoding="utf-8"))
             for path in tray_files()}
    graph = import_graph(files)
    found = circles(graph)
    if found:
        lines = []
        for component in found:
            members = set(component)
            lines.append("  " + ", ".join(component))
            lines += [f"    {a} -> {b}" for a in component for b in sorted(graph[a] & members)]
        pytest.fail("import circles in tray/:\n" + "\n".join(lines), pytrace=False)


# ------------------------------------------------------------------ planted violations

PLANTED_CORE = {
    "from tray import runtime_env": "above the core",
    "from ...runtime_env import ENV_KV_PREFIX": "above the core",
    "def f():\n    from ...util.scheduling_strategies import X": "above the core",
    "from ... import _bridges": "above the core",
    "import tray.api": "above the core",
    "import trio._core._run as r": "not trio's public API",
    "from trio._core import _run": "not trio's public API",
    "import trio.from_thread": "not trio's public API",
    "from trio import from_thread": "not trio's public API",
    "import trio_asyncio": "not allowed in the core",
    "import numpy": "not allowed in the core",
    "import socket": "not allowed in the core",
    "import os\nx = os.environ.get('TRAY_X')": "reads the environment",
    "import os\nx = os.getenv('TRAY_X')": "reads the environment",
    "import trio\nx = trio.lowlevel._private": "trio's private",
}


@pytest.mark.parametrize("snippet", list(PLANTED_CORE), ids=range(len(PLANTED_CORE)))
def test_the_core_check_flags_a_planted_violation(snippet):
    problems = core_violations(snippet, "tray.core.worker")
    assert any(PLANTED_CORE[snippet] in problem for problem in problems), problems


def test_the_core_check_passes_clean_core_code():
    clean = ("from __future__ import annotations\nimport os.path\nimport trio\n"
             "from trio import lowlevel\nimport greenback\nfrom ... import exceptions\n"
             "from ..ids import TaskID\nfrom .. import rpc\nx = os.path.join('a', 'b')\n")
    assert core_violations(clean, "tray.core.worker") == []


@pytest.mark.parametrize("snippet", [
    "from ...core.api import _block",
    "from tray.core.context import _global_state",
    "def f():\n    from ...core.worker.actor_host import _Slot",
])
def test_the_private_name_check_flags_a_planted_violation(snippet):
    assert outside_core_violations(snippet, "tray.util.state")


def test_the_private_name_check_passes_public_names():
    assert outside_core_violations("from ..core.context import get_worker, __doc__\n"
                                   "from ..api.blocking import block", "tray.util") == []


@pytest.mark.parametrize("snippet", [
    "import trio._core._run as _trio_run",
    "from trio._core._run import GLOBAL_RUN_CONTEXT",
    "from trio import _core",
    "import trio\nx = trio._core._run.GLOBAL_RUN_CONTEXT",
    "import trio\ndef f(runner):\n    return trio.lowlevel._private_thing",
])
def test_the_trio_check_flags_a_planted_violation(snippet):
    assert trio_private_violations(snippet, "tray.transports")


def test_the_trio_check_passes_public_trio():
    assert trio_private_violations("import trio\nfrom trio import lowlevel\n"
                                   "x = trio.lowlevel.current_task()", "tray.api") == []


@pytest.mark.parametrize("snippet", [
    "from tray.core.context import get_worker",
    "from ..core import rpc",
    "import tray.backends.sim",
    "from tray.serve._handle import Router",
    "from ..serve._context import x",
    "from tray.api.blocking import _private",
    "from tray.simtest.runner import run",
])
def test_the_library_check_flags_a_planted_violation(snippet):
    assert library_violations(snippet, "tray.data")


def test_the_library_check_passes_public_imports_and_its_own_private_modules():
    clean = ("import tray\nfrom tray import exceptions\nfrom tray.util import ActorPool\n"
             "from . import _dataset\nfrom ._executor import Executor\n"
             "from tray.data._plan import Plan\nfrom tray.api.blocking import block\n"
             "import tray.simtest\n")
    assert library_violations(clean, "tray.data") == []


def test_the_circle_check_finds_a_planted_circle_and_only_it():
    files = {
        "tray.a": ("tray", "from . import b\n"),
        "tray.b": ("tray", "def f():\n    from .c import x\n"),  # inside a function counts
        "tray.c": ("tray", "from .a import y\n"),
        "tray.d": ("tray", "from . import a\n"),  # into the circle, not part of it
    }
    assert circles(import_graph(files)) == [["tray.a", "tray.b", "tray.c"]]
    files["tray.c"] = ("tray", "import json\n")
    assert circles(import_graph(files)) == []
