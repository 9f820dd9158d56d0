"""The local backend (real processes, sockets, shared memory) is not built
yet: it is the subject of the local-backend issue. Until then
``tray.init()`` says so and points at the simulated backend."""

from __future__ import annotations

from ...exceptions import TrayError


def start(**options):
    raise TrayError(
        "the 'local' backend (real processes) is not available in this version of tray yet; "
        "run the same program on a simulated cluster with tray.init(backend='sim')")
