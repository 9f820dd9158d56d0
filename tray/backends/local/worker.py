"""A worker process of a local cluster: a core worker that runs tasks (and
hosts at most one actor) inline on its trio task; a blocking ``tray.get``
or ``time.sleep`` inside user code suspends through greenback, so the
worker keeps serving its peers meanwhile. It exits when its node manager
goes away."""

from __future__ import annotations

import argparse
import atexit
import contextvars
import gc
import json
import logging
import math
import os
import queue
import random
import sys
import threading
import time

import greenback
import outcome
import trio

from ...core.config import DEFAULT_CONFIG
from ...core.context import current_worker
from ...core.interfaces import NullTracer, ProcessEnv
from ...core.worker.core_worker import WORKER, CoreWorker
from ...exceptions import RuntimeEnvSetupError
from ...runtime_env import context as runtime_env_context
from ...runtime_env import setup as runtime_env_setup
from ...transports.fork_safety import inert_after_fork
from ...transports.tcp import TcpTransport
from ..asyncio_loops import TRIO_ASYNCIO
from ..environ import with_task_events_setting
from . import _thread_condition
from .memory import config_from_environ
from .session import Session, free_port
from .store import ShmObjectStore

_real_sleep = time.sleep


def _sleep(seconds: float) -> None:
    """time.sleep that lets the worker serve messages while user code sleeps."""
    if current_worker.get(None) is not None and greenback.has_portal():
        greenback.await_(trio.sleep(seconds))
    else:
        _real_sleep(seconds)


class _MethodThreads:
    """The threads a threaded actor's synchronous methods run in
    (``ProcessEnv.run_sync_in_thread``). The actor's ``max_concurrency``
    (and its concurrency groups) bound the calls in flight, so the threads
    are at most as many: one is started when a call finds none idle, and
    each stays for the life of the process (a worker hosts one actor).

    Not ``trio.to_thread.run_sync``: it hands each call to trio's thread
    cache and wakes the loop once per result, and measured at 16 calls in
    flight that machinery (its locks, a wake-up per call, the GIL handed
    between the loop and the threads at each) was ~40% of the actor's
    samples. Here the threads take calls from one queue and put results in
    one list; the loop is woken once per batch of results.

    A call is not abandoned when its trio task is cancelled (as
    ``to_thread.run_sync``'s default): its thread runs it to the end. The
    method runs in a copy of the calling task's context (``current_worker``
    and the task context travel with it)."""

    def __init__(self) -> None:
        self._calls: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0  # threads waiting for a call, not yet promised one
        self._results: list = []  # (trio task, outcome), for the loop
        self._token: trio.lowlevel.TrioToken | None = None
        self.threads = 0

    async def run(self, fn):
        if self._token is None:
            self._token = trio.lowlevel.current_trio_token()
        await trio.lowlevel.checkpoint_if_cancelled()
        with self._lock:
            idle = self._idle > 0
            if idle:
                self._idle -= 1
        if not idle:
            self.threads += 1
            threading.Thread(target=self._serve, name=f"tray method thread {self.threads}",
                             daemon=True).start()
        self._calls.put((fn, contextvars.copy_context(), trio.lowlevel.current_task()))
        return await trio.lowlevel.wait_task_rescheduled(
            lambda _raise_cancel: trio.lowlevel.Abort.FAILED)

    def _serve(self) -> None:
        calls = self._calls
        while True:
            fn, context, task = calls.get()
            result = outcome.capture(context.run, fn)
            del fn, context
            with self._lock:
                self._results.append((task, result))
                wake = len(self._results) == 1
                self._idle += 1
            del task, result
            if wake:
                try:
                    self._token.run_sync_soon(self._deliver)
                except trio.RunFinishedError:  # the process is ending
                    return

    def _deliver(self) -> None:
        with self._lock:
            results, self._results = self._results, []
        for task, result in results:
            trio.lowlevel.reschedule(task, result)


_method_threads = _MethodThreads()


async def _run_sync_in_thread(fn, concurrency_group: str):
    return await _method_threads.run(fn)


# What the worker process was started with: a user's own OMP_NUM_THREADS
# (or CUDA_VISIBLE_DEVICES) wins over what a task's resources would set.
_started_with = {name: os.environ.get(name) for name in ("OMP_NUM_THREADS",
                                                          "CUDA_VISIBLE_DEVICES")}


async def _before_task(gpu_ids: list, spec, args, cache_dir: str) -> None:
    await _apply_runtime_env(spec, cache_dir)
    _task_environment(gpu_ids, spec, args.node_gpus)


def _task_environment(gpu_ids: list, spec, node_gpus: float) -> None:
    """Before a task or actor call runs, as Ray's workers do:

    * ``CUDA_VISIBLE_DEVICES`` is the task's GPU ids; a task without GPUs on
      a node with GPUs sees none (''); on a node without GPUs it is left as
      the worker started (unset, unless the user set it).
    * ``OMP_NUM_THREADS`` is the task's whole CPUs (at least 1), unless the
      user set it: a task on 1 CPU then runs NumPy/BLAS on 1 thread, not one
      per core of the machine. An actor creation sets it for the actor's
      life; its calls (no resources of their own) keep it."""
    if gpu_ids:
        os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in gpu_ids)
    elif node_gpus > 0:
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    elif _started_with["CUDA_VISIBLE_DEVICES"] is None:
        os.environ.pop("CUDA_VISIBLE_DEVICES", None)
    else:
        os.environ["CUDA_VISIBLE_DEVICES"] = _started_with["CUDA_VISIBLE_DEVICES"]
    if _started_with["OMP_NUM_THREADS"] is not None:
        return
    if spec.method is not None:
        return  # an actor call: the actor's creation set it
    cpus = spec.resources.get("CPU", 0.0)
    os.environ["OMP_NUM_THREADS"] = str(max(int(math.floor(cpus)), 1))


# The runtime_env this process was set up for (its hash), by its first
# task or actor creation; None before. Its node leases it for that env only.
_runtime_env = {"hash": None}


async def _apply_runtime_env(spec, cache_dir: str) -> None:
    """Set this process up for the task's runtime_env before its user code
    runs, once: packages fetched and unpacked (once per node), a pip env
    built (once per node), then ``env_vars`` into ``os.environ``, the
    working_dir as cwd and first ``sys.path`` entry, py_modules and the
    pip env's site-packages after it. A failure raises
    ``RuntimeEnvSetupError`` (the task fails with it) and leaves the process
    as it was, so the next task of the env tries again."""
    if spec.method is not None or _runtime_env["hash"] == spec.runtime_env_hash:
        return  # an actor call (its actor's env), or set up already
    if _runtime_env["hash"] is not None:
        raise RuntimeEnvSetupError(
            f"this worker is set up for runtime_env {_runtime_env['hash'] or '(none)'}, not "
            f"{spec.runtime_env_hash or '(none)'}: its node leased it for the wrong env")
    env = spec.runtime_env or {}
    if env:
        worker = current_worker.get()

        async def fetch(key: str):
            return await worker.gcs_call("kv_get", key)

        prepared = await runtime_env_setup.prepare_with_timeout(env, cache_dir, fetch)
        os.environ.update(prepared.env_vars)
        for name in ("OMP_NUM_THREADS", "CUDA_VISIBLE_DEVICES"):
            if name in prepared.env_vars:  # the user's value wins, as if set at start
                _started_with[name] = prepared.env_vars[name]
        sys.path[:0] = [path for path in prepared.sys_path if path not in sys.path]
        if prepared.cwd is not None:
            os.chdir(prepared.cwd)
    runtime_env_context.set_process_env(env)
    _runtime_env["hash"] = spec.runtime_env_hash


async def run_worker(args) -> None:
    session = Session(args.session)
    if args.listen_ip:
        address = f"tcp:{args.listen_ip}:{free_port(args.listen_ip)}"
    else:
        address = session.address(f"worker-{args.worker_id[:12]}")
    store = ShmObjectStore(args.store_dir, args.object_store_bytes, args.spill_dir)
    cache_dir = session.path("runtime_resources")
    # A child forked inside a task must not write or free its parent's objects.
    inert_after_fork(store, "put", "delete")
    env = ProcessEnv(
        address=address, transport=TcpTransport(session.token()), rng=random.Random(),
        tracer=NullTracer(), config=with_task_events_setting(config_from_environ(DEFAULT_CONFIG)),
        node_id=args.node_id,
        object_store=store,
        gcs_address=args.gcs, node_manager_address=args.node_manager,
        exit_process=lambda: os._exit(1),
        before_task=lambda gpu_ids, spec: _before_task(gpu_ids, spec, args, cache_dir),
        run_sync_in_thread=_run_sync_in_thread, thread_condition=_thread_condition,
        asyncio_loops=TRIO_ASYNCIO, run_exit_handlers=atexit._run_exitfuncs)
    async with trio.open_nursery() as nursery:
        worker = CoreWorker(env, WORKER, nursery, worker_id=args.worker_id)
        current_worker.set(worker)

        def peer_closed(peer: str) -> None:
            if peer == args.node_manager:
                sys.stdout.flush()
                os._exit(0)

        worker.endpoint.add_peer_closed_listener(peer_closed)
        await worker.start()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="tray-worker")
    parser.add_argument("--session", required=True)
    parser.add_argument("--worker-id", required=True)
    parser.add_argument("--node-id", required=True)
    parser.add_argument("--gcs", required=True)
    parser.add_argument("--node-manager", required=True)
    parser.add_argument("--store-dir", required=True)
    parser.add_argument("--spill-dir", required=True)
    parser.add_argument("--listen-ip", default="")
    parser.add_argument("--object-store-bytes", type=int, required=True)
    parser.add_argument("--node-gpus", type=float, default=0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=os.environ.get("TRAY_LOG_LEVEL", "WARNING"),
                        format=f"(worker {args.worker_id[:8]}) %(levelname)s %(message)s")
    time.sleep = _sleep
    driver_path = json.loads(os.environ.get("TRAY_DRIVER_SYS_PATH", "[]"))
    sys.path[:0] = [entry for entry in driver_path if entry not in sys.path]
    gc.freeze()  # the imports, out of the collector's sight (as the zygote's forks)
    trio.run(run_worker, args)


if __name__ == "__main__":
    main()
