"""The layer rule of ARCHITECTURE.md section 1, enforced by reading the source.

``tray/core`` imports nothing from ``tray/transports`` or ``tray/backends``,
opens no socket, starts no thread or process, reads no wall clock, and draws
no randomness except through what it is handed (a ``random.Random`` instance
is fine: constructing or annotating one is how the injected generator is
typed and split).

The scanner works on the ``ast`` of every ``.py`` file under ``tray/core`` so
that a violation is reported as ``path:line: what`` and a reviewer can jump to
it.  It follows import aliases (``import time as t`` then ``t.monotonic()``),
``from``-imports (``from time import monotonic``), relative imports
(``from ..backends import sim``) and string imports through
``importlib.import_module`` / ``__import__``.  A self-check plants known-bad
snippets to prove that the scanner can fail.
"""

from __future__ import annotations

import ast
import dataclasses
import textwrap
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
CORE_DIR = REPO_ROOT / "tray" / "core"

# ---------------------------------------------------------------------------
# What is forbidden
# ---------------------------------------------------------------------------

# Module prefixes that must not be imported at all (the module or any submodule).
FORBIDDEN_MODULES: dict[str, str] = {
    "tray.transports": "core must not import a transport (reach it through the Transport interface)",
    "tray.backends": "core must not import a backend (backends are looked up by name)",
    "socket": "core opens no socket",
    "ssl": "core opens no socket",
    "selectors": "core does no I/O multiplexing of its own",
    "asyncio": "core runs on trio only",
    "threading": "core starts no thread",
    "_thread": "core starts no thread",
    "concurrent.futures": "core starts no thread or process pool",
    "subprocess": "core starts no process",
    "multiprocessing": "core starts no process",
    "redis": "GCS storage is injected, core does not talk to Redis",
    "uuid": "IDs come from counters and the injected RNG, never uuid",
    "secrets": "core draws no OS randomness",
    "trio.socket": "core opens no socket",
}

# Attributes of a module that must not be used, by module.  ``None`` means
# "every attribute except those in ALLOWED_ATTRIBUTES".
FORBIDDEN_ATTRIBUTES: dict[str, set[str] | None] = {
    "time": {
        "time", "time_ns", "monotonic", "monotonic_ns", "perf_counter",
        "perf_counter_ns", "process_time", "process_time_ns", "thread_time",
        "thread_time_ns", "sleep", "clock_gettime", "clock_gettime_ns",
        "localtime", "gmtime", "ctime", "asctime", "strftime",
    },
    "random": None,
    "os": {
        "urandom", "getrandom", "fork", "forkpty", "system", "popen",
        "spawnl", "spawnle", "spawnlp", "spawnlpe", "spawnv", "spawnve",
        "spawnvp", "spawnvpe", "posix_spawn", "posix_spawnp",
        "execl", "execle", "execlp", "execlpe", "execv", "execve", "execvp", "execvpe",
    },
    "datetime": {"now", "utcnow", "today"},
    "datetime.datetime": {"now", "utcnow", "today"},
    "datetime.date": {"today"},
    "trio": {
        "to_thread", "socket", "open_tcp_stream", "open_tcp_listeners", "serve_tcp",
        "open_ssl_over_tcp_stream", "open_ssl_over_tcp_listeners", "serve_ssl_over_tcp",
        "open_unix_socket", "run_process", "open_process",
    },
    "trio.lowlevel": {"start_thread_soon"},
}

ALLOWED_ATTRIBUTES: dict[str, set[str]] = {
    # The injected generator's type: constructing one from a handed-in seed
    # (or annotating with it) is how the core splits its randomness.
    "random": {"Random"},
}


def _attribute_is_forbidden(module: str, attribute: str) -> bool:
    if module not in FORBIDDEN_ATTRIBUTES:
        return False
    if attribute in ALLOWED_ATTRIBUTES.get(module, set()):
        return False
    forbidden = FORBIDDEN_ATTRIBUTES[module]
    return forbidden is None or attribute in forbidden


def _forbidden_module_reason(module: str) -> str | None:
    for prefix, reason in FORBIDDEN_MODULES.items():
        if module == prefix or module.startswith(prefix + "."):
            return reason
    return None


# ---------------------------------------------------------------------------
# The scanner
# ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Violation:
    path: str
    line: int
    what: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.what}"


def _resolve_relative(module: str | None, level: int, package: str) -> str:
    """The absolute module name of ``from <level dots><module> import ...``
    written inside ``package``."""
    if level == 0:
        return module or ""
    parts = package.split(".") if package else []
    if level - 1 > len(parts):
        return module or ""
    base_parts = parts[: len(parts) - (level - 1)]
    if module:
        base_parts = base_parts + module.split(".")
    return ".".join(base_parts)


def _dotted_name(node: ast.AST) -> list[str] | None:
    """``a.b.c`` -> ["a", "b", "c"]; None for anything not a plain dotted name."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return list(reversed(parts))
    return None


class _Scanner(ast.NodeVisitor):
    def __init__(self, path: str, package: str) -> None:
        self.path = path
        self.package = package
        self.violations: list[Violation] = []
        # local name -> the module (or module attribute, "time.monotonic") it is bound to
        self.bindings: dict[str, str] = {}

    def _flag(self, node: ast.AST, what: str) -> None:
        self.violations.append(Violation(self.path, getattr(node, "lineno", 0), what))

    def _check_module(self, node: ast.AST, module: str, how: str) -> None:
        reason = _forbidden_module_reason(module)
        if reason is not None:
            self._flag(node, f"{how} imports {module!r} ({reason})")

    # -- imports ------------------------------------------------------------

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._check_module(node, alias.name, "`import`")
            if alias.asname:
                self.bindings[alias.asname] = alias.name
            else:
                # `import a.b.c` binds `a`; attribute chains resolve through it.
                top = alias.name.split(".")[0]
                self.bindings[top] = top
        self.generic_visit(node)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        module = _resolve_relative(node.module, node.level, self.package)
        shown = "." * node.level + (node.module or "")
        self._check_module(node, module, f"`from {shown} import`")
        module_forbidden = _forbidden_module_reason(module) is not None
        for alias in node.names:
            if alias.name == "*":
                continue
            self.bindings[alias.asname or alias.name] = (
                f"{module}.{alias.name}" if module else alias.name
            )
            if module_forbidden:
                continue  # already reported once for the whole statement
            full = f"{module}.{alias.name}" if module else alias.name
            # `from tray import backends`, `from .. import transports`,
            # `from time import monotonic`, `from random import randint` ...
            reason = _forbidden_module_reason(full)
            if reason is not None:
                self._flag(node, f"`from {shown} import {alias.name}` imports {full!r} ({reason})")
            elif _attribute_is_forbidden(module, alias.name):
                self._flag(node, f"`from {shown} import {alias.name}` uses forbidden {full}")
        self.generic_visit(node)

    # -- attribute use ------------------------------------------------------

    def _resolve(self, dotted: list[str]) -> str | None:
        head = dotted[0]
        if head not in self.bindings:
            return None
        return ".".join([self.bindings[head], *dotted[1:]])

    def visit_Attribute(self, node: ast.Attribute) -> None:
        dotted = _dotted_name(node)
        if dotted is not None:
            full = self._resolve(dotted)
            if full is not None:
                # Check every prefix split: for `datetime.datetime.now` both
                # ("datetime.datetime", "now") and ("datetime", "datetime").
                parts = full.split(".")
                for i in range(1, len(parts)):
                    module, attribute = ".".join(parts[:i]), parts[i]
                    if _attribute_is_forbidden(module, attribute):
                        self._flag(node, f"uses forbidden {module}.{attribute}")
                        break
                    reason = _forbidden_module_reason(".".join(parts[: i + 1]))
                    if reason is not None:
                        self._flag(node, f"uses {'.'.join(parts[: i + 1])} ({reason})")
                        break
            # Do not descend: the inner Attribute nodes are prefixes of this one.
            return
        self.generic_visit(node)

    def visit_Name(self, node: ast.Name) -> None:
        # A bare name bound by `from time import monotonic` is flagged at the
        # import; nothing more to do here.
        self.generic_visit(node)

    # -- dynamic imports ----------------------------------------------------

    def visit_Call(self, node: ast.Call) -> None:
        dotted = _dotted_name(node.func)
        if dotted is not None and node.args and isinstance(node.args[0], ast.Constant):
            target = node.args[0].value
            full = self._resolve(dotted) or ".".join(dotted)
            if isinstance(target, str) and full in (
                "importlib.import_module",
                "__import__",
            ):
                module = target
                if target.startswith("."):
                    stripped = target.lstrip(".")
                    module = _resolve_relative(stripped, len(target) - len(stripped), self.package)
                self._check_module(node, module, f"`{'.'.join(dotted)}({target!r})`")
        self.generic_visit(node)


def _package_of(path: Path, root: Path) -> str:
    rel = path.relative_to(root).with_suffix("")
    # Both for `pkg/__init__.py` and `pkg/mod.py` the containing package is
    # the directory: that is what a relative import's first dot refers to.
    return ".".join(rel.parts[:-1])


def scan_source(source: str, path: str = "<string>", package: str = "tray.core") -> list[Violation]:
    """Every layer-rule violation in one module's source."""
    tree = ast.parse(source, filename=path)
    scanner = _Scanner(path, package)
    scanner.visit(tree)
    return sorted(scanner.violations, key=lambda v: (v.path, v.line, v.what))


def core_files() -> list[Path]:
    return sorted(CORE_DIR.rglob("*.py"))


def scan_core() -> list[Violation]:
    violations: list[Violation] = []
    for path in core_files():
        rel = path.relative_to(REPO_ROOT).as_posix()
        package = _package_of(path, REPO_ROOT)
        violations.extend(scan_source(path.read_text(encoding="utf-8"), rel, package))
    return violations


# ---------------------------------------------------------------------------
# The rule, on the real tree
# ---------------------------------------------------------------------------


def test_core_directory_has_python_files():
    # Guards against the rule passing vacuously (e.g. after a rename of tray/core).
    files = core_files()
    assert CORE_DIR.is_dir(), f"{CORE_DIR} does not exist"
    assert files, f"no .py files under {CORE_DIR}"
    assert (CORE_DIR / "__init__.py") in files, "tray/core is not a package"


def test_core_obeys_the_layer_rule():
    violations = scan_core()
    if violations:
        listing = "\n".join(f"  {v}" for v in violations)
        pytest.fail(
            f"tray/core breaks the layer rule (ARCHITECTURE.md section 1) "
            f"in {len(violations)} place(s):\n{listing}",
            pytrace=False,
        )


def test_every_core_file_parses():
    for path in core_files():
        ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


# ---------------------------------------------------------------------------
# Self-checks: the scanner must be able to fail
# ---------------------------------------------------------------------------

BAD_SNIPPETS = {
    "import tray.transports.sim": "tray.transports",
    "import tray.backends": "tray.backends",
    "from tray.backends.sim import SimBackend": "tray.backends",
    "from tray import transports": "tray.transports",
    "from ..transports import sim": "tray.transports",
    "from .. import backends": "tray.backends",
    "from ..backends.sim import x": "tray.backends",
    "import socket": "socket",
    "from socket import socketpair": "socket",
    "import threading": "threading",
    "from threading import Thread": "threading",
    "import _thread": "_thread",
    "from concurrent.futures import ThreadPoolExecutor": "concurrent.futures",
    "import subprocess": "subprocess",
    "import multiprocessing as mp": "multiprocessing",
    "import redis": "redis",
    "import uuid": "uuid",
    "from uuid import uuid4": "uuid",
    "import selectors": "selectors",
    "import asyncio": "asyncio",
    "import time\nt = time.time()": "time.time",
    "import time\nt = time.monotonic()": "time.monotonic",
    "import time\nt = time.perf_counter()": "time.perf_counter",
    "import time\ntime.sleep(1)": "time.sleep",
    "import time as _t\nclock = _t.monotonic": "time.monotonic",
    "from time import monotonic": "time.monotonic",
    "from time import sleep as nap": "time.sleep",
    "import time\ndef g(now=time.time):\n    return now()": "time.time",
    "import random\nx = random.random()": "random.random",
    "import random\nx = random.randint(1, 2)": "random.randint",
    "import random\nrandom.shuffle([1])": "random.shuffle",
    "import random\nrandom.seed(0)": "random.seed",
    "import random\nx = random.choice([1])": "random.choice",
    "import random\nx = random.uniform(0, 1)": "random.uniform",
    "import random\nr = random.SystemRandom()": "random.SystemRandom",
    "from random import randint": "random.randint",
    "import os\nb = os.urandom(8)": "os.urandom",
    "from os import urandom": "os.urandom",
    "import os\nos.fork()": "os.fork",
    "import datetime\nd = datetime.datetime.now()": "datetime.datetime.now",
    "from datetime import datetime\nd = datetime.now()": "datetime.datetime.now",
    "import trio\nawait_me = trio.to_thread.run_sync": "trio.to_thread",
    "import trio\ns = trio.open_tcp_stream": "trio.open_tcp_stream",
    "import trio\np = trio.run_process": "trio.run_process",
    "import trio.socket": "trio.socket",
    "import importlib\nm = importlib.import_module('tray.backends.sim')": "tray.backends",
    "m = __import__('socket')": "socket",
    "import importlib\nm = importlib.import_module('..transports', 'tray.core')": "tray.transports",
}


@pytest.mark.parametrize("snippet", list(BAD_SNIPPETS), ids=list(range(len(BAD_SNIPPETS))))
def test_scanner_flags_planted_violation(snippet):
    violations = scan_source(snippet, "tray/core/planted.py", "tray.core")
    assert violations, f"scanner missed a violation in:\n{snippet}"
    expected = BAD_SNIPPETS[snippet]
    text = "\n".join(str(v) for v in violations)
    assert expected in text, f"expected {expected!r} in the report, got:\n{text}"
    for v in violations:
        assert str(v).startswith("tray/core/planted.py:"), str(v)
        assert v.line >= 1


def test_scanner_reports_file_and_line():
    source = textwrap.dedent(
        """\
        import trio

        def stamp():
            import time
            return time.time()
        """
    )
    violations = scan_source(source, "tray/core/stamp.py", "tray.core")
    assert [str(v) for v in violations] == [
        "tray/core/stamp.py:5: uses forbidden time.time"
    ]


def test_scanner_relative_import_depends_on_package_depth():
    # From tray/core/gcs/service.py, `..` is tray.core and `...` is tray.
    ok = scan_source("from ..ids import TaskID", "tray/core/gcs/service.py", "tray.core.gcs")
    assert ok == []
    bad = scan_source("from ...backends import sim", "tray/core/gcs/service.py", "tray.core.gcs")
    assert len(bad) == 1 and "tray.backends" in bad[0].what


CLEAN_SNIPPET = textwrap.dedent(
    """\
    from __future__ import annotations

    import hashlib
    import random
    import os
    import trio
    from random import Random

    from .ids import TaskID
    from . import serialization
    from ..exceptions import TaskError


    class Scheduler:
        def __init__(self, rng: random.Random, clock) -> None:
            self.rng = rng
            self.child = random.Random(rng.getrandbits(64))
            self.other = Random(7)
            self.clock = clock

        async def tick(self):
            now = trio.current_time()
            await trio.sleep(0.1)
            self.rng.shuffle([1, 2, 3])
            path = os.path.join("a", "b")
            return hashlib.sha1(b"x").hexdigest(), now, path, self.rng.random()

    def time(x):
        return x  # a local function named like a module is not the module
    """
)


def test_scanner_accepts_clean_core_code():
    violations = scan_source(CLEAN_SNIPPET, "tray/core/clean.py", "tray.core")
    assert violations == [], "\n".join(str(v) for v in violations)


def test_scan_of_planted_file_in_a_tree(tmp_path):
    # The directory walk and path reporting, end to end, on a fake tree.
    core = tmp_path / "tray" / "core"
    (core / "sub").mkdir(parents=True)
    (core / "__init__.py").write_text("")
    (core / "sub" / "__init__.py").write_text("")
    (core / "sub" / "bad.py").write_text("x = 1\nfrom ...transports.sim import Net\n")
    found = []
    for path in sorted(core.rglob("*.py")):
        rel = path.relative_to(tmp_path).as_posix()
        found.extend(scan_source(path.read_text(), rel, _package_of(path, tmp_path)))
    assert [str(v).split(": ")[0] for v in found] == ["tray/core/sub/bad.py:2"]
    assert "tray.transports.sim" in found[0].what
