"""The report collector's logic (the barrier behind tray.train.report),
driven directly on asyncio: no cluster, no processes."""

from __future__ import annotations

import asyncio
import os

import pytest

from tray.train import _worker
from tray.train._session import staging_dir
from tray.train._worker import ReportCollector


def run(coroutine):
    return asyncio.run(coroutine)


def test_a_report_completes_when_every_rank_made_it(tmp_path):
    async def main():
        collector = ReportCollector(2, str(tmp_path), attempt=3, first_checkpoint_index=7)
        os.makedirs(staging_dir(str(tmp_path), 3, 0))  # rank 1 copied its files
        first = asyncio.ensure_future(collector.report(0, 0, {"loss": 1.0}, False))
        await asyncio.sleep(0)
        assert not first.done()  # rank 0 waits for rank 1
        stats = await collector.statistics()
        assert (stats.barriers_open, stats.ranks_waiting, stats.completed_waiting) == (1, 1, 0)
        second = await collector.report(1, 0, None, True)
        committed = await first
        # Rank 1 brought checkpoint files: the staging directory became the next
        # checkpoint, and both ranks learn its path.
        assert committed == second == str(tmp_path / "checkpoint_000007")
        assert os.path.isdir(committed)
        answer = await collector.poll(0, wait=False)
        [report] = answer["results"]
        assert report["metrics"] == {"loss": 1.0}  # rank 0's
        assert report["checkpoint"] == committed
        assert not answer["all_finished"]
        await collector.finished(0, 1)
        await collector.finished(1, 1)
        answer = await collector.poll(1, wait=True)  # all finished: returns at once
        assert answer == {"results": [], "all_finished": True}
        assert (await collector.statistics()).taken == 1
    run(main())


def test_a_rank_that_stops_reporting_fails_the_others(tmp_path):
    async def main():
        collector = ReportCollector(2, str(tmp_path), attempt=0, first_checkpoint_index=0)
        waiting = asyncio.ensure_future(collector.report(0, 0, {}, False))
        await asyncio.sleep(0)
        await collector.finished(1, 0)  # rank 1 returned without reporting
        with pytest.raises(RuntimeError, match="rank 1 returned from its training function "
                                               "after 0 report"):
            await waiting
        with pytest.raises(RuntimeError, match="the same number of times"):
            await collector.report(0, 1, {}, False)  # and any later report
    run(main())


def test_reports_wait_for_a_driver_that_falls_behind(tmp_path, monkeypatch):
    monkeypatch.setattr(_worker, "RESULTS_AHEAD_MAX", 2)

    async def main():
        collector = ReportCollector(1, str(tmp_path), attempt=0, first_checkpoint_index=0)
        await collector.report(0, 0, {"i": 0}, False)
        await collector.report(0, 1, {"i": 1}, False)
        third = asyncio.ensure_future(collector.report(0, 2, {"i": 2}, False))
        await asyncio.sleep(0.01)
        assert not third.done()  # two reports wait for the driver: the third is held
        answer = await collector.poll(0, wait=False)
        assert [r["index"] for r in answer["results"]] == [0, 1]
        await asyncio.sleep(0.01)
        assert not third.done()  # polling is not taking: the driver has not moved on
        await collector.poll(1, wait=False)  # the driver has report 0: room for one more
        await asyncio.wait_for(third, 1)
        answer = await collector.poll(2, wait=False)
        assert [r["index"] for r in answer["results"]] == [2]
    run(main())
