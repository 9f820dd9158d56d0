"""Setting a runtime_env up on a node: packages unpacked, pip envs built,
each once per node however many workers ask at the same time.

Everything lives under the node's cache directory (the session's
``runtime_resources/``): ``pkg/<hash>/`` per package (working_dir or
py_modules entry) and ``pip/<hash>/`` per distinct pip spec (a virtualenv
made with ``--system-site-packages``, so what the worker already imports
stays importable, with the spec installed into it by the pip of the
workers' Python). A directory is complete once it is in place (a package:
unpacked elsewhere, then renamed) or holds ``.tray-ready`` (a pip env), so a
crash half-way leaves nothing another worker would trust. Workers that ask
for the same thing at once queue on a lock file (``fcntl.flock``, polled so
that a timeout can interrupt the wait) and the first one builds it; the
others find it done. A failed pip install is not cached: the tasks that
needed it fail with ``RuntimeEnvSetupError`` carrying pip's output, and the
next task asking tries again (the requirement may exist by then).

Only the worker that needs the env pays for it, on its first task;
``config.setup_timeout_seconds`` bounds the whole setup."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import shutil
import site
import sys
from dataclasses import dataclass

import trio

from ..exceptions import RuntimeEnvSetupError
from .packaging import KV_PREFIX, package_hash, unpack

LOCK_POLL_S = 0.05
PIP_OUTPUT_MAX_CHARS = 4000


@dataclass(frozen=True)
class Prepared:
    """What a worker applies: sys.path entries (first = first), cwd, env vars."""
    sys_path: tuple
    cwd: str | None
    env_vars: dict


@contextlib.asynccontextmanager
async def _file_lock(path: str):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as error:
                if error.errno not in (errno.EAGAIN, errno.EACCES):
                    raise
                await trio.sleep(LOCK_POLL_S)
        yield
    finally:
        os.close(fd)  # (releases the lock)


async def ensure_package(uri: str, cache_dir: str, fetch) -> str:
    """The directory holding package ``uri`` on this node, unpacked on first
    use; ``fetch(key)`` reads the cluster's key-value store."""
    target = os.path.join(cache_dir, "pkg", package_hash(uri))
    if os.path.isdir(target):
        return target
    async with _file_lock(target + ".lock"):
        if os.path.isdir(target):
            return target
        data = await fetch(KV_PREFIX + uri)
        if data is None:
            raise RuntimeEnvSetupError(f"the package {uri} is not stored in the cluster (was "
                                       "it uploaded to another cluster?)")
        partial = f"{target}.partial-{os.getpid()}"
        shutil.rmtree(partial, ignore_errors=True)
        try:
            unpack(data, partial)
        except Exception as error:
            shutil.rmtree(partial, ignore_errors=True)
            raise RuntimeEnvSetupError(f"could not unpack {uri}: {error}") from error
        os.rename(partial, target)
    return target


def pip_hash(pip: dict) -> str:
    return hashlib.sha256(json.dumps(pip, sort_keys=True).encode()).hexdigest()[:32]


def _site_packages(venv: str) -> str:
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    return os.path.join(venv, "lib", version, "site-packages")


async def _run(command: list, what: str) -> None:
    result = await trio.run_process(command, capture_stdout=True, capture_stderr=True,
                                    check=False, stdin=b"")
    if result.returncode != 0:
        output = (result.stderr or b"").decode(errors="replace").strip() or \
            (result.stdout or b"").decode(errors="replace").strip()
        if len(output) > PIP_OUTPUT_MAX_CHARS:
            output = "..." + output[-PIP_OUTPUT_MAX_CHARS:]
        raise RuntimeEnvSetupError(f"{what} failed (exit code {result.returncode}):\n{output}")


def _inherit_parent_env(venv: str) -> None:
    """``--system-site-packages`` shows a virtualenv the base Python's
    packages, not those of the virtualenv tray itself runs in (tray, trio,
    numpy...): a ``.pth`` file adds those after the env's own, so a job's
    driver or a worker in the env imports what the node's Python can (a pip
    job's ``import tray`` failed on a machine whose base Python lacks it)."""
    if sys.prefix == sys.base_prefix:
        return  # tray runs in the base Python: --system-site-packages is it
    lines = "".join(f"import site; site.addsitedir({path!r})\n"
                    for path in site.getsitepackages() if os.path.isdir(path))
    with open(os.path.join(_site_packages(venv), "_tray_parent_env.pth"), "w") as file:
        file.write(lines)


async def ensure_pip(pip: dict, cache_dir: str, python: str = sys.executable) -> str:
    """The site-packages directory of the virtualenv for ``pip`` on this
    node, created and installed on first use."""
    venv = os.path.join(cache_dir, "pip", pip_hash(pip))
    ready = os.path.join(venv, ".tray-ready")
    if os.path.exists(ready):
        return _site_packages(venv)
    async with _file_lock(venv + ".lock"):
        if os.path.exists(ready):
            return _site_packages(venv)
        shutil.rmtree(venv, ignore_errors=True)  # a crashed or failed attempt
        try:
            await _run([python, "-m", "venv", "--system-site-packages", "--without-pip", venv],
                       "creating the virtualenv")
            if python == sys.executable:
                _inherit_parent_env(venv)
            await _run([python, "-m", "pip", "--python", os.path.join(venv, "bin", "python"),
                        "install", "--disable-pip-version-check", "--no-input",
                        *pip.get("pip_install_options", []), *pip["packages"]],
                       f"pip install {' '.join(pip['packages'])}")
            if pip.get("pip_check"):
                await _run([python, "-m", "pip", "--python",
                            os.path.join(venv, "bin", "python"), "check"], "pip check")
        except BaseException:
            shutil.rmtree(venv, ignore_errors=True)
            raise
        with open(ready, "w"):
            pass
    return _site_packages(venv)


async def prepare(env: dict, cache_dir: str, fetch) -> Prepared:
    """Everything ``env`` needs on this node; raises ``RuntimeEnvSetupError``."""
    paths = []
    cwd = None
    if env.get("working_dir"):
        cwd = await ensure_package(env["working_dir"], cache_dir, fetch)
        paths.append(cwd)
    for uri in env.get("py_modules", []):
        paths.append(await ensure_package(uri, cache_dir, fetch))
    if env.get("pip"):
        paths.append(await ensure_pip(env["pip"], cache_dir))
    return Prepared(tuple(paths), cwd, dict(env.get("env_vars") or {}))


async def prepare_with_timeout(env: dict, cache_dir: str, fetch) -> Prepared:
    from . import DEFAULT_SETUP_TIMEOUT_S

    timeout = (env.get("config") or {}).get("setup_timeout_seconds", DEFAULT_SETUP_TIMEOUT_S)
    if timeout == -1:
        return await prepare(env, cache_dir, fetch)
    with trio.move_on_after(timeout) as scope:
        return await prepare(env, cache_dir, fetch)
    assert scope.cancelled_caught
    raise RuntimeEnvSetupError(f"setting up the runtime_env took more than "
                               f"setup_timeout_seconds={timeout}")
