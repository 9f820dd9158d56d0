"""Runtime environments, as Ray's: what a task or actor needs around it —
environment variables, code (``working_dir``, ``py_modules``) and packages
(``pip``) — named where it is submitted and set up on the node that runs it.

A ``runtime_env`` is a dict (or a ``RuntimeEnv``, a dict with Ray's
keyword constructor) given to ``tray.init(runtime_env=...)`` for the whole
job, or to ``@tray.remote(runtime_env=...)`` / ``.options(runtime_env=...)``
for one task or actor. Keys (Ray's names):

* ``env_vars``: ``{name: value}``, strings only, set before user code runs;
* ``working_dir``: a local directory or ``.zip`` (or a package URI made by
  ``package_working_dir``); packed and stored in the cluster once, unpacked
  once per node, the worker's cwd and first ``sys.path`` entry;
* ``py_modules``: a list of local package directories, ``.whl``/``.zip``
  files, imported modules or package URIs, each shipped the same way and
  put on ``sys.path``;
* ``excludes``: gitignore-style patterns left out of ``working_dir`` and
  ``py_modules`` directories;
* ``pip``: a list of requirements, a requirements file's path, or
  ``{"packages": ..., "pip_check": bool, "pip_install_options": [...]}``:
  installed into a virtualenv per distinct spec, cached on each node;
* ``config``: ``{"setup_timeout_seconds": int}`` (-1: no limit; 600 by
  default, as Ray's).

**Checked early.** ``validate`` runs at decoration / ``.options()`` /
``init`` time: an unknown key is a ``ValueError`` naming the valid ones, a
value of the wrong type a ``TypeError``. Whether local paths exist is
checked when the env is first used (``.remote()``/``init``), since a
decorator may run again on a machine without them.

**Inheritance** (Ray's rule, ``merge``): a task's env starts from the env of
whatever submits it (the job's, or the parent task's); each key the child
names replaces the parent's, except ``env_vars``, merged name by name (the
child's value wins).

**Resolved once.** Before a task leaves its submitter, local paths are
packed (``packaging``) and uploaded to the GCS key-value store, so the env
a task carries names only content hashes: two tasks with the same env carry
equal dicts, which hash (``env_hash``) to the same worker pool on every
node. A worker set up for one env never runs a task of another
(``WorkerPool``). Setting an env up on a node is ``setup.py``."""

from __future__ import annotations

import hashlib
import json
import os
import types

from ..core.runtime_env_keys import ENV_KV_PREFIX, env_hash
from .packaging import (
    DEFAULT_MAX_PACKAGE_BYTES,
    KV_PREFIX,
    URI_PREFIX,
    Package,
    is_package_uri,
    pack_directory,
    package_hash,
)

__all__ = ["RuntimeEnv", "RuntimeEnvConfig", "validate", "merge", "env_hash", "pack_directory", "Package",
           "package_working_dir", "upload_package", "resolve", "is_package_uri",
           "package_hash", "URI_PREFIX", "KV_PREFIX", "DEFAULT_MAX_PACKAGE_BYTES",
           "DEFAULT_SETUP_TIMEOUT_S", "current", "store_env", "ENV_KV_PREFIX"]

KNOWN_KEYS = ("env_vars", "working_dir", "py_modules", "excludes", "pip", "config")
# Ray's other keys: refused with the reason, never accepted and ignored.
NOT_SUPPORTED = {
    "conda": "conda environments are not supported; use 'pip'",
    "uv": "uv environments are not supported; use 'pip'",
    "container": "containers are not supported",
    "image_uri": "container images are not supported",
    "java_jars": "tray runs Python only",
    "nsight": "nsight profiling is not supported",
    "mpi": "MPI is not supported",
    "worker_process_setup_hook": "worker_process_setup_hook is not supported yet",
}
PIP_KEYS = ("packages", "pip_check", "pip_install_options", "pip_version")
CONFIG_KEYS = ("setup_timeout_seconds", "eager_install")
DEFAULT_SETUP_TIMEOUT_S = 600


class RuntimeEnv(dict):
    """Ray's ``RuntimeEnv``: a dict built from keyword arguments, checked."""

    def __init__(self, *, env_vars=None, working_dir=None, py_modules=None, excludes=None,
                 pip=None, config=None, **other) -> None:
        given = dict(env_vars=env_vars, working_dir=working_dir, py_modules=py_modules,
                     excludes=excludes, pip=pip, config=config, **other)
        super().__init__({key: value for key, value in given.items() if value is not None})
        validate(self)


class RuntimeEnvConfig(dict):
    """Ray's ``RuntimeEnvConfig``: the ``config`` entry, as a checked dict."""

    def __init__(self, setup_timeout_seconds: int = DEFAULT_SETUP_TIMEOUT_S,
                 eager_install: bool = False) -> None:
        super().__init__(setup_timeout_seconds=setup_timeout_seconds,
                         eager_install=eager_install)
        validate({"config": self})


def _type_error(key: str, value, expected: str) -> TypeError:
    return TypeError(f"runtime_env[{key!r}] must be {expected}, but got a "
                     f"{type(value).__name__}: {value!r}")


def _path_like(value) -> bool:
    return isinstance(value, (str, os.PathLike))


def validate(runtime_env) -> dict:
    """Check a runtime_env's keys and value types; returns it as a plain dict.

    ``None`` is an empty env. Raises ``TypeError`` (not a dict, a value of
    the wrong type) or ``ValueError`` (an unknown key, an empty value where
    one is needed); Ray's keys tray does not support raise
    ``NotImplementedError`` with the reason."""
    if runtime_env is None:
        return {}
    if not isinstance(runtime_env, dict):
        raise TypeError(f"runtime_env must be a dict, got a {type(runtime_env).__name__}: "
                        f"{runtime_env!r}")
    for key in runtime_env:
        if key in NOT_SUPPORTED and runtime_env[key] not in (None, [], {}, ""):
            raise NotImplementedError(f"runtime_env[{key!r}]: {NOT_SUPPORTED[key]}")
        if key not in KNOWN_KEYS and key not in NOT_SUPPORTED:
            raise ValueError(f"unknown runtime_env key {key!r}; valid keys are "
                             f"{', '.join(KNOWN_KEYS)}")
    env = {key: value for key, value in runtime_env.items()
           if key in KNOWN_KEYS and value is not None}
    env_vars = env.get("env_vars")
    if env_vars is not None:
        if not isinstance(env_vars, dict):
            raise _type_error("env_vars", env_vars, "a dict of str -> str")
        for name, value in env_vars.items():
            if not isinstance(name, str) or not isinstance(value, str):
                raise TypeError(f"runtime_env['env_vars'] must map strings to strings, but "
                                f"{name!r} -> {value!r} is a {type(name).__name__} -> "
                                f"{type(value).__name__}")
            if not name or "=" in name or "\0" in name or "\0" in value:
                raise ValueError(f"runtime_env['env_vars']: {name!r} is not a valid "
                                 "environment variable name (or its value holds a NUL)")
    if "working_dir" in env and not _path_like(env["working_dir"]):
        raise _type_error("working_dir", env["working_dir"],
                          "a path to a local directory or .zip file")
    modules = env.get("py_modules")
    if modules is not None:
        if not isinstance(modules, (list, tuple)):
            raise _type_error("py_modules", modules, "a list of paths or modules")
        for module in modules:
            if not (_path_like(module) or isinstance(module, types.ModuleType)):
                raise _type_error("py_modules", module,
                                  "a list of paths (directories, .whl or .zip files) or "
                                  "imported modules")
    excludes = env.get("excludes")
    if excludes is not None and (not isinstance(excludes, (list, tuple)) or
                                 not all(isinstance(p, str) for p in excludes)):
        raise _type_error("excludes", excludes, "a list of strings (gitignore-style patterns)")
    if "pip" in env:
        _validate_pip(env["pip"])
    config = env.get("config")
    if config is not None:
        if not isinstance(config, dict):
            raise _type_error("config", config, "a dict")
        for key in config:
            if key not in CONFIG_KEYS:
                raise ValueError(f"unknown runtime_env['config'] key {key!r}; valid keys are "
                                 f"{', '.join(CONFIG_KEYS)}")
        timeout = config.get("setup_timeout_seconds")
        if timeout is not None:
            if isinstance(timeout, bool) or not isinstance(timeout, int):
                raise _type_error("config']['setup_timeout_seconds", timeout, "an integer")
            if timeout != -1 and timeout <= 0:
                raise ValueError("runtime_env['config']['setup_timeout_seconds'] must be a "
                                 f"positive integer or -1 (no limit), got {timeout}")
        if not isinstance(config.get("eager_install", False), bool):
            raise _type_error("config']['eager_install", config["eager_install"], "a bool")
        if config.get("eager_install"):
            raise NotImplementedError("runtime_env['config']['eager_install']=True is not "
                                      "supported: an env is set up on a node when a worker "
                                      "there first needs it (eager_install=False)")
    return env


def _validate_pip(pip) -> None:
    if isinstance(pip, (list, tuple)):
        packages = pip
    elif _path_like(pip):
        return  # a requirements file: read (and checked) when the env is resolved
    elif isinstance(pip, dict):
        for key in pip:
            if key not in PIP_KEYS:
                raise ValueError(f"unknown runtime_env['pip'] key {key!r}; valid keys are "
                                 f"{', '.join(PIP_KEYS)}")
        if "pip_version" in pip:
            raise NotImplementedError("runtime_env['pip']['pip_version'] is not supported: "
                                      "environments use the pip of the Python workers run")
        packages = pip.get("packages", [])
        if _path_like(packages):
            packages = []
        if not isinstance(pip.get("pip_check", False), bool):
            raise _type_error("pip']['pip_check", pip["pip_check"], "a bool")
        options = pip.get("pip_install_options", [])
        if not isinstance(options, (list, tuple)) or \
                not all(isinstance(o, str) for o in options):
            raise _type_error("pip']['pip_install_options", options, "a list of strings")
    else:
        raise _type_error("pip", pip, "a list of requirements, a requirements file's path "
                          "or a dict with 'packages'")
    if not isinstance(packages, (list, tuple)) or \
            not all(isinstance(p, str) and p.strip() for p in packages):
        raise _type_error("pip", packages, "a list of non-empty requirement strings")


def merge(parent: dict | None, child: dict | None) -> dict:
    """Ray's inheritance: ``child``'s keys replace ``parent``'s, except
    ``env_vars``, merged by name (the child's value wins)."""
    merged = dict(parent or {})
    for key, value in (child or {}).items():
        if key == "env_vars" and merged.get("env_vars"):
            merged["env_vars"] = {**merged["env_vars"], **(value or {})}
        else:
            merged[key] = value
    return {key: value for key, value in merged.items() if value not in (None, {}, [])}


# ------------------------------------------------------------ resolution

# What this process packed and uploaded to its cluster: (kind, path,
# excludes) -> uri, and the URIs known stored; emptied at each init. A
# directory is packed once per cluster connection (as Ray packs once per
# job); files changed later in it are not seen. Bounded by the distinct
# directories a program names.
_packed: dict[tuple, str] = {}
_uploaded: set[str] = set()


def store_env(resolved: dict, upload) -> str:
    """Store a resolved env in the cluster under its hash (once), where
    nodes read its ``env_vars`` to start workers for it; returns the hash."""
    digest = env_hash(resolved)
    key = ENV_KV_PREFIX + digest
    if digest and key not in _uploaded:
        upload(key, json.dumps(resolved, sort_keys=True).encode())
        _uploaded.add(key)
    return digest


def forget_uploads() -> None:
    """A new cluster holds none of what this process stored in the last
    one (``init`` calls this): pack and store again on first use. Also what
    keeps a simulated run's trace independent of the runs before it."""
    _packed.clear()
    _uploaded.clear()


def _read_requirements(path) -> list[str]:
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise ValueError(f"runtime_env['pip']: the requirements file {path!r} does not exist")
    with open(path) as handle:
        lines = [line.split("#", 1)[0].strip() for line in handle]
    return [line for line in lines if line]


def _normalized_pip(pip) -> dict:
    if isinstance(pip, (list, tuple)) or _path_like(pip):
        pip = {"packages": pip}
    packages = pip.get("packages", [])
    if _path_like(packages):
        packages = _read_requirements(packages)
    packages = [p.strip() for p in packages]
    if not packages:
        return {}
    return {"packages": packages, "pip_check": bool(pip.get("pip_check", False)),
            "pip_install_options": list(pip.get("pip_install_options", []))}


def local_package(path, kind: str, excludes: list) -> Package:
    """The package a local ``working_dir`` or ``py_modules`` entry ships as
    (``kind`` names which): a directory zipped (a module's package directory
    for an imported module), a wheel or .zip as it is. The driver's resolve
    and the job client's upload both pack through here."""
    if isinstance(path, types.ModuleType):
        origin = getattr(path, "__file__", None)
        if origin is None:
            raise ValueError(f"runtime_env['py_modules']: module {path.__name__} has no "
                             "file to ship")
        path = os.path.dirname(origin) if origin.endswith("__init__.py") else origin
    absolute = os.path.abspath(os.fspath(path))
    if kind == "py_modules" and os.path.isfile(absolute) and absolute.endswith((".whl", ".zip")):
        with open(absolute, "rb") as handle:
            data = handle.read()
        return Package(f"{URI_PREFIX}{hashlib.sha256(data).hexdigest()}.zip", data)
    if kind == "py_modules" and os.path.isfile(absolute) and absolute.endswith(".py"):
        raise ValueError(f"runtime_env['py_modules']: {absolute!r} is a single file; "
                         "ship its package directory, a wheel or a .zip")
    return pack_directory(absolute, excludes, what=kind, include_parent=kind == "py_modules")


def resolve(runtime_env: dict | None, upload) -> dict:
    """The env as tasks carry it: local paths packed and stored with
    ``upload(package)`` (which returns once the cluster holds it), the pip
    spec normalized, ``excludes`` spent. An env already resolved comes back
    unchanged. Raises ``ValueError`` for a missing path or one too big."""
    env = validate(runtime_env)
    excludes = list(env.pop("excludes", []) or [])

    def ship(path, kind: str) -> str:
        if isinstance(path, str) and is_package_uri(path):
            return path
        key = (kind, path if isinstance(path, types.ModuleType) else
               os.path.abspath(os.fspath(path)), tuple(excludes))
        uri = _packed.get(key)
        if uri is None:
            package = local_package(path, kind, excludes)
            upload_package(package, upload)
            uri = _packed[key] = package.uri
        return uri

    if "working_dir" in env:
        env["working_dir"] = ship(env["working_dir"], "working_dir")
    if "py_modules" in env:
        env["py_modules"] = [ship(module, "py_modules") for module in env["py_modules"]]
    if "pip" in env:
        pip = _normalized_pip(env["pip"])
        if pip:
            env["pip"] = pip
        else:
            del env["pip"]
    config = env.get("config")
    if config is not None:
        config = {key: value for key, value in config.items() if key == "setup_timeout_seconds"}
        if config:
            env["config"] = config
        else:
            del env["config"]
    return {key: value for key, value in env.items() if value not in (None, {}, [])}


def upload_package(package: Package, upload) -> str:
    """Store ``package`` in the cluster once (``upload(key, data)``);
    returns its URI."""
    if package.uri not in _uploaded:
        upload(KV_PREFIX + package.uri, package.data)
        _uploaded.add(package.uri)
    return package.uri


def package_working_dir(path, excludes: list[str] | tuple = (), *,
                        max_size_bytes: int | None = None) -> str:
    """Pack the directory (or ``.zip``) ``path`` and store it in the cluster
    this process is connected to (``tray.init`` first); returns the URI to
    put in ``runtime_env["working_dir"]``. The same files give the same URI
    and are stored once. ``ValueError`` for a missing path or one over
    ``max_size_bytes`` (default: ``TRAY_RUNTIME_ENV_MAX_PACKAGE_BYTES``, else
    100 MiB), naming its largest files."""
    package = pack_directory(path, excludes, max_size_bytes=max_size_bytes)
    return upload_package(package, cluster_uploader())


def cluster_uploader():
    """``upload(key, data)`` into the cluster this process is connected to
    (starting the default one, as any first call of Ray's API does). The
    API layer, which this package does not import, sets it when it loads
    (``tray/api/session.py``)."""
    return _cluster_uploader()


def _not_connected():
    raise RuntimeError("tray.runtime_env needs tray's API loaded: import tray first")


_cluster_uploader = _not_connected


def set_cluster_uploader(make_upload) -> None:
    global _cluster_uploader
    _cluster_uploader = make_upload


def current() -> dict:
    """The resolved runtime_env of the code running now: a task's or
    actor's in a worker, the job's in a driver ({} when none)."""
    from . import context

    return context.current()
