"""Polling helper for tests that watch a real cluster from outside (CLI, HTTP
APIs): wait for a condition with a deadline, naming what did not happen."""

from __future__ import annotations

import time

POLL_INTERVAL_S = 0.2


def wait_for(check, what: str, timeout_s: float = 30.0, *, retry_on: tuple = ()):
    """Call ``check`` until it returns something truthy and return that; an
    exception of a type in ``retry_on`` (a server not serving yet) counts as
    not yet. Fails the test after ``timeout_s``, naming ``what``."""
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        try:
            value = check()
        except retry_on as error:
            last = error
        else:
            if value:
                return value
        time.sleep(POLL_INTERVAL_S)
    detail = f" (last error: {last})" if last is not None else ""
    raise AssertionError(f"timed out waiting for {what}{detail}")
