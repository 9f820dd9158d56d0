"""The dashboard's first stage: hold the port, start the server on first use.

Run as a script by path (``python -P .../_lazy.py``), so that it imports
neither tray nor the web stack: an idle dashboard costs a Python start-up
(tens of milliseconds), not the ~0.4 s of CPU that importing tray,
Starlette and uvicorn takes, which every ``tray.init()`` on a two-core
machine would otherwise pay. It binds the port at once (the URL printed is
right from the start; the starting process binds it and hands it over),
waits until a client connects or the process it follows is gone, and on a connection replaces itself (``exec``) with the
real server (``python -m tray.dashboard --fd N``), handing it the listening
socket: the waiting connection is the server's first request."""

import os
import select
import socket
import sys

POLL_S = 0.5


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def main(argv: list[str]) -> int:
    args = dict(zip(argv[0::2], argv[1::2], strict=False))
    follow_pid = int(args.get("--follow-pid") or 0)
    # The listening socket, bound by the process that started us.
    listener = socket.socket(fileno=int(args["--fd"]))
    while True:
        ready, _, _ = select.select([listener], [], [], POLL_S)
        if ready:
            break
        if follow_pid and not _alive(follow_pid):
            return 0
    listener.set_inheritable(True)
    command = [sys.executable, "-P", "-m", "tray.dashboard", *argv]
    os.execv(sys.executable, command)
    return 1  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
