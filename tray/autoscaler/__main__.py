"""The autoscaler as a process of its own, for ``tray start --head
--autoscaling-config cluster.yaml``: a driver attached to the head's cluster
that runs the monitor with the local provider, and exits when the head node
does (the nodes it started follow it: they exit with their "driver").

    python -m tray.autoscaler --address HOST:PORT --session DIR \\
        --config cluster.yaml --follow-pid PID
(the token comes in TRAY_CLUSTER_TOKEN, never on the command line)."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time

FOLLOW_PERIOD_S = 0.5


def _running(psutil, pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tray.autoscaler")
    parser.add_argument("--address", required=True)
    parser.add_argument("--session", required=True)
    parser.add_argument("--config", required=True)
    parser.add_argument("--follow-pid", type=int, default=0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=os.environ.get("TRAY_LOG_LEVEL", "INFO"),
                        format="(tray autoscaler) %(levelname)s %(message)s")
    import psutil

    import tray

    from ..backends.local.session import Session
    from . import Monitor, load
    from .providers import LocalNodeProvider

    config = load(args.config)
    tray.init(address=args.address)
    from ..api import state

    runtime = state.runtime
    gcs = runtime.info["gcs_address"]
    provider = LocalNodeProvider(Session(args.session), gcs, config,
                                 node_ip=gcs.removeprefix("tcp:").rpartition(":")[0])
    monitor = Monitor(config, provider, runtime.driver)
    runtime.driver.spawn(monitor.run)
    try:
        while not args.follow_pid or _running(psutil, args.follow_pid):
            time.sleep(FOLLOW_PERIOD_S)
    finally:
        provider.terminate_all()
    return 0


if __name__ == "__main__":
    sys.exit(main())
