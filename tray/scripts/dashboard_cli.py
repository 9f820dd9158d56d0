"""``tray dashboard``: the URL that opens the cluster's dashboard.

Every page of the dashboard needs the cluster's token (see
``tray/dashboard/_auth.py``); this prints its URL with the dashboard key
that logs a browser in, as ``tray start`` did, for whoever holds the
token (on the head's machine, or with ``TRAY_CLUSTER_TOKEN``)."""

from __future__ import annotations

import sys

import click
import trio

from ..exceptions import TrayError


@click.command()
@click.option("--address", default="auto", show_default=True,
              help="the cluster's HOST:PORT, or 'auto' (the one tray start started here)")
def dashboard(address: str) -> int:
    """Print the URL that logs a browser in to the cluster's dashboard."""
    from ..backends.local import query_gcs, resolve_cluster
    from ..dashboard import login_url, read_url

    try:
        gcs, token = resolve_cluster(address)
        nodes = trio.run(query_gcs, gcs, token, "get_all_nodes")
    except (TrayError, ValueError) as error:
        print(f"tray dashboard: {error}", file=sys.stderr)
        raise click.exceptions.Exit(1) from None
    url = next(filter(None, (read_url(node.session_dir) for node in nodes if node.alive)),
               None)
    if url is None:
        print("tray dashboard: the cluster serves no dashboard on this machine (started "
              "with --no-include-dashboard, or its head runs elsewhere: there, run tray "
              "dashboard)", file=sys.stderr)
        raise click.exceptions.Exit(1)
    click.echo(login_url(url, token))
    return 0
