"""Functions and classes by content hash: exported once, loaded once.

The owner side notes a function when a task first uses it and uploads the
pickled blob to the GCS key-value store (``fn:<id>``) before the first
task that needs it is sent; the executor side loads it from there on first
use and keeps the unpickled function. The id is the blob's hash, so two
processes exporting the same code share one entry."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import cloudpickle
import trio

from ... import exceptions
from .gcs_client import GcsClient


def function_id_of(blob: bytes) -> str:
    return hashlib.blake2b(blob, digest_size=16).hexdigest()


@dataclass(frozen=True)
class FunctionTableStatistics:
    exported: int  # functions this process noted for export (uploaded or not)
    exports_pending: int  # noted, not uploaded yet
    exports_uploading: int  # being uploaded now
    loaded: int  # functions this process loaded to run


class FunctionTable:
    def __init__(self, gcs: GcsClient) -> None:
        self._gcs = gcs
        # Owner side: exported ids (an event while the upload is under way),
        # and blobs noted but not uploaded yet. One entry per distinct
        # function of the program: bounded by the program's code.
        self._exported: dict[str, trio.Event | None] = {}
        self._pending_exports: dict[str, bytes] = {}
        # Executor side: what this process loaded (bounded likewise).
        self._functions: dict[str, object] = {}

    def statistics(self) -> FunctionTableStatistics:
        """Counts the uploads under way: O(exported functions)."""
        uploading = sum(event is not None for event in self._exported.values())
        return FunctionTableStatistics(exported=len(self._exported),
                                       exports_pending=len(self._pending_exports),
                                       exports_uploading=uploading,
                                       loaded=len(self._functions))

    def validate_state(self) -> None:
        """Each export in one state: noted and waiting for its first task,
        uploading (an event), or done. O(exported functions)."""
        for function_id in self._pending_exports:
            assert function_id in self._exported, function_id
            # (Its upload takes it out of the pending ones before it begins.)
            assert self._exported[function_id] is None, function_id
        for function_id, event in self._exported.items():
            # (An upload forgets its event before it sets it.)
            assert event is None or not event.is_set(), function_id
        for function_id, function in self._functions.items():
            assert function is not None, function_id

    def export(self, function_id: str, blob: bytes) -> None:
        """Note a function to export; the first task that uses it uploads it
        to the GCS function table (once per process)."""
        if function_id not in self._exported:
            self._exported[function_id] = None
            self._pending_exports[function_id] = blob

    def export_done(self, function_id: str) -> bool:
        """Would ``ensure_exported`` return at once (nothing to upload or
        wait for)?"""
        return function_id not in self._pending_exports and \
            self._exported.get(function_id) is None

    async def ensure_exported(self, function_id: str) -> None:
        """Return once the function is in the GCS: upload it if no task has,
        else wait for the upload under way. An upload that fails (the GCS
        unreachable past its retries, the uploading task cancelled) leaves
        the function noted for the next task, and the tasks waiting on it
        try again at once: none of them waits for an upload that stopped."""
        while True:
            blob = self._pending_exports.pop(function_id, None)
            if blob is not None:
                event = self._exported[function_id] = trio.Event()
                try:
                    await self._gcs.call("kv_put", "fn:" + function_id, blob, False)
                except BaseException:
                    self._pending_exports[function_id] = blob
                    self._exported[function_id] = None
                    event.set()
                    raise
                self._exported[function_id] = None
                event.set()
                return
            event = self._exported.get(function_id)
            if event is None:
                return
            await event.wait()

    async def load(self, function_id: str):
        function = self._functions.get(function_id)
        if function is None:
            blob = await self._gcs.call("kv_get", "fn:" + function_id)
            if blob is None:
                raise exceptions.TrayError(f"function {function_id} is not in the function table")
            function = self._functions[function_id] = cloudpickle.loads(blob)
        return function
