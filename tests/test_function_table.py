"""The owner's function table: a function is uploaded once, by the first
task that needs it; an upload that fails leaves it to the next task instead
of leaving the tasks that waited on it waiting forever."""

from __future__ import annotations

import pytest
import trio

from tray.core.worker.function_table import FunctionTable


class _Gcs:
    """A GCS client whose first ``fails`` calls raise, each after a moment."""

    def __init__(self, fails: int) -> None:
        self.fails = fails
        self.stored: dict[str, bytes] = {}
        self.calls = 0

    async def call(self, method: str, key: str, blob: bytes, overwrite: bool) -> None:
        assert method == "kv_put"
        self.calls += 1
        await trio.sleep(0.01)
        if self.fails:
            self.fails -= 1
            raise ConnectionError("the GCS is unreachable")
        self.stored[key] = blob


async def test_a_function_is_uploaded_once_for_every_task_that_needs_it():
    gcs = _Gcs(fails=0)
    table = FunctionTable(gcs)
    table.export("f1", b"code")
    async with trio.open_nursery() as nursery:
        for _ in range(3):
            nursery.start_soon(table.ensure_exported, "f1")
    assert gcs.stored == {"fn:f1": b"code"} and gcs.calls == 1
    assert table.export_done("f1")
    table.validate_state()


async def test_a_failed_upload_leaves_the_function_to_the_next_task():
    gcs = _Gcs(fails=1)
    table = FunctionTable(gcs)
    table.export("f1", b"code")
    waited = []

    async def waiter():
        await table.ensure_exported("f1")
        waited.append(True)

    async def uploader():
        with pytest.raises(ConnectionError):
            await table.ensure_exported("f1")

    with trio.fail_after(5):  # before the fix, the waiter waited forever
        async with trio.open_nursery() as nursery:
            nursery.start_soon(uploader)
            await trio.sleep(0.001)  # the upload is under way
            nursery.start_soon(waiter)
    # The waiter uploaded it itself once the first upload failed.
    assert waited == [True] and gcs.stored == {"fn:f1": b"code"} and gcs.calls == 2
    table.validate_state()


async def test_a_cancelled_upload_leaves_the_function_to_the_next_task():
    gcs = _Gcs(fails=0)
    table = FunctionTable(gcs)
    table.export("f1", b"code")
    with trio.move_on_after(0.001):
        await table.ensure_exported("f1")
    assert not table.export_done("f1") and gcs.stored == {}
    table.validate_state()
    with trio.fail_after(5):
        await table.ensure_exported("f1")
    assert gcs.stored == {"fn:f1": b"code"}
