"""GCS storage backends: in memory (the local backend's default, and the
simulator's, where it outlives a simulated GCS crash as Redis would), and
Redis (durable across a GCS restart of a real cluster).

Each GCS table is one Redis hash ``<prefix>:<table>``; values are the GCS's
pickled records. Calls are synchronous: a local Redis answers in tens of
microseconds, and the GCS does no other I/O while it updates its tables."""

from __future__ import annotations

from ..exceptions import TrayError

CONNECT_TIMEOUT_S = 5.0


class MemoryStorage:
    def __init__(self) -> None:
        self._tables: dict[str, dict[str, bytes]] = {}

    def put(self, table: str, key: str, value: bytes) -> None:
        self._tables.setdefault(table, {})[key] = value

    def get(self, table: str, key: str) -> bytes | None:
        return self._tables.get(table, {}).get(key)

    def delete(self, table: str, key: str) -> None:
        self._tables.get(table, {}).pop(key, None)

    def scan(self, table: str) -> list[tuple[str, bytes]]:
        return sorted(self._tables.get(table, {}).items())


class RedisStorage:
    def __init__(self, address: str, prefix: str = "tray") -> None:
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"bad Redis address {address!r}: use host:port")
        import redis  # only clusters that use Redis pay for the import

        self.address = address
        self.prefix = prefix
        self._client = redis.Redis(host=host, port=int(port),
                                   socket_connect_timeout=CONNECT_TIMEOUT_S,
                                   socket_timeout=CONNECT_TIMEOUT_S)
        try:
            self._client.ping()
        except redis.RedisError as error:
            raise TrayError(f"cannot reach Redis at {address}: {error}") from None

    def _key(self, table: str) -> str:
        return f"{self.prefix}:{table}"

    def put(self, table: str, key: str, value: bytes) -> None:
        self._client.hset(self._key(table), key, value)

    def get(self, table: str, key: str) -> bytes | None:
        return self._client.hget(self._key(table), key)

    def delete(self, table: str, key: str) -> None:
        self._client.hdel(self._key(table), key)

    def scan(self, table: str) -> list[tuple[str, bytes]]:
        items = self._client.hgetall(self._key(table))
        return sorted((key.decode(), value) for key, value in items.items())
