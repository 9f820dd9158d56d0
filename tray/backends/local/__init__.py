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
import socket
import subprocess
import sys
import threading
import time
from typing import TYPE_CHECKING

import trio

from ...core.config import DEFAULT_CONFIG
from ...core.context import current_worker
from ...core.interfaces import NullTracer, ProcessEnv
from ...exceptions import TrayError
from ..environ import with_task_events_setting
from .gpus import detect_gpu_count
from .memory import config_from_environ, machine_memory_bytes
from .session import Session, free_port, nothing_listens_at, read_current_cluster

if TYPE_CHECKING:
    from ...core.worker.core_worker import CoreWorker

HEAD_START_TIMEOUT_S = 30.0
SHUTDOWN_TIMEOUT_S = 5.0
FLUSH_AT_SHUTDOWN_S = 1.0  # the task events still buffered, sent as the driver exits
OBJECT_STORE_FRACTION = 0.3
MEMORY_FRACTION = 0.7


class LocalRuntime:
    """The driver's side of a local cluster: its trio loop, and the node
    processes it started (none when it attached to a running cluster)."""

    def __init__(self, *, token: bytes, driver_address: str, node_info: dict,
                 nodes: list[subprocess.Popen], session: Session | None) -> None:
        self.token = token
        self.driver_address = driver_address
        self.session = session
        self.nodes = nodes
        self.node_info = node_info
        self.namespace = ""
        self.driver: CoreWorker | None = None
        # The trio run state a call from inside another trio run in the
        # user's thread needs there (api/blocking._outside_users_trio_run): none, the
        # loop runs in a thread of its own. (The simulator's has its run's.)
        self.run_context: dict = {}
        self._trio_token = None
        self._nursery = None
        self._ready = threading.Event()
        self._failure: BaseException | None = None
        self._thread = threading.Thread(target=self._thread_main, name="tray-driver",
                                        daemon=True)
        self.info = {"backend": "local", "node_id": node_info["node_id"],
                     "gcs_address": node_info["gcs_address"],
                     "session_dir": session.directory if session else None}
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
        from ...core.worker.core_worker import DRIVER, CoreWorker
        from ...transports.tcp import TcpTransport
        from .store import ShmObjectStore

        env = ProcessEnv(
            address=self.driver_address,
            transport=TcpTransport(self.token), rng=random.Random(),
            tracer=NullTracer(),
            config=with_task_events_setting(config_from_environ(DEFAULT_CONFIG)),
            node_id=self.node_info["node_id"],
            object_store=ShmObjectStore(self.node_info["store_directory"],
                                        self.node_info["object_store_bytes"],
                                        self.node_info["spill_directory"]),
            gcs_address=self.node_info["gcs_address"],
            node_manager_address=self.node_info["node_manager_address"],
            thread_condition=_thread_condition)
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            worker = CoreWorker(env, DRIVER, nursery, spawn_from_outside=self.call_soon,
                                loop_in_other_thread=True)
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
        if self.driver is not None and self._trio_token is not None and \
                self._thread.is_alive():
            # What the state API shows of this driver's last second of tasks
            # (a final failure, say) goes out before it does.
            try:
                self.run(_flush_task_events, self.driver)
            except Exception:  # noqa: BLE001 - the cluster is gone already: nothing to tell
                pass
        if self.driver is not None:
            self.driver.begin_shutdown()
        if self._trio_token is not None and self._thread.is_alive():
            try:
                self._trio_token.run_sync_soon(self._nursery.cancel_scope.cancel)
            except trio.RunFinishedError:
                pass
            self._thread.join(SHUTDOWN_TIMEOUT_S)
        _stop_nodes(self.nodes)
        if self.session is not None:
            self.session.remove()


async def _flush_task_events(driver) -> None:
    with trio.move_on_after(FLUSH_AT_SHUTDOWN_S):
        await driver.task_events.flush()


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
                memory_bytes: int, store_bytes: int,
                log_to_driver: bool = True) -> subprocess.Popen:
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
    if not log_to_driver:  # (the node's workers' output: to their log files only)
        command.append("--no-log-to-driver")
    return subprocess.Popen(command, stdin=subprocess.DEVNULL, start_new_session=True,
                            env=env)


def start(*, address=None, num_cpus=None, num_gpus=None, resources=None,
          object_store_memory: int | None = None, num_nodes: int = 1,
          include_dashboard: bool | None = None, dashboard_host: str = "127.0.0.1",
          dashboard_port: int | None = None, log_to_driver: bool = True,
          temp_dir: str | None = None, **unknown) -> LocalRuntime:
    if unknown:
        raise ValueError(f"unknown option(s) for the local backend: "
                         f"{', '.join(sorted(unknown))}")
    if address is not None:
        if num_cpus is not None or num_gpus is not None or resources or object_store_memory \
                or num_nodes != 1:
            raise ValueError("resources and num_nodes are set where the cluster starts "
                             "(tray start), not when a driver connects to it")
        return attach(address)
    if isinstance(num_nodes, bool) or not isinstance(num_nodes, int) or num_nodes < 1:
        raise ValueError(f"num_nodes must be a positive integer, got {num_nodes!r}")
    config_from_environ(DEFAULT_CONFIG)  # a bad RAY_memory_* setting fails here, not in a node
    cpus = (os.cpu_count() or 1) if num_cpus is None else num_cpus
    gpus = detect_gpu_count() if num_gpus is None else num_gpus
    total_memory = machine_memory_bytes()
    store_bytes = object_store_memory or int(total_memory * OBJECT_STORE_FRACTION / num_nodes)
    node_options = {"cpus": cpus, "gpus": gpus, "resources": resources or {},
                    "memory_bytes": int(total_memory * MEMORY_FRACTION / num_nodes),
                    "store_bytes": store_bytes, "log_to_driver": log_to_driver}
    session = Session.create(root=temp_dir)
    nodes = [_start_node(session, 0, "", **node_options)]
    try:
        _import_driver_stack()
        head_info = _wait_for_node(session, 0, nodes[0])
        nodes += [_start_node(session, index, head_info["gcs_address"], **node_options)
                  for index in range(1, num_nodes)]
        for index in range(1, num_nodes):
            _wait_for_node(session, index, nodes[index])
        runtime = LocalRuntime(token=session.token(),
                               driver_address=session.address(f"driver-{os.getpid()}"),
                               node_info=head_info, nodes=nodes, session=session)
        runtime.start()
    except BaseException:
        _stop_nodes(nodes)
        session.remove()
        raise
    atexit.register(runtime.shutdown)
    if include_dashboard is not False:
        _start_dashboard(runtime, session, head_info, dashboard_host, dashboard_port,
                         required=bool(include_dashboard))
    return runtime


def _import_driver_stack() -> None:
    """The driver's own modules (its core worker, transport and store:
    ~50 ms), imported while the head node starts, on another core, rather
    than before it is spawned: every millisecond before the spawn was one
    more of init. The rest of this module imports them where it uses
    them."""
    from ...core.worker import core_worker  # noqa: F401
    from ...transports import tcp  # noqa: F401
    from . import store  # noqa: F401


def _start_dashboard(runtime, session, head_info, host, port, *, required: bool) -> None:
    """Spawn the dashboard (tray/dashboard) and print its URL, without
    waiting for it: ``init()`` stays as fast. It follows this driver: it
    exits when the driver's process does. A failure to start it is only a
    warning, unless the user asked for it (``include_dashboard=True``)."""
    from ... import dashboard

    try:
        process, url = dashboard.start_dashboard(
            gcs_address=head_info["gcs_address"], session_dir=session.directory, host=host,
            port=port, follow_pid=os.getpid())
    except (OSError, ValueError) as error:
        if required:
            raise
        print(f"tray: the dashboard did not start: {error}", file=sys.stderr)
        return
    runtime.nodes.append(process)  # stopped with the nodes at shutdown
    runtime.info["webui_url"] = url.removeprefix("http://")  # as Ray's: host:port
    # With the key that logs a browser in: every page needs the token.
    print(f"tray: view the dashboard at {dashboard.login_url(url, session.token())}",
          file=sys.stderr)


# ======================================================= joining a cluster

CONNECT_TIMEOUT_S = 5.0


def resolve_cluster(address: str) -> tuple[str, bytes]:
    """The GCS address and token of the cluster at ``address`` ("auto": the
    one started on this machine with ``tray start --head``)."""
    if address.startswith("unix:"):
        # A tray.init() cluster's GCS, on this machine (its dashboard reads it so).
        token = os.environ.get("TRAY_CLUSTER_TOKEN")
        if token is None:
            raise TrayError(f"no token for the cluster at {address}: set TRAY_CLUSTER_TOKEN")
        return address, token.encode()
    current = read_current_cluster()
    if address == "auto":
        if current is None:
            raise TrayError("no tray cluster was started on this machine: start one with "
                            "'tray start --head', or give its address")
        address = current["address"]
    host, _, port = address.removeprefix("tcp:").rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"bad cluster address {address!r}: use host:port or 'auto'")
    token = os.environ.get("TRAY_CLUSTER_TOKEN")
    if token is None and current is not None and current["address"] == f"{host}:{port}":
        token = current["token"]
    if token is None:
        if nothing_listens_at(host, int(port)):
            raise TrayError(f"nothing answers at {host}:{port}: is a tray cluster running "
                            "there ('tray start --head')?")
        raise TrayError(f"no token for the cluster at {host}:{port}: set TRAY_CLUSTER_TOKEN "
                        "to the token 'tray start --head' printed")
    return f"tcp:{host}:{port}", token.encode()


async def query_gcs(gcs: str, token: bytes, method: str, *args):
    """One call to a cluster's GCS, failing fast with what went wrong."""
    from ...core.interfaces import ConnectionClosed
    from ...transports.tcp import TcpTransport
    from ...transports.tcp_handshake import AuthenticationError

    transport = TcpTransport(token)
    try:
        with trio.fail_after(CONNECT_TIMEOUT_S):
            stream = await transport.connect(gcs)
            try:
                await stream.send(("hello", "tray-client"))
                await stream.send((0, 1, method, args))
                while True:
                    kind, call_id, ok, value = await stream.receive()
                    if kind == 1 and call_id == 1:
                        break
            finally:
                await stream.aclose()
    except AuthenticationError:
        raise TrayError(f"the cluster at {gcs.removeprefix('tcp:')} rejected this token "
                        "(check TRAY_CLUSTER_TOKEN)") from None
    except (ConnectionClosed, trio.TooSlowError) as error:
        raise TrayError(f"no tray cluster answers at {gcs.removeprefix('tcp:')} ({error}); "
                        "is it running? (tray start --head)") from None
    if not ok:
        raise value
    return value


def attach(address: str) -> LocalRuntime:
    gcs, token = resolve_cluster(address)
    nodes = trio.run(query_gcs, gcs, token, "get_all_nodes")
    here = socket.gethostname()
    local = [node for node in nodes if node.alive and node.hostname == here]
    if not local:
        raise TrayError(f"no live node of the cluster at {gcs.removeprefix('tcp:')} runs on "
                        f"this machine ({here}): start one with 'tray start --address ...'")
    node = local[0]
    ip = node.ip if node.ip != "local" else "127.0.0.1"
    node_info = {"node_id": node.node_id, "gcs_address": gcs,
                 "node_manager_address": node.address,
                 "store_directory": node.store_directory,
                 "spill_directory": node.spill_directory,
                 "object_store_bytes": node.object_store_bytes}
    runtime = LocalRuntime(token=token, driver_address=f"tcp:{ip}:{free_port(ip)}",
                           node_info=node_info, nodes=[], session=None)
    runtime.start()
    atexit.register(runtime.shutdown)
    return runtime


def _thread_condition() -> threading.Condition:
    """What a core worker that threads reach locks its shared state with
    (``ProcessEnv.thread_condition``): re-entrant, with a condition."""
    return threading.Condition(threading.RLock())
