"""The controller's checkpoint: how and when its state is written to the
GCS's key-value store (``tray.experimental.internal_kv``, namespace
``"serve"``), as Ray Serve keeps it. What the state holds, and how a
restarted controller reads it back, is ``_snapshot``'s.

The checkpoint is the key ``controller/state`` (a pickled snapshot) and one
key per deployment spec, ``controller/spec/`` and the digest of its bytes: a
write puts the specs the state names first and the state after, so a state
never names a missing spec, and deletes the specs the state no longer names
only after it. Writes go one at a time, each a helper task on the
controller's node (``_common.write_checkpoint``, which makes the blocking
key-value calls), aside from the control loop, which goes on while the GCS
restarts; one that fails (the GCS stayed down past its reconnect timeout)
is made again at the next loop step (the state stays ``dirty``), and a
replica whose record failed is not created. The keys outlive any actor's
death, and GCS restarts where the GCS's storage is durable (Redis; the
simulator's): Serve's state is lost only with the GCS's own storage, as in
Ray. ``serve.shutdown()`` deletes them, and no write comes after."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import tray

from . import _common
from ._aio import error_text, spawn
from ._common import SPEC_PREFIX, STATE_KEY
from ._deployment import DeploymentSpec

logger = logging.getLogger("tray.serve")

SPEC_BLOBS_MAX = 1024  # specs pickled and remembered; old ones are pickled again if needed

_spec_blobs: dict = {}  # id(spec) -> (spec, key, blob): each spec pickled once


def spec_blob(spec: DeploymentSpec) -> tuple:
    """(checkpoint key, pickled spec): the key is the digest of the bytes."""
    import hashlib

    import cloudpickle

    cached = _spec_blobs.get(id(spec))
    if cached is None or cached[0] is not spec:
        blob = cloudpickle.dumps(spec)
        cached = (spec, SPEC_PREFIX + hashlib.sha256(blob).hexdigest()[:24], blob)
        _spec_blobs[id(spec)] = cached
        if len(_spec_blobs) > SPEC_BLOBS_MAX:  # bounded: old specs are pickled again if needed
            del _spec_blobs[next(iter(_spec_blobs))]
    return cached[1], cached[2]


def spec_key(spec: DeploymentSpec) -> str:
    return spec_blob(spec)[0]


def _kv_task(function):
    """``function`` (a helper task of _common's) pinned to the controller's
    node: the controller (its owner) sees the worker that runs it on its own
    node, so a retry goes only after an attempt that died, never beside one
    a partition held back whose write could land after a later one."""
    from ..util.scheduling_strategies import NodeAffinitySchedulingStrategy

    # Asked each time: the simulator runs every process in this interpreter.
    node_id = tray.get_runtime_context().get_node_id()
    return function.options(
        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False))


class Checkpointer:
    """Writes the controller's state: ``snapshot()`` gives the state to
    write, ``deployments`` (the controller's, by ``(app, name)``) the specs
    it names. Whoever changes the state sets ``dirty``; the control loop
    writes it (``write_if_dirty``), and a replica's start writes it at once
    (``checkpoint``)."""

    def __init__(self, snapshot: Callable[[], dict], deployments: dict) -> None:
        self._snapshot = snapshot
        self._deployments = deployments
        self.dirty = False
        self._stored_specs: set = set()  # spec keys the GCS holds
        self._maybe_stored_specs: set = set()  # and those it may hold (deleted once stale)
        self._lock: asyncio.Lock | None = None
        self._write_task: asyncio.Task | None = None
        self._off = False  # deleted at shutdown: no more writes

    async def checkpoint(self) -> bool:
        """Write the state; one write at a time, each with the state as it is
        when its turn comes (two writes in flight could land in either order,
        and one could delete a spec the other's state names). Whether it was
        written: a failed write is made again at the next loop step."""
        async with self._the_lock():
            if self._off:
                return True
            try:
                await self._write()
            except Exception as error:  # noqa: BLE001 - e.g. the GCS stayed down too long
                self.dirty = True
                logger.warning("serve controller: writing the checkpoint failed (%s); "
                               "trying again", error_text(error))
                return False
            return True

    def write_if_dirty(self) -> None:
        """Start a write if the state changed and none is in flight."""
        if self.dirty and (self._write_task is None or self._write_task.done()):
            # Aside from the loop: while the GCS restarts the write waits for
            # it, and health checks, drains and routing go on meanwhile.
            self._write_task = spawn(self.checkpoint())

    def _the_lock(self) -> asyncio.Lock:
        if self._lock is None:
            self._lock = asyncio.Lock()
        return self._lock

    async def _write(self) -> None:
        """The specs the state names that the GCS lacks, then the state,
        then the specs no state names any more (a state never names a spec
        the GCS lacks), in one helper task."""
        import cloudpickle

        self.dirty = False
        blobs = dict(spec_blob(dep.spec) for dep in self._deployments.values())
        puts = [(key, blob) for key, blob in blobs.items() if key not in self._stored_specs]
        puts.append((STATE_KEY, cloudpickle.dumps(self._snapshot())))
        stale = [key for key in sorted(self._stored_specs | self._maybe_stored_specs)
                 if key not in blobs]
        self._maybe_stored_specs.update(key for key, _blob in puts[:-1])  # if it fails
        await _kv_task(_common.write_checkpoint).remote(puts, stale)
        self._stored_specs.update(key for key, _blob in puts[:-1])
        self._stored_specs.difference_update(stale)
        self._maybe_stored_specs.difference_update(stale)

    def forget(self) -> None:
        """Know of no stored spec (a recovery starts over)."""
        self._stored_specs.clear()
        self._maybe_stored_specs.clear()

    async def read(self) -> dict:
        """Every key of the checkpoint and its bytes."""
        items = await _kv_task(_common.read_checkpoint).remote()
        # Every spec key, those of a write cut short included: the ones the
        # state does not name go at the first write.
        self._stored_specs.update(key for key in items if key.startswith(SPEC_PREFIX))
        return items

    async def delete(self) -> None:
        """Delete the checkpoint, after any write in flight, and write no more
        (one landing after serve.shutdown() would hand the next Serve this
        one's HTTP options)."""
        async with self._the_lock():
            self._off = True
            try:
                await _kv_task(_common.delete_checkpoint_task).remote()
            except Exception as error:  # noqa: BLE001 - serve.shutdown() deletes it again
                logger.warning("serve controller: deleting the checkpoint failed: %s",
                               error_text(error))
