"""The asyncio loop async actors' methods run on, for both backends:
trio-asyncio's, on the worker's trio loop (``ProcessEnv.asyncio_loops``).

trio-asyncio, and asyncio with it, are imported by the first async actor,
not at a process's start (~30 ms that every node and worker paid)."""

from __future__ import annotations


class TrioAsyncioLoops:
    """``tray.core.interfaces.AsyncioLoops`` on trio-asyncio."""

    @staticmethod
    def open_loop():
        import trio_asyncio

        return trio_asyncio.open_loop()

    @staticmethod
    def run_aio_future(future):
        from trio_asyncio import run_aio_future

        return run_aio_future(future)


TRIO_ASYNCIO = TrioAsyncioLoops()
