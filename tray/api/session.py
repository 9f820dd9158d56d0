"""Starting and ending a cluster from a program: ``init`` (and the auto-init
of Ray's first call), ``shutdown``, ``is_initialized``, what ``init``
returns (``TrayContext``), the backends by name, and the job's runtime
environment as tasks inherit it."""

from __future__ import annotations

import importlib
import json
import logging
import os
import sys
import threading
from collections.abc import Mapping

from .. import runtime_env as runtime_envs
from ..core.context import current_worker, get_worker, set_driver
from ..version import __version__
from . import init_options, state
from . import options as opts
from .blocking import block

logger = logging.getLogger("tray")

# name -> "module:function" starting that backend; filled in by tray.backends.
_backends: dict[str, str] = {}

# Ray starts a local cluster on the first call that needs one; so does tray
# (``ensure_worker``): one thread at a time.
AUTO_INIT_LOCK = threading.Lock()


def register_backend(name: str, target: str) -> None:
    _backends[name] = target


def _cluster_upload():
    """``tray.runtime_env``'s uploads (``package_working_dir``) go to this
    process's cluster."""
    worker = ensure_worker()

    def upload(key: str, data: bytes) -> None:
        block(worker, worker.gcs_call, "kv_put", key, data, False)
    return upload


runtime_envs.set_cluster_uploader(_cluster_upload)


# ============================================================ init/shutdown

class TrayContext(Mapping):
    """What ``tray.init()`` returns, as Ray's ``RayContext``: the cluster's
    ``address_info`` (``ctx["address"]`` reads it too), its
    ``dashboard_url`` (host:port of the dashboard, ``webui_url``; ``None``
    without one: the simulator, ``include_dashboard=False``), and a context
    manager that shuts the cluster down on exit::

        with tray.init(backend="sim") as ctx:
            ...

    The keys of ``address_info`` are Ray's where tray has the thing
    (``address``, ``gcs_address``, ``node_id``, ``session_dir``,
    ``webui_url``) plus tray's own (``backend``; ``seed`` and ``num_nodes``
    in the simulator)."""

    def __init__(self, address_info: dict) -> None:
        self.address_info = address_info
        self.dashboard_url = address_info.get("webui_url")
        self.python_version = "{}.{}.{}".format(*sys.version_info[:3])
        self.tray_version = __version__

    def __getitem__(self, key):
        return self.address_info[key]

    def __iter__(self):
        return iter(self.address_info)

    def __len__(self) -> int:
        return len(self.address_info)

    def __enter__(self) -> TrayContext:
        return self

    def __exit__(self, *exc) -> None:
        shutdown()

    def disconnect(self) -> None:
        shutdown()

    def __repr__(self) -> str:
        return f"TrayContext({self.address_info!r})"


def _context_of(runtime) -> TrayContext:
    gcs_address = runtime.driver.env.gcs_address
    info = {"address": gcs_address, "gcs_address": gcs_address,
            "node_id": runtime.driver.node_id, "session_dir": None, "webui_url": None,
            **runtime.info}
    return TrayContext(info)


def init(address: str | None = None, *, backend: str | None = None, num_cpus=None,
         num_gpus=None, resources: dict | None = None, namespace: str | None = None,
         ignore_reinit_error: bool = False, job_config=None, runtime_env: dict | None = None,
         local_mode: bool = False, configure_logging: bool = True, logging_level=None,
         logging_format: str | None = None, logging_config=None, log_to_driver: bool | None = None,
         **backend_options):
    """Start (or connect to) a cluster and make this process its driver;
    returns a ``TrayContext``.

    ``backend="local"`` (the default) runs real processes on this machine;
    ``backend="sim"`` runs a simulated cluster in this process on virtual
    time (options: ``seed``, ``num_nodes``, fault settings). ``job_config``
    is a ``tray.job_config.JobConfig``; ``namespace`` overrides its
    ``ray_namespace``, as in Ray. ``runtime_env`` is the job's runtime
    environment (``tray.runtime_env``), inherited by its tasks and actors; it
    replaces ``job_config``'s, as in Ray. ``address="local"`` starts a new
    cluster even where ``TRAY_ADDRESS`` names one.

    Ray's other keywords are taken too (``tray.api.init_options``): a
    ``logging_level``/``logging_format`` configures the ``tray`` logger;
    ``log_to_driver=False`` keeps the workers' output of a cluster ``init``
    starts out of this terminal (it still goes to the session's log files);
    ``_temp_dir`` is where that cluster's session directory goes; the rest
    (``local_mode``, ``_system_config``) are logged as ignored."""
    if state.runtime is not None:
        if ignore_reinit_error:
            return _context_of(state.runtime)
        raise RuntimeError("tray.init() was already called; call tray.shutdown() first "
                           "or pass ignore_reinit_error=True")
    private, backend_options = init_options.split_private(backend_options)
    ray_options = init_options.RayInitOptions(
        configure_logging=configure_logging, logging_level=logging_level,
        logging_format=logging_format, logging_config=logging_config,
        log_to_driver=log_to_driver, local_mode=local_mode, private=private)
    backend = backend or "local"
    if backend not in _backends:
        raise ValueError(f"unknown backend {backend!r}; known backends: "
                         f"{', '.join(sorted(_backends))}")
    if num_cpus is not None:
        opts._non_negative_number("num_cpus", num_cpus)
    if num_gpus is not None:
        opts._non_negative_number("num_gpus", num_gpus)
    if resources is not None:
        opts.validate({"resources": resources}, {"resources"}, "init()")
    if namespace is not None:
        opts._string("namespace", namespace)
    if job_config is not None:
        from ..job_config import JobConfig

        if not isinstance(job_config, JobConfig):
            raise TypeError(f"job_config must be a tray.job_config.JobConfig, got "
                            f"{type(job_config).__name__}")
        job_config.check_supported()
        if namespace is None:
            namespace = job_config.ray_namespace
        if runtime_env is None:
            runtime_env = job_config.runtime_env or None
    start_new = address == "local"  # (Ray's: a new cluster, whatever RAY_ADDRESS says)
    if start_new:
        address = None
    joined = address is None and not start_new and backend == "local" and \
        _address_from_environment()
    if joined:
        # As Ray's drivers join RAY_ADDRESS: a submitted job's driver joins
        # its cluster, in its job's runtime_env (the script's keys win).
        address = joined
        job_env = os.environ.get("TRAY_JOB_RUNTIME_ENV")
        if job_env:
            runtime_env = runtime_envs.merge(json.loads(job_env), runtime_env) or None
    runtime_envs.validate(runtime_env)
    ray_options.apply_logging()
    if address is None and backend == "local":
        backend_options.update(log_to_driver=ray_options.log_to_driver,
                               temp_dir=ray_options.temp_dir)
    elif backend == "sim" and not ray_options.log_to_driver:
        ray_options.warnings.append("log_to_driver=False is ignored in the simulator: its "
                                    "tasks run in this process, their output is its own")
    ray_options.warn()
    module_name, _, function_name = _backends[backend].partition(":")
    start = getattr(importlib.import_module(module_name), function_name)
    runtime = start(address=address, num_cpus=num_cpus, num_gpus=num_gpus,
                    resources=resources or {}, **backend_options)
    runtime.namespace = namespace or f"_anonymous_{runtime.driver.job_id.hex()}"
    runtime.driver.driver_context.namespace = runtime.namespace
    state.runtime = runtime
    set_driver(runtime.driver)
    try:
        _set_job_runtime_env(runtime, runtime_env)
    except BaseException:
        shutdown()
        raise
    if joined and os.environ.get("TRAY_JOB_SUBMISSION_ID"):
        from ..job_submission._common import link_driver

        link_driver(lambda *args: block(runtime.driver, runtime.driver.gcs_call, *args),
                    os.environ["TRAY_JOB_SUBMISSION_ID"], runtime.driver.job_id.hex())
    return _context_of(runtime)


def _address_from_environment() -> str | None:
    """The cluster ``TRAY_ADDRESS`` names (host:port of its GCS), which
    ``init()`` with no address joins; an http(s) URL there is the job API's
    (``tray job``), not a cluster's."""
    address = os.environ.get("TRAY_ADDRESS", "").strip()
    if not address or address.startswith(("http://", "https://")):
        return None
    return address


def _set_job_runtime_env(runtime, runtime_env: dict | None) -> None:
    """Pack and store the job's runtime_env now (a missing working_dir
    fails ``init``), and make it what this driver's tasks inherit."""
    from ..runtime_env import context, forget_uploads

    forget_uploads()
    resolved = _resolve_runtime_env(runtime.driver, runtime_env) if runtime_env else {}
    context.set_process_env(resolved)


def _resolve_runtime_env(worker, runtime_env: dict) -> dict:
    """A runtime_env as tasks carry it (``tray.runtime_env.resolve``), its
    packages stored in this cluster's GCS. The simulator refuses pip."""
    from ..runtime_env import resolve, store_env

    def upload(key: str, data: bytes) -> None:
        block(worker, worker.gcs_call, "kv_put", key, data, False)

    resolved = resolve(runtime_env, upload)
    runtime = state.runtime
    if resolved.get("pip") and runtime is not None and runtime.info.get("backend") == "sim":
        raise ValueError("runtime_env['pip'] is not supported in the simulator "
                         "(backend='sim'): it cannot install packages into simulated "
                         "workers; test pip environments on the local backend")
    store_env(resolved, upload)  # nodes start its workers with its env_vars
    return resolved


def task_runtime_env(worker, options: dict) -> dict | None:
    """The runtime_env a task or actor created here runs in: what the
    submitting code runs in (the job's, or its task's), with the option's
    keys over it (Ray's merge rule)."""
    from ..runtime_env import current, merge

    parent = current()
    child = options.get("runtime_env")
    if not child:
        return parent or None
    return _resolve_runtime_env(worker, merge(parent, child)) or None


# Ray starts a local cluster on the first call that needs one; so does tray,
# unless TRAY_AUTO_INIT=0 (then such a call raises NotInitializedError).


def _auto_init_enabled() -> bool:
    return os.environ.get("TRAY_AUTO_INIT", "1") != "0"


def _in_cluster_process() -> bool:
    """Is this process one of a cluster's own (a worker, a node)? Code there
    outside a task (a thread of its own) must not start a second cluster."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    return spec is not None and spec.name.startswith("tray.backends.")


def ensure_worker():
    """This process's core worker; the first call that needs a cluster
    starts the default local one (as Ray does) and logs one line saying so."""
    worker = get_worker(required=False)
    if worker is not None:
        return worker
    if not _auto_init_enabled():
        from ..exceptions import NotInitializedError

        raise NotInitializedError(
            "tray is not initialized and TRAY_AUTO_INIT=0: call tray.init() first "
            "(for example tray.init(backend='sim') for a simulated cluster)")
    if _in_cluster_process():
        return get_worker()  # raises NotInitializedError
    with AUTO_INIT_LOCK:
        if state.runtime is None:
            init()
            joined = _address_from_environment()
            where = f"joined the cluster at {joined} (TRAY_ADDRESS)" if joined else \
                "started a local cluster on this machine"
            logger.warning("tray.init() had not been called: %s, as Ray does (set "
                           "TRAY_AUTO_INIT=0 to make such calls raise NotInitializedError "
                           "instead)", where)
    return get_worker()


def shutdown() -> None:
    runtime = state.runtime
    if runtime is None:
        return
    from ..runtime_env import context

    context.set_process_env({})
    try:
        runtime.shutdown()
    finally:
        state.runtime = None
        set_driver(None)


def is_initialized() -> bool:
    """True in a driver after ``init``, and inside tasks and actors (as Ray)."""
    return state.runtime is not None or current_worker.get(None) is not None


def current_namespace() -> str:
    """The job's namespace: tasks and actors carry their job's along."""
    worker = get_worker()  # raises NotInitializedError
    return worker.current_context().namespace


# ==================================================================== tasks
