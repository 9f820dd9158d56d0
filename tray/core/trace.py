"""The event trace of a run, and its digest.

Every component records what it does (message deliveries, task starts and
finishes, faults) with the virtual time. The simulator hashes the trace; the
same seed must give the same digest in any process. Fields are rendered
canonically (sorted keys, hex ids) so the digest does not depend on dict
order or object addresses."""

from __future__ import annotations

import hashlib
import json
from collections import deque
from collections.abc import Callable
from typing import Any


def _canonical(value: Any) -> Any:
    if hasattr(value, "hex") and callable(value.hex) and not isinstance(value, (bytes, float)):
        return value.hex()
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, dict):
        return {str(k): _canonical(v) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
    if isinstance(value, (list, tuple)):
        return [_canonical(v) for v in value]
    return value


class Trace:
    """A digest over every event, plus the last ``events_kept_max`` events."""

    def __init__(self, now: Callable[[], float], events_kept_max: int = 200_000) -> None:
        self._now = now
        self._hash = hashlib.blake2b(digest_size=16)
        self.events: deque[dict] = deque(maxlen=events_kept_max)
        self.event_count = 0
        self.closed = False

    def close(self) -> None:
        """Freeze the digest: the run is over (late ``__del__``s record nothing)."""
        self.closed = True

    def record(self, component: str, event: str, **fields: Any) -> None:
        if self.closed:
            return
        entry = {"t": round(self._now(), 9), "component": component, "event": event}
        entry.update(_canonical(fields))
        line = json.dumps(entry, sort_keys=True, default=str)
        self._hash.update(line.encode())
        self._hash.update(b"\n")
        self.events.append(entry)
        self.event_count += 1

    def digest(self) -> str:
        return self._hash.hexdigest()
