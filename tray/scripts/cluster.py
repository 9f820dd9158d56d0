"""``tray start`` / ``tray stop`` / ``tray status``: clusters across machines.

``tray start --head --port 6380`` starts a head node in the background: the
GCS listens on TCP at that port, and the node manager and workers on TCP
ports of their own. It prints the address and the cluster token; on this
machine both are also kept (mode 0600) where ``tray.init(address="auto")``,
``tray start --address`` and ``tray status`` find them. On another machine,
pass the token in ``TRAY_CLUSTER_TOKEN`` or a 0600 file (``--token-file``):
never on the command line, where every user of the machine reads it in the
process list. ``--tls`` (the default when the head listens on an IP other
than loopback) puts traffic between machines in TLS; the token then begins
with ``tls:`` and carries that choice to every process that holds it.

``tray stop`` stops the nodes this user started on this machine with ``tray
start``: a node is signalled only when its pid, its start time, its owner and
its command line all match what ``tray start`` recorded, so a recycled pid
is never hit."""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import secrets
import socket
import stat
import subprocess
import sys
import time

import click
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
from ..backends.local.memory import machine_memory_bytes
from ..backends.local.session import (
    CURRENT_CLUSTER_FILE,
    ROOT,
    Session,
    UnsafeSessionRoot,
    check_private_directory,
    create_private_file,
    free_port,
    open_private_file,
    read_private_file,
    write_current_cluster,
)
from ..core.gcs.demand import worker_limit_reason
from ..exceptions import TrayError
from ..transports.tls import TLS_TOKEN_PREFIX, TlsUnavailableError, tls_contexts

NODE_MARKER = "started-by-tray-start.json"


_START_EPILOG = ("The token: a joining node reads it from TRAY_CLUSTER_TOKEN or --token-file "
                 "(or, on the head's machine, from where tray start --head keeps it).")


def _exit(code: int) -> None:
    if code:
        raise click.exceptions.Exit(code)


@click.command(epilog=_START_EPILOG)
@click.option("--head", is_flag=True, help="start the head node (the GCS)")
@click.option("--address", default=None, help="join the cluster whose head is at HOST:PORT")
@click.option("--port", type=int, default=6380, show_default=True, help="the head's GCS port")
@click.option("--node-ip", default="127.0.0.1",
              help="the IP this node listens on (127.0.0.1 unless told otherwise)")
@click.option("--num-cpus", type=float, default=None)
@click.option("--num-gpus", type=float, default=None)
@click.option("--resources", default="{}", help='custom resources, e.g. \'{"x": 2}\'')
@click.option("--object-store-memory", type=int, default=None, help="bytes")
@click.option("--redis-address", default="",
              help="keep the GCS tables in Redis at HOST:PORT (head only)")
@click.option("--token-file", default=None, metavar="PATH",
              help="a file (mode 0600, yours) holding the cluster token: the head uses it "
                   "instead of a new one; a joining node uses it instead of "
                   "TRAY_CLUSTER_TOKEN. The token is never taken on the command line, where "
                   "every user of the machine can read it (/proc/PID/cmdline)")
# Refused with an explanation rather than unknown: it used to exist.
@click.option("--token", default=None, hidden=True)
@click.option("--tls/--no-tls", default=None,
              help="(head) TLS 1.3 between all processes on TCP, with certificates derived "
                   "from the token; on by default when --node-ip is not a loopback address "
                   "(needs the cryptography package: tray[tls])")
@click.option("--include-dashboard/--no-include-dashboard", default=True,
              help="(head) serve the dashboard and /metrics (default: on)")
@click.option("--dashboard-host", default="127.0.0.1", show_default=True,
              help="(head) the dashboard's IP; 0.0.0.0 opens it to the network")
@click.option("--dashboard-port", type=int, default=None,
              help="(head) the dashboard's port (default 8265, or a free one when taken)")
@click.option("--autoscaling-config", default=None, metavar="PATH",
              help="(head) run the autoscaler with this cluster YAML (local provider)")
def start(**options) -> int:
    """Start a node of a cluster in the background."""
    if options["head"] == (options["address"] is not None):
        raise click.UsageError("give exactly one of --head (start the head node) or "
                               "--address HOST:PORT (join a cluster)")
    if options["autoscaling_config"] is not None:
        from ..autoscaler import load as load_autoscaling_config

        if not options["head"]:
            raise click.UsageError("--autoscaling-config goes with --head")
        try:
            config = load_autoscaling_config(options["autoscaling_config"])
        except ValueError as error:
            raise click.UsageError(str(error)) from None
        if config.provider_type != "local":
            raise click.UsageError(f"tray start runs the autoscaler with the local provider; "
                                   f"the config says provider.type {config.provider_type!r}")
    code = _start(argparse.Namespace(**options))
    _exit(code)
    return code


@click.command()
def stop() -> int:
    """Stop the nodes you started on this machine with tray start (only
    processes it can prove are those nodes)."""
    code = _stop(argparse.Namespace())
    _exit(code)
    return code


@click.command()
@click.option("--address", default="auto", show_default=True,
              help="the cluster's HOST:PORT, or 'auto' (the one tray start started here)")
def status(address: str) -> int:
    """Nodes, resources, usage and actors."""
    code = _status(argparse.Namespace(address=address))
    _exit(code)
    return code


def _port_is_free(ip: str, port: int) -> bool:
    """Could the GCS listen there? As its listener will (SO_REUSEADDR): the
    TIME_WAIT connections a crashed head left do not make the port taken
    (they kept a restart off it for ~60 s), a listener does."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((ip, port))
        except OSError:
            return False
    return True


def _is_loopback(ip: str) -> bool:
    try:
        return ipaddress.ip_address(ip).is_loopback
    except ValueError:
        return ip == "localhost"


def read_token_file(path: str) -> str:
    """The token kept in ``path``, which must be this user's and unreadable
    by anyone else."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as error:
        raise TrayError(f"cannot read the token file {path}: {error.strerror}") from None
    with os.fdopen(fd, "rb") as file:
        info = os.fstat(file.fileno())
        if info.st_uid != os.getuid():
            raise TrayError(f"the token file {path} belongs to user {info.st_uid}, not to you")
        if info.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise TrayError(f"the token file {path} has mode {stat.S_IMODE(info.st_mode):o}: "
                            f"others can read the token; chmod 600 {path}")
        token = file.read().decode().strip()
    if len(token) < 16:
        raise TrayError(f"the token in {path} is too short (at least 16 characters)")
    return token


def _head_token(args) -> str:
    token = read_token_file(args.token_file) if args.token_file else secrets.token_hex(32)
    tls = args.tls
    if tls is None:
        tls = token.startswith(TLS_TOKEN_PREFIX.decode()) or not _is_loopback(args.node_ip)
    if tls and not token.startswith(TLS_TOKEN_PREFIX.decode()):
        token = TLS_TOKEN_PREFIX.decode() + token
    if not tls and token.startswith(TLS_TOKEN_PREFIX.decode()):
        raise TrayError("this token begins with 'tls:', which asks for TLS; drop --no-tls")
    if tls:
        try:
            tls_contexts(token.encode())  # fail here, with the reason, not in the node
        except TlsUnavailableError as error:
            raise TrayError(f"{error}; or start with --no-tls on a network you trust") from None
    elif not _is_loopback(args.node_ip):
        print("tray start: warning: without --tls, traffic between machines is neither "
              "encrypted nor protected from someone on the network path, who could take over "
              "an authenticated connection; use --tls unless you trust the network",
              file=sys.stderr)
    return token


def _start(args) -> int:
    if args.token is not None:
        print("tray start: --token would show the token to every user of this machine in the "
              "process list (/proc/PID/cmdline); pass it in TRAY_CLUSTER_TOKEN or in a file "
              "only you can read (--token-file PATH)", file=sys.stderr)
        return 2
    try:
        resources = json.loads(args.resources)
        if not isinstance(resources, dict):
            raise ValueError
    except ValueError:
        print(f"tray start: --resources must be a JSON object, got {args.resources!r}",
              file=sys.stderr)
        return 2
    try:
        if args.head:
            if not _port_is_free(args.node_ip, args.port):
                print(f"tray start: port {args.port} on {args.node_ip} is busy (another "
                      "cluster, or another program); choose another with --port",
                      file=sys.stderr)
                return 1
            token = _head_token(args)
            gcs = f"tcp:{args.node_ip}:{args.port}"
        else:
            if args.tls is not None:
                print("tray start: --tls is chosen by the head; a joining node follows its "
                      "token", file=sys.stderr)
                return 2
            gcs, token_bytes = _join_target(args)
            trio.run(query_gcs, gcs, token_bytes, "get_all_nodes")
            token = token_bytes.decode()
        session = Session.create(token)
    except (TrayError, ValueError) as error:
        print(f"tray start: {error}", file=sys.stderr)
        return 1
    cpus = (os.cpu_count() or 1) if args.num_cpus is None else args.num_cpus
    gpus = detect_gpu_count() if args.num_gpus is None else args.num_gpus
    total_memory = machine_memory_bytes()
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
    with open_private_file(session.path("node.log")) as log:
        node = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                start_new_session=True)
    try:
        info = _wait_for_node(session, 0, node)
    except TrayError as error:
        print(f"tray start: {error}; log: {session.path('node.log')}", file=sys.stderr)
        print(open(session.path("node.log")).read()[-2000:], file=sys.stderr)
        session.remove()
        return 1
    # What proves, later, that a process is this node: its pid alone may be
    # recycled, not together with its start time.
    create_private_file(session.path(NODE_MARKER), json.dumps({
        "pid": node.pid, "create_time": psutil.Process(node.pid).create_time(),
        "uid": os.getuid(), "gcs": gcs, "head": bool(args.head)}))
    address = gcs.removeprefix("tcp:")
    if args.head:
        write_current_cluster({"address": address, "token": session.token().decode(),
                               "session_dir": session.directory})
        tls = " (TLS)" if session.token().startswith(TLS_TOKEN_PREFIX) else ""
        print(f"Started the head node {info['node_id']} at {address}{tls}.")
        print(f"  Join from this machine:    tray start --address {address}")
        print(f"  Join from another machine: TRAY_CLUSTER_TOKEN={session.token().decode()} "
              f"tray start --address {address} --node-ip <that machine's IP>")
        print(f"    (or copy {session.path('token')} there, mode 0600, and pass --token-file)")
        print(f"  In a driver:               tray.init(address=\"{address}\")  (or \"auto\")")
        if args.include_dashboard:
            _start_dashboard(args, session, gcs, node.pid)
        if args.autoscaling_config:
            _start_autoscaler(args, session, address, node.pid)
    else:
        print(f"Started node {info['node_id']}, joined the cluster at {address}.")
    return 0


def _start_autoscaler(args, session: Session, address: str, head_pid: int) -> None:
    """The autoscaler's process (tray/autoscaler/__main__.py): it follows
    the head node (exits, ending the nodes it started, when the head does,
    so tray stop ends it too)."""
    command = [sys.executable, "-P", "-m", "tray.autoscaler", "--address", address,
               "--session", session.directory,
               "--config", os.path.abspath(args.autoscaling_config),
               "--follow-pid", str(head_pid)]
    env = {**os.environ, "TRAY_CLUSTER_TOKEN": session.token().decode()}
    with open_private_file(session.path("autoscaler.log")) as log:
        subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env,
                         start_new_session=True)
    print(f"  Autoscaler:                running ({args.autoscaling_config}); log: "
          f"{session.path('autoscaler.log')}")


def _start_dashboard(args, session: Session, gcs: str, head_pid: int) -> None:
    """The dashboard, following the head node: it exits when the node does."""
    from .. import dashboard

    try:
        _, url = dashboard.start_dashboard(gcs_address=gcs, session_dir=session.directory,
                                           host=args.dashboard_host,
                                           port=args.dashboard_port, follow_pid=head_pid)
    except (OSError, ValueError) as error:
        print(f"tray start: the dashboard did not start: {error}", file=sys.stderr)
        return
    # Every page needs the token: the second URL logs a browser in.
    print(f"  Dashboard:                 {url} (log in: "
          f"{dashboard.login_url(url, session.token())})")


def _join_target(args) -> tuple[str, bytes]:
    if args.token_file:
        # This process's environment only: /proc/PID/environ is readable by
        # this user alone, unlike the command line.
        os.environ["TRAY_CLUSTER_TOKEN"] = read_token_file(args.token_file)
    return resolve_cluster(args.address)


# ===================================================================== stop

STOP_TIMEOUT_S = 5.0
# psutil computes start times from clock ticks since boot: the same process
# always reads the same value, another process started in another tick not.
CREATE_TIME_TOLERANCE_S = 0.005


def _stop(args) -> int:
    stopped = 0
    try:
        if os.path.lexists(ROOT):
            check_private_directory(ROOT)
            names = sorted(os.listdir(ROOT))
        else:
            names = []
    except UnsafeSessionRoot as error:
        print(f"tray stop: {error}", file=sys.stderr)
        return 1
    for name in names:
        if not name.startswith("session-"):
            continue
        session = Session(os.path.join(ROOT, name))
        try:
            check_private_directory(session.directory)
            marker = json.loads(read_private_file(session.path(NODE_MARKER)))
        except FileNotFoundError:
            continue  # a tray.init() cluster's session, or one still starting
        except (UnsafeSessionRoot, OSError, ValueError) as error:
            print(f"tray stop: skipping {session.directory}: {error}", file=sys.stderr)
            continue
        node = _recorded_node(marker, session)
        if node is None:
            continue
        if node is not _GONE:
            _terminate_node(node)
            stopped += 1
        session.remove()
    try:
        os.unlink(CURRENT_CLUSTER_FILE)
    except FileNotFoundError:
        pass
    print(f"Stopped {stopped} tray node(s).")
    return 0


_GONE = object()


def _recorded_node(marker: dict, session: Session):
    """The node process this session's marker describes, ``_GONE`` if it has
    exited, or None (with a message) if a process holds its pid but cannot be
    proved to be it: then nothing is signalled, and the session is kept."""
    pid, started = marker.get("pid"), marker.get("create_time")
    if not isinstance(pid, int) or not isinstance(started, (int, float)):
        print(f"tray stop: {session.directory} records no start time for its node (pid "
              f"{pid}): it cannot be told from another process with that pid, so it is left "
              "alone; stop it yourself, then remove that directory", file=sys.stderr)
        return None
    try:
        process = psutil.Process(pid)
        same = (abs(process.create_time() - started) <= CREATE_TIME_TOLERANCE_S
                and process.uids().real == os.getuid()
                and session.directory in process.cmdline())
    except psutil.NoSuchProcess:
        return _GONE
    except psutil.AccessDenied:
        same = False
    if not same:
        print(f"tray stop: pid {pid} is no longer the node of {session.directory} (another "
              "process has that pid now): not signalling it", file=sys.stderr)
        return _GONE
    return process


def _group_members(leader: psutil.Process) -> list[psutil.Process]:
    """The other processes of the node's process group (its workers, its
    GCS): while any of them lives, the kernel gives nobody else that group
    id, and psutil refuses to signal a Process whose pid was reused."""
    members = []
    for process in psutil.process_iter():
        try:
            if process.pid != leader.pid and os.getpgid(process.pid) == leader.pid and \
                    process.uids().real == os.getuid():
                members.append(process)
        except (psutil.Error, ProcessLookupError, PermissionError):
            pass
    return members


def _running(process: psutil.Process) -> bool:
    """Alive and not a zombie (a node's parent, tray start, has exited: the
    zombie waits for init, which may take its time)."""
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _terminate_node(node: psutil.Process) -> None:
    members = _group_members(node)
    try:
        node.terminate()  # the node kills its workers on the way out
    except psutil.NoSuchProcess:
        pass
    deadline = time.monotonic() + STOP_TIMEOUT_S
    while time.monotonic() < deadline and _running(node):
        time.sleep(0.02)
    known = {process.pid for process in members}
    members += [p for p in _group_members(node) if p.pid not in known]
    if _running(node):
        members.append(node)
    for process in members:
        try:
            process.kill()
        except psutil.NoSuchProcess:
            pass


def worker_limit_lines(waits) -> list[str]:
    """``tray status``'s line for each node at its worker cap with leases
    waiting (the GCS's ``worker_limits``: ``WorkerLimitWait`` records)."""
    return [f"node {wait.node_id}: worker limit {wait.limit} reached, "
            f"{wait.leases} {'lease waits' if wait.leases == 1 else 'leases wait'} for a "
            f"worker ({len(wait.actors)} of them actor creations; workers_per_node_max)"
            for wait in waits]


def _status(args) -> int:
    try:
        gcs, token = resolve_cluster(args.address)
        nodes = trio.run(query_gcs, gcs, token, "get_all_nodes")
        actors = trio.run(query_gcs, gcs, token, "list_actors")
        at_cap = trio.run(query_gcs, gcs, token, "worker_limits")
    except (TrayError, ValueError) as error:
        print(f"tray status: {error}", file=sys.stderr)
        return 1
    alive = [node for node in nodes if node.alive]
    print(f"Cluster at {gcs.removeprefix('tcp:')}: {len(alive)} live node(s), "
          f"{len(nodes) - len(alive)} dead")
    from ..dashboard import login_url, read_url

    url = next(filter(None, (read_url(node.session_dir) for node in alive)), None)
    if url:
        print(f"Dashboard: {url} (log in: {login_url(url, token)})")
    for node in nodes:
        state = "alive" if node.alive else "dead "
        total = node.resources
        available = node.available
        usage = ", ".join(f"{name} {total[name] - available.get(name, 0):g}/{total[name]:g}"
                          for name in sorted(total) if name != "memory")
        print(f"  {state} {node.node_id}  {node.hostname or '?'}  {usage}")
    for line in worker_limit_lines(at_cap):
        print(f"  {line}")
    reasons = {actor_id: worker_limit_reason(wait.limit, wait.node_id)
               for wait in at_cap for actor_id in wait.actors}
    print(f"Actors: {len(actors)}")
    for actor in actors:
        name = f" name={actor.name!r}" if actor.name else ""
        why = reasons.get(actor.actor_id) if actor.state in ("PENDING_CREATION",
                                                             "RESTARTING") else None
        why = f" ({why})" if why else ""
        print(f"  {actor.state:<16} {actor.class_name} {actor.actor_id}{name}{why}")
    from ..autoscaler import STATUS_KEY, format_status

    try:
        raw = trio.run(query_gcs, gcs, token, "kv_get", STATUS_KEY)
    except (TrayError, ValueError):
        raw = None
    print(format_status(None if raw is None else json.loads(raw)))
    return 0
