"""Consuming a dataset: batches, rows, and the iterators of streaming_split.

``DataIterator`` turns a stream of bundles (from the executor, or from a
split coordinator) into batches of the asked size and format. Blocks are
fetched ``prefetch_batches`` ahead (``tray.wait(fetch_local=True)`` starts
their transfer while the consumer works on the current batch).

``streaming_split(n)`` runs one execution for ``n`` consumers (the workers
of a data-parallel trainer): a coordinator actor owns the executor and
hands blocks to whichever split asks next; with ``equal=True`` it cuts the
stream into rounds of equal row counts, and at the end drops the remainder
(fewer than ``n`` rows) so every split sees the same number of rows.
"""

from __future__ import annotations

import collections
import time

import numpy as np

import tray

from . import _block as B
from ._context import DataContext
from ._plan import execute_plan
from ._seed import fresh_seed


def _fetch_blocks(bundles, prefetch_blocks: int):
    """The blocks of ``bundles``, fetched ``prefetch_blocks`` ahead."""
    window: collections.deque = collections.deque()
    for bundle in bundles:
        for ref in bundle.refs:
            window.append(ref)
            if len(window) > prefetch_blocks:
                yield tray.get(window.popleft())
            elif prefetch_blocks:
                tray.wait(list(window), num_returns=len(window), timeout=0, fetch_local=True)
    while window:
        yield tray.get(window.popleft())


def batch_tables(blocks, batch_size, *, drop_last: bool = False,
                 local_shuffle_buffer_size: int | None = None, seed: int | None = None):
    """Arrow tables of exactly ``batch_size`` rows (the last may be
    shorter unless ``drop_last``); ``None`` yields each block whole."""
    if batch_size is not None and (isinstance(batch_size, bool) or
                                   not isinstance(batch_size, int) or batch_size <= 0):
        raise ValueError(f"batch_size must be a positive integer or None, got {batch_size!r}")
    if local_shuffle_buffer_size is not None:
        if not isinstance(local_shuffle_buffer_size, int) or local_shuffle_buffer_size <= 0:
            raise ValueError("local_shuffle_buffer_size must be a positive integer, got "
                             f"{local_shuffle_buffer_size!r}")
        yield from _shuffled_batches(blocks, batch_size or 256, drop_last,
                                     local_shuffle_buffer_size, seed)
        return
    buffer, rows = [], 0
    for block in blocks:
        if block.num_rows == 0:
            continue
        if batch_size is None:
            yield block
            continue
        buffer.append(block)
        rows += block.num_rows
        if rows >= batch_size:
            table = B.concat(buffer)
            start = 0
            while table.num_rows - start >= batch_size:
                yield table.slice(start, batch_size)
                start += batch_size
            rest = table.slice(start)
            buffer, rows = ([rest], rest.num_rows) if rest.num_rows else ([], 0)
    if rows and not drop_last:
        yield B.concat(buffer)


def _shuffled_batches(blocks, batch_size, drop_last, buffer_size, seed):
    rng = np.random.default_rng(seed)
    buffer, rows = [], 0
    for block in blocks:
        if block.num_rows == 0:
            continue
        buffer.append(block)
        rows += block.num_rows
        while rows >= max(buffer_size, batch_size):
            table = B.concat(buffer)
            table = table.take(rng.permutation(table.num_rows))
            yield table.slice(0, batch_size)
            rest = table.slice(batch_size)
            buffer, rows = [rest], rest.num_rows
    if rows:
        table = B.concat(buffer)
        table = table.take(rng.permutation(table.num_rows))
        for start in range(0, table.num_rows, batch_size):
            piece = table.slice(start, batch_size)
            if piece.num_rows == batch_size or not drop_last:
                yield piece


class DataIterator:
    """Batches and rows of a stream of blocks (Ray's ``DataIterator``)."""

    # What materialize() builds: ``_dataset.MaterializedDataset``, which
    # names itself here when it is defined. ``_dataset`` imports this
    # module (a dataset's iterator), so this one does not import it back.
    materialized_class = None

    def __init__(self, open_bundles, name: str = "Dataset") -> None:
        self._open_bundles = open_bundles  # () -> iterator of bundles
        self._name = name

    def __repr__(self) -> str:
        return f"DataIterator({self._name})"

    def _blocks(self, prefetch_batches: int):
        return _fetch_blocks(self._open_bundles(), max(0, int(prefetch_batches)))

    def iter_batches(self, *, prefetch_batches: int = 1, batch_size: int | None = 256,
                     batch_format: str = "default", drop_last: bool = False,
                     local_shuffle_buffer_size: int | None = None,
                     local_shuffle_seed: int | None = None, _collate_fn=None):
        B.check_batch_format(batch_format)
        if local_shuffle_buffer_size is not None and local_shuffle_seed is None:
            local_shuffle_seed = fresh_seed()
        tables = batch_tables(self._blocks(prefetch_batches), batch_size, drop_last=drop_last,
                              local_shuffle_buffer_size=local_shuffle_buffer_size,
                              seed=local_shuffle_seed)
        for table in tables:
            yield B.block_to_batch(table, batch_format)

    def iter_rows(self, *, prefetch_batches: int = 1):
        for block in self._blocks(prefetch_batches):
            yield from B.block_to_rows(block)

    def iter_torch_batches(self, *, prefetch_batches: int = 1, batch_size: int | None = 256,
                           dtypes=None, device: str = "auto", collate_fn=None,
                           drop_last: bool = False, local_shuffle_buffer_size: int | None = None,
                           local_shuffle_seed: int | None = None):
        try:
            import torch
        except ImportError:
            raise ImportError("iter_torch_batches needs PyTorch: pip install torch") from None
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() and tray.get_gpu_ids() else "cpu"
        for batch in self.iter_batches(prefetch_batches=prefetch_batches, batch_size=batch_size,
                                       batch_format="numpy", drop_last=drop_last,
                                       local_shuffle_buffer_size=local_shuffle_buffer_size,
                                       local_shuffle_seed=local_shuffle_seed):
            if collate_fn is not None:
                yield collate_fn(batch)
                continue
            out = {}
            for name, array in batch.items():
                if array.dtype == object:
                    raise TypeError(f"iter_torch_batches: column {name!r} holds Python objects "
                                    "(strings or ragged lists), which torch cannot hold; "
                                    "select_columns() the numeric ones or pass collate_fn")
                dtype = dtypes.get(name) if isinstance(dtypes, dict) else dtypes
                tensor = torch.as_tensor(np.array(array, copy=not array.flags.writeable),
                                         dtype=dtype)
                out[name] = tensor.to(device)
            yield out

    def materialize(self):
        return self.materialized_class.from_bundles(list(self._open_bundles()), "FromIterator")


# ================================================================ streaming_split


RETRY = "retry"  # a split asked for an epoch that has not started yet


@tray.remote
class SplitCoordinator:
    """Owns one execution per epoch and deals its blocks out to n splits."""

    # Blocks dealt to one split and not yet taken: a split that runs ahead
    # waits (its call answers RETRY) rather than piling blocks up for a
    # split that lags; the executor's budget does not see dealt blocks.
    QUEUED_BLOCKS_MAX = 64

    def __init__(self, plan, n: int, equal: bool, context: DataContext) -> None:
        self.plan = plan
        self.n = n
        self.equal = equal
        self.context = context
        self.epoch = -1
        self.finished: set = set()
        self._bundles = None
        self._queues = [collections.deque() for _ in range(n)]
        self._buffer: list = []  # (ref, meta) waiting for a round (equal=True)
        self._buffered_rows = 0
        self._round_rows = 0
        self._exhausted = False

    def _start(self, epoch: int) -> None:
        self.epoch = epoch
        self.finished = set()
        self._bundles = execute_plan(self.plan, self.context)
        self._queues = [collections.deque() for _ in range(self.n)]
        self._buffer, self._buffered_rows, self._exhausted = [], 0, False

    def next_block(self, index: int, epoch: int):
        if epoch > self.epoch:
            if self.epoch >= 0 and len(self.finished) < self.n:
                return RETRY
            self._start(epoch)
        elif epoch < self.epoch:
            return None
        while not self._queues[index]:
            if self._exhausted:
                self.finished.add(index)
                return None
            if max(len(queue) for queue in self._queues) >= self.QUEUED_BLOCKS_MAX:
                return RETRY  # another split lags: wait for it rather than buffer more
            self._pull(index)
        return self._queues[index].popleft()

    def _pull(self, index: int) -> None:
        try:
            bundle = next(self._bundles)
        except StopIteration:
            self._exhausted = True
            if self.equal:
                self._deal(final=True)
            return
        pairs = list(zip(bundle.refs, bundle.metas, strict=False))
        if not self.equal:
            for ref, meta in pairs:
                self._queues[index].append([ref, meta.num_rows])
            return
        for ref, meta in pairs:
            if meta.num_rows:
                self._buffer.append((ref, meta))
                self._buffered_rows += meta.num_rows
                self._round_rows = self._round_rows or meta.num_rows
        self._deal(final=False)

    def _deal(self, final: bool) -> None:
        from ._shuffle import gather_rows, rows_call

        while self._buffered_rows >= self.n * max(1, self._round_rows) or \
                (final and self._buffered_rows >= self.n):
            share = self._round_rows if not final or \
                self._buffered_rows >= self.n * self._round_rows else self._buffered_rows // self.n
            for split in range(self.n):
                call = rows_call(self._buffer, split * share, (split + 1) * share)
                block_ref, _meta_ref = gather_rows.options(num_returns=2).remote(*call.args)
                self._queues[split].append([block_ref, share])
            taken = self.n * share
            call = rows_call(self._buffer, taken, self._buffered_rows)
            if call is None:
                self._buffer, self._buffered_rows = [], 0
            else:
                rest_ref, rest_meta = gather_rows.options(num_returns=2).remote(*call.args)
                rest_rows = self._buffered_rows - taken
                from ._block import BlockMetadata

                self._buffer = [(rest_ref, BlockMetadata(rest_rows, 0, None))]
                self._buffered_rows = rest_rows
        if final:
            self._buffer, self._buffered_rows = [], 0  # fewer than n rows: dropped


class _SplitBundle:
    def __init__(self, ref, num_rows: int) -> None:
        self.refs = [ref]
        self.metas = [B.BlockMetadata(num_rows, 0, None)]


class StreamSplitIterator(DataIterator):
    """One of ``streaming_split``'s iterators; picklable (pass it to a
    task or actor). Each ``iter_batches``/``iter_rows`` is one epoch, and
    every split must consume its share of an epoch before the next starts."""

    RETRY_SLEEP_S = 0.01
    RETRIES_MAX = 100_000

    def __init__(self, coordinator, index: int, n: int) -> None:
        self._coordinator = coordinator
        self._index = index
        self._n = n
        self._epoch = -1
        super().__init__(self._stream, f"split {index} of {n}")

    def __reduce__(self):
        return (StreamSplitIterator, (self._coordinator, self._index, self._n))

    def _stream(self):
        self._epoch += 1
        epoch = self._epoch
        retries = 0
        while True:
            answer = tray.get(self._coordinator.next_block.remote(self._index, epoch))
            if answer == RETRY:
                retries += 1
                if retries > self.RETRIES_MAX:
                    raise RuntimeError(f"streaming_split: split {self._index} waited for the "
                                       "other splits to finish the previous epoch too long")
                time.sleep(self.RETRY_SLEEP_S)
                continue
            if answer is None:
                return
            ref, num_rows = answer
            yield _SplitBundle(ref, num_rows)
