"""``tray start`` / ``tray stop`` / ``tray status``: clusters across machines.

``tray start --head --port 6380`` starts a head node in the background: the
GCS listens on TCP at that port, and the node manager and workers on TCP
ports of their own. It prints the address and the cluster token; on this
machine both are also kept (mode 0600) where ``tray.init(address="auto")``,
``tray start --address`` and ``tray status`` find them. On another machine,
pass the token with ``--token`` or ``TRAY_CLUSTER_TOKEN``.

``tray stop`` stops every node this machine started with ``tray start``."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import psutil
import trio

from ..backends.local import (
    MEMORY_FRACTION,
    OBJECT_STORE_FRACTION,
    _wait_for_node,
    query_gcs,
    resolve_cluster,
)
from ..backends.local.gpus import detect_gpu_count
from ..backends.local.session import (
    CURRENT_CLUSTER_FILE,
    ROOT,
    Session,
    free_port,
    write_current_cluster,
)
from ..exceptions import TrayError

NODE_MARKER = "started-by-tray-start.json"


def add_parsers(commands) -> None:
    start = commands.add_parser("start", help="start a node of a cluster in the background")
    role = start.add_mutually_exclusive_group(required=True)
    role.add_argument("--head", action="store_true", help="start the head node (the GCS)")
    role.add_argument("--address", help="join the cluster whose head is at HOST:PORT")
    start.add_argument("--port", type=int, default=6380, help="the head's GCS port")
    start.add_argument("--node-ip", default="127.0.0.1",
                       help="the IP this node listens on (127.0.0.1 unless told otherwise)")
    start.add_argument("--num-cpus", type=float, default=None)
    start.add_argument("--num-gpus", type=float, default=None)
    start.add_argument("--resources", default="{}", help='custom resources, e.g. \'{"x": 2}\'')
    start.add_argument("--object-store-memory", type=int, default=None, help="bytes")
    start.add_argument("--redis-address", default="",
                       help="keep the GCS tables in Redis at HOST:PORT (head only)")
    start.add_argument("--token", default=None,
                       help="the cluster token (joining from another machine)")
    commands.add_parser("stop", help="stop every node started on this machine by tray start")
    status = commands.add_parser("status", help="nodes, resources, usage and actors")
    status.add_argument("--address", default="auto")


def _port_is_free(ip: str, port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind((ip, port))
        except OSError:
            return False
    return True


def start(args) -> int:
    try:
        resources = json.loads(args.resources)
        if not isinstance(resources, dict):
            raise ValueError
    except ValueError:
        print(f"tray start: --resources must be a JSON object, got {args.resources!r}",
              file=sys.stderr)
        return 2
    if args.head:
        if not _port_is_free(args.node_ip, args.port):
            print(f"tray start: port {args.port} on {args.node_ip} is busy (another cluster, "
                  "or another program); choose another with --port", file=sys.stderr)
            return 1
        token = args.token
        gcs = f"tcp:{args.node_ip}:{args.port}"
    else:
        try:
            gcs, token_bytes = _join_target(args)
            trio.run(query_gcs, gcs, token_bytes, "get_all_nodes")
        except (TrayError, ValueError) as error:
            print(f"tray start: {error}", file=sys.stderr)
            return 1
        token = token_bytes.decode()
    session = Session.create(token)
    cpus = (os.cpu_count() or 1) if args.num_cpus is None else args.num_cpus
    gpus = detect_gpu_count() if args.num_gpus is None else args.num_gpus
    total_memory = psutil.virtual_memory().total
    command = [sys.executable, "-P", "-m", "tray.backends.local.node",
               "--session", session.directory, "--gcs", gcs,
               "--node-address", f"tcp:{args.node_ip}:{free_port(args.node_ip)}",
               "--listen-ip", args.node_ip, "--num-cpus", str(cpus), "--num-gpus", str(gpus),
               "--resources", json.dumps(resources),
               "--memory-bytes", str(int(total_memory * MEMORY_FRACTION)),
               "--object-store-bytes",
               str(args.object_store_memory or int(total_memory * OBJECT_STORE_FRACTION)),
               "--prestart", str(int(cpus))]
    if args.head:
        command.append("--head")
        if args.redis_address:
            command += ["--redis-address", args.redis_address]
    log = open(session.path("node.log"), "ab")
    node = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                            start_new_session=True)
    try:
        info = _wait_for_node(session, 0, node)
    except TrayError as error:
        print(f"tray start: {error}; log: {session.path('node.log')}", file=sys.stderr)
        print(open(session.path("node.log")).read()[-2000:], file=sys.stderr)
        session.remove()
        return 1
    with open(session.path(NODE_MARKER), "w") as file:
        json.dump({"pid": node.pid, "gcs": gcs, "head": bool(args.head)}, file)
    address = gcs.removeprefix("tcp:")
    if args.head:
        write_current_cluster({"address": address, "token": session.token().decode(),
                               "session_dir": session.directory})
        print(f"Started the head node {info['node_id']} at {address}.")
        print(f"  Join from this machine:    tray start --address {address}")
        print(f"  Join from another machine: TRAY_CLUSTER_TOKEN={session.token().decode()} "
              f"tray start --address {address} --node-ip <that machine's IP>")
        print(f"  In a driver:               tray.init(address=\"{address}\")  (or \"auto\")")
    else:
        print(f"Started node {info['node_id']}, joined the cluster at {address}.")
    return 0


def _join_target(args) -> tuple[str, bytes]:
    if args.token:
        os.environ["TRAY_CLUSTER_TOKEN"] = args.token
    return resolve_cluster(args.address)


def stop(args) -> int:
    stopped = 0
    if os.path.isdir(ROOT):
        for name in sorted(os.listdir(ROOT)):
            session = Session(os.path.join(ROOT, name))
            marker = session.path(NODE_MARKER)
            if not os.path.exists(marker):
                continue
            with open(marker) as file:
                pid = json.load(file)["pid"]
            _terminate_group(pid)
            session.remove()
            stopped += 1
    try:
        os.unlink(CURRENT_CLUSTER_FILE)
    except FileNotFoundError:
        pass
    print(f"Stopped {stopped} tray node(s).")
    return 0


def _terminate_group(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        if not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
            break
        time.sleep(0.05)
    try:
        os.killpg(pid, signal.SIGKILL)  # the node's workers too
    except (ProcessLookupError, PermissionError):
        pass


def status(args) -> int:
    try:
        gcs, token = resolve_cluster(args.address)
        nodes = trio.run(query_gcs, gcs, token, "get_all_nodes")
        actors = trio.run(query_gcs, gcs, token, "list_actors")
    except (TrayError, ValueError) as error:
        print(f"tray status: {error}", file=sys.stderr)
        return 1
    alive = [node for node in nodes if node["alive"]]
    print(f"Cluster at {gcs.removeprefix('tcp:')}: {len(alive)} live node(s), "
          f"{len(nodes) - len(alive)} dead")
    for node in nodes:
        state = "alive" if node["alive"] else "dead "
        total = node["resources"]
        available = node.get("available", total)
        usage = ", ".join(f"{name} {total[name] - available.get(name, 0):g}/{total[name]:g}"
                          for name in sorted(total) if name != "memory")
        print(f"  {state} {node['node_id']}  {node.get('hostname', '?')}  {usage}")
    print(f"Actors: {len(actors)}")
    for actor in actors:
        name = f" name={actor['name']!r}" if actor.get("name") else ""
        print(f"  {actor['state']:<16} {actor['class_name']} {actor['actor_id']}{name}")
    return 0
