"""A node process of a local cluster: the node manager, which starts worker
processes on demand (and prestarts some), plus the GCS on the head node
(``--head``): inside this process, or, when its tables live in Redis, as a
supervised process of its own that is restarted when it dies.

Run by ``tray.init()`` (backend "local"); exits on SIGTERM/SIGINT, or when
the driver it serves dies (``--exit-with-driver``), killing its workers."""

from __future__ import annotations

import argparse
import fcntl
import json
import logging
import os
import random
import signal
import socket
import struct
import subprocess
import sys
import termios

import trio

from ...core.config import DEFAULT_CONFIG
from ...core.gcs.gcs_server import GcsServer
from ...core.ids import NodeID
from ...core.interfaces import NodeLocation, NullTracer, ProcessEnv
from ...core.node.node_manager import NodeManager
from ...transports.tcp import TcpTransport
from ..storage import MemoryStorage, RedisStorage
from .memory import config_from_environ, read_memory
from .session import Session
from .store import ShmObjectStore
from .zygote import ForkedWorker, Zygote, prefork

logger = logging.getLogger("tray.node")


# Asked to stop, a node first forwards what its workers wrote (at most so long).
OUTPUT_DRAIN_S = 0.5


class ProcessSpawner:
    """Worker processes of this node: forked by the node's zygote (see
    ``zygote``) where it can, started fresh (``python -m
    tray.backends.local.worker``) where it cannot."""

    def __init__(self, session: Session, node_id: str, gcs: str, node_manager: str,
                 object_store_bytes: int, store_directory: str, node_index: int,
                 worker_ip: str = "", node_gpus: float = 0, log_to_driver: bool = True) -> None:
        self.session = session
        self.log_to_driver = log_to_driver
        self.node_gpus = node_gpus
        self.worker_ip = worker_ip
        self.node_index = node_index
        self.store_directory = store_directory
        self.node_id = node_id
        self.gcs = gcs
        self.node_manager = node_manager
        self.object_store_bytes = object_store_bytes
        self.processes: dict[str, subprocess.Popen | ForkedWorker] = {}
        self.output_fds: set[int] = set()  # (the workers' pipes being forwarded)
        self.nursery: trio.Nursery | None = None
        self.zygote: Zygote | None = None

    def start(self, nursery: trio.Nursery, zygote: tuple | None) -> None:
        """Begin serving, with the zygote ``main`` forked (None: none)."""
        self.nursery = nursery
        if zygote is not None:
            self.zygote = Zygote.start(nursery, zygote)

    def start_worker(self, worker_id_hex: str, env: dict) -> None:
        argv = ["--session", self.session.directory, "--worker-id", worker_id_hex,
                "--node-id", self.node_id, "--gcs", self.gcs,
                "--node-manager", self.node_manager, "--store-dir", self.store_directory,
                "--spill-dir", self.session.node_spill_directory(self.node_index),
                "--object-store-bytes", str(self.object_store_bytes),
                "--node-gpus", str(self.node_gpus)]
        if self.worker_ip:
            argv += ["--listen-ip", self.worker_ip]
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        try:
            if not env and self.zygote is not None and self.zygote.alive:
                process = self.zygote.fork(worker_id_hex, argv, dict(os.environ), out_w, err_w)
            else:
                # A runtime_env's env_vars are read at interpreter start
                # (and TRAY_WORKER_PYTHON, e.g. a profiler, wraps it): fresh.
                python = os.environ.get("TRAY_WORKER_PYTHON", sys.executable)
                process = subprocess.Popen(
                    [python, "-P", "-m", "tray.backends.local.worker", *argv],
                    stdin=subprocess.DEVNULL, stdout=out_w, stderr=err_w,
                    env={**os.environ, **env})
        except BaseException:
            for fd in (out_r, err_r):
                os.close(fd)
            raise
        finally:
            for fd in (out_w, err_w):
                os.close(fd)
        self.processes[worker_id_hex] = process
        # The worker's output goes to the node's own output (the driver's
        # terminal for tray.init clusters; not with log_to_driver=False),
        # each line prefixed as Ray does, and to log files in the session.
        os.makedirs(self.session.path("logs"), exist_ok=True)
        targets = (sys.stdout, sys.stderr) if self.log_to_driver else (None, None)
        for fd, target, suffix in ((out_r, targets[0], "out"), (err_r, targets[1], "err")):
            log_path = self.session.path(f"logs/worker-{worker_id_hex[:12]}.{suffix}")
            self.nursery.start_soon(_forward_output, fd, target, process, log_path,
                                    self.output_fds)

    async def drain_output(self, timeout_s: float) -> None:
        """Until what the workers wrote is forwarded (a task's last print
        before the driver shut the cluster down), at most ``timeout_s``."""
        with trio.move_on_after(timeout_s):
            while any(_unread(fd) for fd in list(self.output_fds)):
                await trio.sleep(0.01)
            await trio.sleep(0.01)  # (the last chunk read: written out)

    def kill_worker(self, worker_id_hex: str) -> None:
        process = self.processes.pop(worker_id_hex, None)
        if process is not None and process.poll() is None:
            process.kill()
            if isinstance(process, subprocess.Popen):
                process.wait()  # (the zygote reaps the ones it forked)

    def kill_all(self) -> None:
        for worker_id in list(self.processes):
            self.kill_worker(worker_id)
        if self.zygote is not None:
            self.zygote.close()

    def reap(self, node_manager: NodeManager) -> None:
        if self.zygote is not None:
            self.zygote.reap()
        for worker_id, process in list(self.processes.items()):
            if process.poll() is not None:
                del self.processes[worker_id]
                node_manager.worker_process_exited(worker_id, process.returncode)


def _unread(fd: int) -> int:
    try:
        return struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0" * 4))[0]
    except OSError:
        return 0


async def _forward_output(fd: int, target, process, log_path: str, fds: set) -> None:
    stream = trio.lowlevel.FdStream(fd)
    pending = b""
    prefix = b""
    fds.add(fd)
    try:
        with open(log_path, "ab") as log:
            async with stream:
                while True:
                    try:
                        chunk = await stream.receive_some(65536)
                    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                        break
                    if not chunk:
                        break
                    log.write(chunk)
                    log.flush()
                    if target is None:
                        continue
                    if not prefix:
                        # (A forked worker's pid arrives with the zygote's reply.)
                        if isinstance(process, ForkedWorker):
                            await process.started.wait()
                        prefix = f"(worker pid={process.pid}) ".encode()
                    *lines, pending = (pending + chunk).split(b"\n")
                    if lines:
                        target.buffer.write(b"".join(prefix + line + b"\n" for line in lines))
                        target.flush()
    finally:
        fds.discard(fd)
    if pending and target is not None:
        if not prefix:
            prefix = f"(worker pid={process.pid}) ".encode()
        target.buffer.write(prefix + pending + b"\n")
        target.flush()


async def _watch_driver(pid: int, cancel_scope: trio.CancelScope) -> None:
    while True:
        await trio.sleep(0.2)
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            logger.warning("driver %d is gone: stopping the cluster", pid)
            cancel_scope.cancel()
            return


async def _reap(spawner: ProcessSpawner, node_manager: NodeManager) -> None:
    while True:
        await trio.sleep(0.1)
        spawner.reap(node_manager)


async def _supervise_gcs(session: Session, gcs_address: str, redis_address: str) -> None:
    """Run the GCS in a process of its own; start it again when it dies
    (its tables are in Redis)."""
    command = [sys.executable, "-P", "-m", "tray.backends.local.gcs_server",
               "--session", session.directory, "--address", gcs_address,
               "--redis-address", redis_address, "--parent", str(os.getpid())]
    while True:
        process = subprocess.Popen(command, stdin=subprocess.DEVNULL)
        try:
            while process.poll() is None:
                await trio.sleep(0.1)
        finally:
            if process.poll() is None:  # the node is stopping
                process.kill()
                process.wait()
        logger.warning("the GCS (pid %d) exited with code %s; starting it again",
                       process.pid, process.returncode)
        await trio.sleep(0.2)


async def run_node(args, zygote: tuple | None) -> None:
    session = Session(args.session)
    config = config_from_environ(DEFAULT_CONFIG)
    transport = TcpTransport(session.token())
    resources = {"CPU": float(args.num_cpus), "memory": float(args.memory_bytes),
                 **json.loads(args.resources)}
    if args.num_gpus:
        resources["GPU"] = float(args.num_gpus)
    rng = random.Random()
    node_id = NodeID.from_random(rng).hex()
    if args.head:
        gcs_address = args.gcs or session.address("gcs")
    else:
        gcs_address = args.gcs
    node_address = args.node_address or session.address(f"raylet-{args.node_index}")
    store_directory = session.node_store_directory(args.node_index)
    spawner = ProcessSpawner(session, node_id, gcs_address, node_address,
                             args.object_store_bytes, store_directory, args.node_index,
                             args.listen_ip, resources.get("GPU", 0),
                             log_to_driver=not args.no_log_to_driver)
    spill_directory = session.node_spill_directory(args.node_index)
    node_location = NodeLocation(store_directory=store_directory,
                                 spill_directory=spill_directory,
                                 session_dir=session.directory, ip=args.listen_ip or "local",
                                 hostname=socket.gethostname())
    try:
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async with trio.open_nursery() as nursery:
                spawner.start(nursery, zygote)
                wait_for_gcs_s = 0.0
                if args.head and args.redis_address:
                    RedisStorage(args.redis_address)  # fail now if Redis is unreachable
                    nursery.start_soon(_supervise_gcs, session, gcs_address, args.redis_address)
                    wait_for_gcs_s = config.gcs_reconnect_timeout_s
                elif args.head:
                    gcs_env = ProcessEnv(address=gcs_address, transport=transport,
                                         rng=random.Random(), tracer=NullTracer(),
                                         config=config, storage=MemoryStorage())
                    await GcsServer(gcs_env, nursery).run()
                store = ShmObjectStore(store_directory, args.object_store_bytes, spill_directory)
                node_env = ProcessEnv(
                    address=node_address, transport=transport, rng=rng, tracer=NullTracer(),
                    config=config, node_id=node_id, object_store=store,
                    spawner=spawner, gcs_address=gcs_address, resources=resources,
                    prestart_workers=args.prestart, node_location=node_location,
                    exit_process=nursery.cancel_scope.cancel, wait_for_gcs_s=wait_for_gcs_s,
                    read_memory=read_memory)
                node_manager = NodeManager(node_env, nursery)
                await node_manager.run()
                session.write_info(args.node_index, {
                    "pid": os.getpid(), "node_id": node_id, "gcs_address": gcs_address,
                    "node_manager_address": node_address, "store_directory": store_directory,
                    "spill_directory": spill_directory,
                    "object_store_bytes": args.object_store_bytes, "resources": resources})
                if args.exit_with_driver:
                    nursery.start_soon(_watch_driver, args.exit_with_driver,
                                       nursery.cancel_scope)
                nursery.start_soon(_reap, spawner, node_manager)
                async for _ in signals:
                    await spawner.drain_output(OUTPUT_DRAIN_S)
                    nursery.cancel_scope.cancel()
                    break
    finally:
        spawner.kill_all()
        if args.exit_with_driver and args.head:
            session.remove()  # the driver may be gone: nobody else will


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="tray-node")
    parser.add_argument("--session", required=True)
    parser.add_argument("--head", action="store_true")
    parser.add_argument("--node-index", type=int, default=0)
    parser.add_argument("--gcs", default="",
                        help="the GCS address: where the head listens, or where to join")
    parser.add_argument("--node-address", default="", help="where the node manager listens")
    parser.add_argument("--listen-ip", default="",
                        help="workers listen on TCP at this IP (multi-machine clusters)")
    parser.add_argument("--redis-address", default="", help="keep the GCS tables in Redis")
    parser.add_argument("--num-cpus", type=float, required=True)
    parser.add_argument("--num-gpus", type=float, default=0)
    parser.add_argument("--resources", default="{}")
    parser.add_argument("--memory-bytes", type=int, required=True)
    parser.add_argument("--object-store-bytes", type=int, required=True)
    parser.add_argument("--prestart", type=int, default=0)
    parser.add_argument("--exit-with-driver", type=int, default=0)
    parser.add_argument("--no-log-to-driver", action="store_true",
                        help="the workers' output to their log files only")
    args = parser.parse_args(argv)
    # The zygote first: it must not inherit the node's logging setup (a
    # forked worker configures its own), event loop or connections.
    zygote = None
    if os.environ.get("TRAY_WORKER_FORK", "1") != "0" and "TRAY_WORKER_PYTHON" not in os.environ:
        zygote = prefork()
    logging.basicConfig(level=os.environ.get("TRAY_LOG_LEVEL", "WARNING"),
                        format=f"(tray node {args.node_index}) %(levelname)s %(message)s")
    trio.run(run_node, args, zygote)


if __name__ == "__main__":
    main()
