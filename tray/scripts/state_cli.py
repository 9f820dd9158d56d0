"""``tray list``, ``tray summary``, ``tray get``, ``tray memory``, ``tray
logs`` and ``tray timeline``: the state API (``tray.util.state``) on the
command line, as Ray's ``ray list``/``ray summary``/``ray get``/``ray
memory``/``ray logs``/``ray timeline``.

Every command reads a running cluster without joining it (no driver, no
job): ``--address`` is the GCS's ``host:port`` (``auto``, the default: the
cluster ``tray start --head`` started on this machine), and the token comes
from ``TRAY_CLUSTER_TOKEN`` or that cluster's session files. Logs are files
on the machine that runs the worker: ``tray logs`` reads those of the nodes
on this machine."""

from __future__ import annotations

import json
import os
import socket
import sys
import time
import warnings

import click

RESOURCES = ("tasks", "actors", "objects", "nodes", "workers", "jobs", "placement-groups")
FOLLOW_POLL_S = 0.25
# How long ``--follow`` runs at most (a bound on every loop): a day.
FOLLOW_MAX_S = 24 * 3600.0

_ADDRESS = click.option("--address", default="auto", show_default=True,
                        help="the cluster's GCS HOST:PORT, or 'auto' (the one tray start "
                             "started on this machine)")
_FORMAT = click.option("--format", "output_format", type=click.Choice(["table", "json"]),
                       default="table", show_default=True)


def _state():
    from ..util import state

    return state


def _fail(error: Exception) -> None:
    raise click.ClickException(str(error))


def _parse_filters(filters: tuple[str, ...]) -> list[tuple[str, str, str]]:
    """``key=value`` / ``key!=value`` into the state API's triples."""
    parsed = []
    for text in filters:
        if "!=" in text:
            key, _, value = text.partition("!=")
            predicate = "!="
        elif "=" in text:
            key, _, value = text.partition("=")
            predicate = "="
        else:
            raise click.BadParameter(f"{text!r}: a filter is KEY=VALUE or KEY!=VALUE",
                                     param_hint="--filter")
        if not key.strip():
            raise click.BadParameter(f"{text!r}: the filter has no key", param_hint="--filter")
        parsed.append((key.strip(), predicate, value.strip()))
    return parsed


def _plain(value):
    if hasattr(value, "asdict"):
        return {k: v for k, v in value.asdict().items()}
    return value


def _cell(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, dict):
        return ",".join(f"{k}:{_cell(v)}" for k, v in value.items())
    if isinstance(value, list):
        return f"[{len(value)}]"
    text = str(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _print_table(rows: list[dict], columns: list[str] | None = None) -> None:
    if not rows:
        click.echo("(none)")
        return
    columns = columns or [k for k in rows[0] if any(r.get(k) is not None for r in rows)]
    cells = [[_cell(row.get(c)) for c in columns] for row in rows]
    widths = [max(len(c.upper()), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]
    click.echo("  ".join(c.upper().ljust(w) for c, w in zip(columns, widths, strict=True)))
    for row in cells:
        click.echo("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip())


def _echo_json(value) -> None:
    click.echo(json.dumps(value, indent=2, sort_keys=True, default=str))


def _call(function: str, **options):
    """A state API call; its warnings (a truncated listing, dropped events)
    go to stderr as notes, its errors become the command's error."""
    from ..exceptions import TrayError

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            result = getattr(_state(), function)(**options)
        except (TrayError, ValueError) as error:
            _fail(error)
    for warning in caught:
        click.echo(f"note: {warning.message}", err=True)
    return result


# ===================================================================== list


@click.command(name="list")
@click.argument("resource", type=click.Choice(RESOURCES))
@click.option("--filter", "filters", multiple=True, metavar="KEY=VALUE",
              help="keep rows whose KEY is (KEY=VALUE) or is not (KEY!=VALUE) VALUE; "
                   "repeat to AND them")
@click.option("--limit", type=int, default=100, show_default=True)
@click.option("--detail", is_flag=True, help="every field, not only the main columns")
@_FORMAT
@_ADDRESS
def list_(resource: str, filters, limit: int, detail: bool, output_format: str,
          address: str) -> int:
    """List the cluster's tasks, actors, objects, nodes, workers, jobs or
    placement groups."""
    function = "list_" + resource.replace("-", "_")
    rows = _call(function, address=address, filters=_parse_filters(filters), limit=limit,
                 detail=detail)
    rows = [_plain(row) for row in rows]
    if output_format == "json":
        _echo_json(rows)
    else:
        _print_table(rows)
    return 0


# ================================================================== summary


@click.command()
@click.argument("resource", type=click.Choice(("tasks", "actors", "objects")))
@_FORMAT
@_ADDRESS
def summary(resource: str, output_format: str, address: str) -> int:
    """Tasks by function and state, actors by class and state, or objects by
    reference type."""
    result = _call("summarize_" + resource, address=address)
    if output_format == "json":
        _echo_json(result)
        return 0
    result = result["cluster"]
    if resource == "objects":
        body = result["summary"]
        click.echo(f"{body['total_objects']} object reference(s), "
                   f"{body['total_size_bytes']} bytes known")
        for title, key in (("by reference type", "by_reference_type"),
                           ("by task status", "by_task_status")):
            click.echo(f"{title}: " + (", ".join(f"{k} {v}" for k, v in body[key].items())
                                       or "none"))
        return 0
    entries = list(result["summary"].values())
    states = sorted({state for entry in entries for state in entry["state_counts"]})
    name_key = "func_or_class_name" if resource == "tasks" else "class_name"
    rows = [{name_key: entry[name_key], **({"type": entry["type"]} if resource == "tasks"
                                            else {}),
             **{state: entry["state_counts"].get(state, 0) for state in states}}
            for entry in entries]
    if resource == "tasks":
        click.echo(f"{result['total_tasks']} task(s), {result['total_actor_tasks']} actor "
                   f"call(s), {result['total_actor_scheduled']} actor creation(s)")
    else:
        click.echo(f"{result['total_actors']} actor(s)")
    _print_table(rows)
    return 0


# ====================================================================== get


@click.command()
@click.argument("resource", type=click.Choice(("actor", "task", "node")))
@click.argument("resource_id")
@_ADDRESS
def get(resource: str, resource_id: str, address: str) -> int:
    """Every field of one actor, task or node, by id (JSON)."""
    found = _call("get_" + resource, id=resource_id, address=address)
    if found is None:
        raise click.ClickException(f"no {resource} with id {resource_id} in this cluster")
    _echo_json(_plain(found))
    return 0


# =================================================================== memory


@click.command()
@click.option("--group-by", type=click.Choice(["owner", "process"]), default="owner",
              show_default=True,
              help="group references by the process that owns each object, or by the "
                   "process that holds the reference")
@_FORMAT
@_ADDRESS
def memory(group_by: str, output_format: str, address: str) -> int:
    """Object references grouped by owner (or by holding process) with size,
    reference type and call site, and each node's object store, spilled bytes
    included."""
    from ..backends.local.session import human_bytes

    result = _call("memory_summary", address=address)
    if group_by == "owner":
        result = {**result, "processes": _by_owner(result["processes"])}
    if output_format == "json":
        _echo_json(result)
        return 0
    click.echo("Object store per node")
    _print_table([{"node_id": n["node_id"], "ip": n["node_ip"],
                   "used": human_bytes(n["store_used_bytes"]),
                   "capacity": human_bytes(n["store_total_bytes"]),
                   "spilled": human_bytes(n["spilled_bytes"]),
                   "spilled_objects": n["spilled_objects"]} for n in result["nodes"]])
    totals = result["totals"]
    click.echo(f"\n{totals['objects']} object reference(s), {human_bytes(totals['object_bytes'])} "
               "known; by reference type: "
               + (", ".join(f"{k} {v}" for k, v in totals["by_reference_type"].items())
                  or "none"))
    for process in result["processes"]:
        if not process["objects"]:
            continue
        if group_by == "owner":
            click.echo(f"\n--- owner {process['address']}"
                       + (f" ({process['type']} pid {process['pid']} on node "
                          f"{(process['node_id'] or '-')[:12]})" if process["pid"] else ""))
        else:
            click.echo(f"\n--- {process['type']} pid {process['pid']} on node "
                       f"{(process['node_id'] or '-')[:12]} ({process['address']})")
        _print_table([{"object_id": o["object_id"], "size": human_bytes(o["object_size"]),
                       "reference_type": o["reference_type"],
                       "task_status": o["task_status"],
                       **({"held_by": o["held_by"]} if group_by == "owner" else
                          {"owner": "this process" if o["owned"] else o["owner_address"]}),
                       "call_site": o["call_site"]} for o in process["objects"]])
        if process.get("left_out"):
            click.echo(f"({process['left_out']} more left out)")
    return 0


def _by_owner(processes: list[dict]) -> list[dict]:
    """memory_summary's per-holder groups regrouped by each object's owner
    (the process whose address owns it), with who holds each reference."""
    known = {p["address"]: p for p in processes}
    groups: dict[str, dict] = {}
    for holder in processes:
        for row in holder["objects"]:
            owner = holder["address"] if row["owned"] else row["owner_address"]
            info = known.get(owner, {})
            group = groups.setdefault(owner, {
                "address": owner, "type": info.get("type", "?"), "pid": info.get("pid"),
                "node_id": info.get("node_id"), "objects": [], "left_out": 0})
            group["objects"].append({**row, "held_by": f"{holder['type']} pid {holder['pid']}"})
    for holder in processes:
        if holder.get("left_out") and holder["address"] in groups:
            groups[holder["address"]]["left_out"] += holder["left_out"]
    return [groups[key] for key in sorted(groups, key=str)]


# ===================================================================== logs


def _session_dirs(address: str) -> list[str]:
    """The session directories of the cluster's nodes on this machine."""
    nodes = _call("list_nodes", address=address, detail=True, limit=10**6)
    here = socket.gethostname()
    directories = []
    for node in nodes:
        directory = node.session_dir
        if directory and node.node_name in (here, node.node_ip) and \
                os.path.isdir(directory) and directory not in directories:
            directories.append(directory)
    return directories


def _log_files(address: str) -> list[tuple[str, str]]:
    """(name as shown, path) of every log file of the cluster on this machine."""
    from ..backends.local import session

    return [entry for directory in _session_dirs(address)
            for entry in session.log_files(directory)]


def _worker_of(kind: str, identifier: str, address: str) -> str:
    if kind == "actor":
        actor = _call("get_actor", id=identifier, address=address)
        if actor is None:
            raise click.ClickException(f"no actor with id {identifier} in this cluster")
        if not actor.worker_id:
            raise click.ClickException(f"actor {identifier} has no worker (state "
                                       f"{actor.state})")
        return actor.worker_id
    return identifier


def _follow(path: str, tail_bytes: int, max_s: float) -> None:
    with open(path, "rb") as file:
        file.seek(0, os.SEEK_END)
        file.seek(max(0, file.tell() - tail_bytes))
        deadline = time.monotonic() + max_s
        while True:
            chunk = file.read(65536)
            if chunk:
                sys.stdout.write(chunk.decode("utf-8", "replace"))
                sys.stdout.flush()
                continue
            if time.monotonic() >= deadline:
                return
            time.sleep(FOLLOW_POLL_S)


@click.command()
@click.argument("filename", required=False)
@click.option("--actor-id", default=None, help="print this actor's worker's log")
@click.option("--worker-id", default=None, help="print this worker's log (an id or its "
                                                 "first 12 characters)")
@click.option("--err", "stream", flag_value="err", help="its stderr instead of its stdout")
@click.option("--out", "stream", flag_value="out", default=True, hidden=True)
@click.option("--tail", "tail_bytes", type=int, default=64 * 1024, show_default=True,
              help="print at most the last this many bytes first")
@click.option("-f", "--follow", is_flag=True, help="keep printing what is appended")
@click.option("--follow-max-s", type=float, default=FOLLOW_MAX_S, hidden=True)
@_ADDRESS
def logs(filename, actor_id, worker_id, stream, tail_bytes, follow, follow_max_s,
         address) -> int:
    """List the cluster's log files on this machine, or print one: FILENAME
    (as listed), or an actor's or a worker's log."""
    files = _log_files(address)
    if filename is None and actor_id is None and worker_id is None:
        if not files:
            click.echo("(no log files on this machine)")
        for name, path in files:
            click.echo(f"{os.path.getsize(path):>10}  {name}")
        return 0
    if filename is not None:
        matches = [path for name, path in files if name == filename or
                   os.path.basename(name) == filename]
        if not matches:
            raise click.ClickException(f"no log file {filename!r} (tray logs lists them)")
    else:
        worker = _worker_of("actor", actor_id, address) if actor_id else worker_id
        suffix = f"worker-{worker[:12]}.{stream or 'out'}"
        matches = [path for name, path in files if os.path.basename(name) == suffix]
        if not matches:
            raise click.ClickException(
                f"no log of worker {worker[:12]} on this machine (its node may be elsewhere)")
    if follow:
        _follow(matches[0], tail_bytes, follow_max_s)
        return 0
    with open(matches[0], "rb") as file:
        file.seek(0, os.SEEK_END)
        file.seek(max(0, file.tell() - tail_bytes))
        sys.stdout.write(file.read().decode("utf-8", "replace"))
    return 0


# ================================================================= timeline


@click.command()
@click.option("-o", "--output", "filename", default=None, metavar="FILE",
              help="where to write the trace (default: tray-timeline-<time>.json)")
@_ADDRESS
def timeline(filename: str | None, address: str) -> int:
    """Write the cluster's timeline as a Chrome trace (open it in Perfetto or
    chrome://tracing): one track per worker per node."""
    from .._timeline import timeline as write_timeline
    from ..exceptions import TrayError

    filename = filename or time.strftime("tray-timeline-%Y-%m-%d_%H-%M-%S.json")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            write_timeline(filename, address=address)
        except (TrayError, ValueError) as error:
            _fail(error)
    for warning in caught:
        click.echo(f"note: {warning.message}", err=True)
    with open(filename) as file:
        count = len(json.load(file))
    click.echo(f"Wrote {count} trace events to {filename}; open it in https://ui.perfetto.dev "
               "or chrome://tracing")
    return 0
