"""Calls from a core worker to the GCS, riding out a GCS restart.

While the GCS is down (killed and restarted by its supervisor, its tables
in Redis), a call retries every heartbeat period for up to
``gcs_reconnect_timeout_s``; then it raises ``TrayError`` naming the call,
which fails the one operation that needed the GCS."""

from __future__ import annotations

import trio

from ... import exceptions
from ..rpc import Endpoint, PeerDisconnected


class GcsClient:
    """Keeps no state of its own (so no ``statistics()`` or
    ``validate_state()``): a call that waits for the GCS is the caller's."""

    def __init__(self, endpoint: Endpoint, gcs_address: str, config) -> None:
        self._endpoint = endpoint
        self.address = gcs_address
        self._config = config

    async def call(self, method: str, *args):
        """Call the GCS; raises TrayError if it stays unreachable too long."""
        deadline = trio.current_time() + self._config.gcs_reconnect_timeout_s
        while True:
            try:
                return await self._endpoint.call(self.address, method, *args)
            except PeerDisconnected:
                if trio.current_time() >= deadline:
                    raise exceptions.TrayError(
                        f"the GCS at {self.address} has been unreachable for "
                        f"{self._config.gcs_reconnect_timeout_s} s (during {method})") from None
                await trio.sleep(self._config.heartbeat_period_s)
