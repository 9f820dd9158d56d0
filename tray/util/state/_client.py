"""One query's way to the cluster (``Client``): through the connected
driver, or over short-lived authenticated connections from a process that
is not part of it; and the GCS's values as the state API shows them
(times as epoch milliseconds, job ids as hex).
"""

from __future__ import annotations

import time

from ... import exceptions

# How long one query may take (Ray's default for the state API too).
DEFAULT_TIMEOUT_S = 30.0


class Client:
    """One query's way to the cluster: the connected driver, or one-shot
    authenticated connections from a process that is not part of it."""

    def __init__(self, address: str | None, timeout: float | None = None) -> None:
        from ...core.context import get_worker

        if timeout is not None and (isinstance(timeout, bool) or
                                    not isinstance(timeout, (int, float)) or timeout <= 0):
            raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
        self.timeout_s = DEFAULT_TIMEOUT_S if timeout is None else float(timeout)
        self.worker = get_worker(required=False) if address is None else None
        self.gcs = self.token = None
        if self.worker is None:
            from ...backends.local import resolve_cluster

            self.gcs, self.token = resolve_cluster(address or "auto")

    def _run(self, calls: list[tuple]) -> list:
        """Run ``[(address or None for the GCS, method, *args)]``; each
        result, or the exception it raised (one failed node or worker must
        not fail the listing)."""
        if self.worker is not None:
            worker = self.worker

            async def gather():
                import trio

                results = []
                with trio.move_on_after(self.timeout_s):
                    for target, method, *args in calls:
                        try:
                            if target is None:
                                results.append(await worker.gcs_call(method, *args))
                            else:
                                results.append(await worker.endpoint.call(target, method,
                                                                          *args))
                        except Exception as error:  # noqa: BLE001 - reported per call
                            results.append(error)
                    return results
                raise exceptions.TrayError(f"the state query did not finish within "
                                           f"{self.timeout_s} s (pass timeout= to wait longer)")

            from ...api.blocking import block

            return block(worker, gather)
        import trio

        from ...backends.local import query_gcs

        async def gather_outside():
            results = []
            with trio.move_on_after(self.timeout_s):
                for target, method, *args in calls:
                    try:
                        results.append(await query_gcs(target or self.gcs, self.token,
                                                       method, *args))
                    except Exception as error:  # noqa: BLE001 - reported per call
                        if target is None:
                            raise
                        results.append(error)
                return results
            raise exceptions.TrayError(f"the state query did not finish within "
                                       f"{self.timeout_s} s (pass timeout= to wait longer)")

        return trio.run(gather_outside)

    def gcs_call(self, method: str, *args):
        result = self._run([(None, method, *args)])[0]
        if isinstance(result, Exception):
            raise result
        return result

    def flush_own_events(self) -> None:
        """A connected driver's own buffered task events go to the GCS first."""
        if self.worker is not None:
            from ...api.blocking import block

            block(self.worker, self.worker.task_events.flush)


def to_epoch_ms(gcs_time: float | None, gcs_now: float) -> int | None:
    """A time on the GCS's loop clock as ms since the epoch (this machine's
    clock; the simulator's driver reads real time, so simulated times come
    out as dates around the query, spaced in virtual seconds)."""
    if gcs_time is None:
        return None
    return int((time.time() - (gcs_now - gcs_time)) * 1000)


def job_hex(job: int | None) -> str:
    from ...core.ids import JobID

    return JobID.from_int(job).hex() if job is not None else ""
