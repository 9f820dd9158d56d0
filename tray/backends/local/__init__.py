"""The local backend: a real cluster on this machine.

``tray.init()`` starts a head process (the GCS and the node manager, which
starts worker processes), connected by Unix sockets and authenticated with
the session's token; objects live in shared memory under /dev/shm. The
driver's core worker runs a trio loop in a background thread of the user's
process; API calls from the user's thread hand their work to that loop.

``tray.shutdown()`` stops the head (which kills its workers) and removes the
session's sockets and shared memory. If the driver dies without shutting
down, the head notices within a fraction of a second and does the same."""

from __future__ import annotations

import atexit
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
    def __init__(self, session: Session, head: subprocess.Popen, info: dict) -> None:
        self.session = session
        self.head = head
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
            object_store=ShmObjectStore(self.session.shm_directory,
                                        self.node_info["object_store_bytes"]),
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
        _stop_head(self.head)
        self.session.remove()


def _stop_head(head: subprocess.Popen) -> None:
    if head.poll() is None:
        head.send_signal(signal.SIGTERM)
        try:
            head.wait(SHUTDOWN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            pass
    # Whatever is left of the head's process group (workers) goes too.
    try:
        os.killpg(head.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    if head.poll() is None:
        head.wait()


def _wait_for_head(session: Session, head: subprocess.Popen) -> dict:
    deadline = time.monotonic() + HEAD_START_TIMEOUT_S
    while time.monotonic() < deadline:
        info = session.read_info()
        if info is not None:
            return info
        if head.poll() is not None:
            raise TrayError(f"the head process exited with code {head.returncode} while "
                            f"starting; see the output above")
        time.sleep(0.005)
    raise TrayError(f"the head process did not start within {HEAD_START_TIMEOUT_S} s")


def start(*, address=None, num_cpus=None, num_gpus=None, resources=None,
          object_store_memory: int | None = None, **unknown) -> LocalRuntime:
    if unknown:
        raise ValueError(f"unknown option(s) for the local backend: "
                         f"{', '.join(sorted(unknown))}")
    if address is not None:
        raise TrayError("connecting to an existing cluster (address=...) is not available "
                        "yet; tray.init() starts a new local cluster")
    cpus = (os.cpu_count() or 1) if num_cpus is None else num_cpus
    gpus = detect_gpu_count() if num_gpus is None else num_gpus
    total_memory = psutil.virtual_memory().total
    store_bytes = object_store_memory or int(total_memory * OBJECT_STORE_FRACTION)
    session = Session.create()
    command = [sys.executable, "-P", "-m", "tray.backends.local.head",
               "--session", session.directory, "--num-cpus", str(cpus),
               "--num-gpus", str(gpus), "--resources", _json(resources or {}),
               "--memory-bytes", str(int(total_memory * MEMORY_FRACTION)),
               "--object-store-bytes", str(store_bytes),
               "--prestart", str(int(cpus)), "--exit-with-driver", str(os.getpid())]
    head = subprocess.Popen(command, stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        info = _wait_for_head(session, head)
        runtime = LocalRuntime(session, head, info)
        runtime.start()
    except BaseException:
        _stop_head(head)
        session.remove()
        raise
    atexit.register(runtime.shutdown)
    return runtime


def _json(value: dict) -> str:
    import json

    return json.dumps(value)
