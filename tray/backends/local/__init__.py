"""The local backend: a real cluster on this machine.

``tray.init()`` starts a head node process (the GCS and a node manager,
which starts worker processes) and, with ``num_nodes=K``, K-1 more node
processes on this machine, each with its own resources, workers and object
store: a multi-node cluster on one machine, as Ray's ``cluster_utils``
builds. Processes talk over Unix sockets, authenticated with the session's
token; objects live in shared memory under /dev/shm. The driver's core
worker runs a trio loop in a background thread of the user's process; API
calls from the user's thread hand their work to that loop.

``tray.shutdown()`` stops the node processes (which kill their workers) and
removes the session's sockets and shared memory. If the driver dies without
shutting down, the nodes notice within a fraction of a second and do the
same."""

from __future__ import annotations

import atexit
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time

import psutil
import trio

from ...core.config import DEFAULT_CONFIG
from ...core.context import current_worker
from ...core.core_worker import DRIVER, CoreWorker
from ...core.interfaces import NullTracer, ProcessEnv
from ...exceptions import TrayError
from ...transports.tcp import TcpTransport
from .gpus import detect_gpu_count
from .session import Session
from .store import ShmObjectStore

HEAD_START_TIMEOUT_S = 30.0
SHUTDOWN_TIMEOUT_S = 5.0
OBJECT_STORE_FRACTION = 0.3
MEMORY_FRACTION = 0.7


class LocalRuntime:
    def __init__(self, session: Session, nodes: list[subprocess.Popen], info: dict) -> None:
        self.session = session
        self.nodes = nodes
        self.node_info = info
        self.namespace = ""
        self.driver: CoreWorker | None = None
        self._trio_token = None
        self._nursery = None
        self._ready = threading.Event()
        self._failure: BaseException | None = None
        self._thread = threading.Thread(target=self._thread_main, name="tray-driver",
                                        daemon=True)
        self.info = {"backend": "local", "node_id": info["node_id"],
                     "session_dir": session.directory}
        self._stopped = False

    # ------------------------------------------------------------ the loop

    def start(self) -> None:
        self._thread.start()
        if not self._ready.wait(HEAD_START_TIMEOUT_S) or self._failure is not None:
            raise TrayError(f"the driver could not connect to the local cluster: "
                            f"{self._failure!r}") from self._failure

    def _thread_main(self) -> None:
        try:
            trio.run(self._main)
        except BaseException as error:  # reported to the user's thread
            self._failure = error
            self._ready.set()

    async def _main(self) -> None:
        env = ProcessEnv(
            address=self.session.address(f"driver-{os.getpid()}"),
            transport=TcpTransport(self.session.token()), rng=random.Random(),
            tracer=NullTracer(), config=DEFAULT_CONFIG, node_id=self.node_info["node_id"],
            object_store=ShmObjectStore(self.node_info["store_directory"],
                                        self.node_info["object_store_bytes"],
                                        self.node_info["spill_directory"]),
            gcs_address=self.node_info["gcs_address"],
            node_manager_address=self.node_info["node_manager_address"])
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            worker = CoreWorker(env, DRIVER, nursery, spawn_from_outside=self.call_soon)
            worker.loop_in_other_thread = True
            current_worker.set(worker)
            self._trio_token = trio.lowlevel.current_trio_token()
            await worker.start()
            self.driver = worker
            self._ready.set()
            await trio.sleep_forever()

    def call_soon(self, fn) -> None:
        self._trio_token.run_sync_soon(fn)

    def run(self, async_fn, *args):
        driver = self.driver

        async def in_driver():
            current_worker.set(driver)
            return await async_fn(*args)
        return trio.from_thread.run(in_driver, trio_token=self._trio_token)

    def run_sync(self, fn, *args):
        driver = self.driver

        def in_driver():
            token = current_worker.set(driver)
            try:
                return fn(*args)
            finally:
                current_worker.reset(token)
        return trio.from_thread.run_sync(in_driver, trio_token=self._trio_token)

    # ------------------------------------------------------------ shutdown

    def shutdown(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        if self.driver is not None:
            self.driver.shutting_down = True
        if self._trio_token is not None and self._thread.is_alive():
            try:
                self._trio_token.run_sync_soon(self._nursery.cancel_scope.cancel)
            except trio.RunFinishedError:
                pass
            self._thread.join(SHUTDOWN_TIMEOUT_S)
        _stop_nodes(self.nodes)
        self.session.remove()


def _stop_nodes(nodes: list[subprocess.Popen]) -> None:
    for node in reversed(nodes):
        if node.poll() is None:
            node.send_signal(signal.SIGTERM)
    for node in reversed(nodes):
        try:
            node.wait(SHUTDOWN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            pass
        # Whatever is left of the node's process group (its workers) goes too.
        try:
            os.killpg(node.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        if node.poll() is None:
            node.wait()


def _wait_for_node(session: Session, index: int, node: subprocess.Popen) -> dict:
    deadline = time.monotonic() + HEAD_START_TIMEOUT_S
    while time.monotonic() < deadline:
        info = session.read_info(index)
        if info is not None:
            return info
        if node.poll() is not None:
            raise TrayError(f"node process {index} exited with code {node.returncode} while "
                            "starting; see its output above")
        time.sleep(0.005)
    raise TrayError(f"node process {index} did not start within {HEAD_START_TIMEOUT_S} s")


def _start_node(session: Session, index: int, gcs: str, *, cpus, gpus, resources,
                memory_bytes: int, store_bytes: int) -> subprocess.Popen:
    command = [sys.executable, "-P", "-m", "tray.backends.local.node",
               "--session", session.directory, "--node-index", str(index),
               "--num-cpus", str(cpus), "--num-gpus", str(gpus),
               "--resources", json.dumps(resources), "--memory-bytes", str(memory_bytes),
               "--object-store-bytes", str(store_bytes), "--prestart", str(int(cpus)),
               "--exit-with-driver", str(os.getpid())]
    command += ["--gcs", gcs] if gcs else ["--head"]
    # Workers import what the driver can import (functions defined in the
    # driver's modules are pickled by reference), as Ray's workers do.
    env = {**os.environ, "TRAY_DRIVER_SYS_PATH": json.dumps([p for p in sys.path if p])}
    return subprocess.Popen(command, stdin=subprocess.DEVNULL, start_new_session=True,
                            env=env)


def start(*, address=None, num_cpus=None, num_gpus=None, resources=None,
          object_store_memory: int | None = None, num_nodes: int = 1,
          **unknown) -> LocalRuntime:
    if unknown:
        raise ValueError(f"unknown option(s) for the local backend: "
                         f"{', '.join(sorted(unknown))}")
    if address is not None:
        raise TrayError("connecting to an existing cluster (address=...) is not available "
                        "yet; tray.init() starts a new local cluster")
    if isinstance(num_nodes, bool) or not isinstance(num_nodes, int) or num_nodes < 1:
        raise ValueError(f"num_nodes must be a positive integer, got {num_nodes!r}")
    cpus = (os.cpu_count() or 1) if num_cpus is None else num_cpus
    gpus = detect_gpu_count() if num_gpus is None else num_gpus
    total_memory = psutil.virtual_memory().total
    store_bytes = object_store_memory or int(total_memory * OBJECT_STORE_FRACTION / num_nodes)
    node_options = {"cpus": cpus, "gpus": gpus, "resources": resources or {},
                    "memory_bytes": int(total_memory * MEMORY_FRACTION / num_nodes),
                    "store_bytes": store_bytes}
    session = Session.create()
    nodes = [_start_node(session, 0, "", **node_options)]
    try:
        head_info = _wait_for_node(session, 0, nodes[0])
        nodes += [_start_node(session, index, head_info["gcs_address"], **node_options)
                  for index in range(1, num_nodes)]
        for index in range(1, num_nodes):
            _wait_for_node(session, index, nodes[index])
        runtime = LocalRuntime(session, nodes, head_info)
        runtime.start()
    except BaseException:
        _stop_nodes(nodes)
        session.remove()
        raise
    atexit.register(runtime.shutdown)
    return runtime
