"""The GCS as a process of its own, for a head node whose GCS tables live in
Redis (``tray start --head --redis-address``).

The head node starts it, and starts it again whenever it dies: the new GCS
reads nodes, actors, names and the key-value store back from Redis, while
node managers, workers and drivers retry their GCS calls until it answers
(``gcs_reconnect_timeout_s``). It exits when the head node does."""

from __future__ import annotations

import argparse
import logging
import os
import random
import signal

import trio

from ...core.config import DEFAULT_CONFIG
from ...core.gcs.gcs_server import GcsServer
from ...core.interfaces import NullTracer, ProcessEnv
from ...transports.tcp import TcpTransport
from ..storage import RedisStorage
from .session import Session

PID_FILE = "gcs.pid"


async def _exit_with_parent(parent: int, cancel_scope: trio.CancelScope) -> None:
    while os.getppid() == parent:
        await trio.sleep(0.2)
    cancel_scope.cancel()


async def run(args) -> None:
    session = Session(args.session)
    env = ProcessEnv(address=args.address, transport=TcpTransport(session.token()),
                     rng=random.Random(), tracer=NullTracer(), config=DEFAULT_CONFIG,
                     storage=RedisStorage(args.redis_address))
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with trio.open_nursery() as nursery:
            await GcsServer(env, nursery).run()
            with open(session.path(PID_FILE), "w") as file:
                file.write(str(os.getpid()))
            nursery.start_soon(_exit_with_parent, args.parent, nursery.cancel_scope)
            async for _ in signals:
                nursery.cancel_scope.cancel()
                break


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="tray-gcs")
    parser.add_argument("--session", required=True)
    parser.add_argument("--address", required=True, help="where the GCS listens")
    parser.add_argument("--redis-address", required=True)
    parser.add_argument("--parent", type=int, required=True, help="the head node's pid")
    args = parser.parse_args(argv)
    logging.basicConfig(level=os.environ.get("TRAY_LOG_LEVEL", "WARNING"),
                        format="(tray gcs) %(levelname)s %(message)s")
    trio.run(run, args)


if __name__ == "__main__":
    main()
