"""``Checkpoint``: a directory of files that a trial can resume from.

As in Ray 2.x a checkpoint is a directory, not an in-memory object: the
trainable writes files into a directory of its choosing and reports
``Checkpoint.from_directory(d)``; tray.tune copies it into the trial's
directory under ``storage_path/name/`` (so ``d`` may be deleted once
``report`` returns) and hands that persisted copy back through
``tune.get_checkpoint()`` and ``Result.checkpoint``. ``storage_path`` must
therefore be a filesystem every node can reach (a shared mount on a real
multi-machine cluster; always true on one machine and in the simulator).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator

_METADATA_FILE = ".metadata.json"


class Checkpoint:
    """A checkpoint directory (Ray's ``tune.Checkpoint``)."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = os.fspath(path)

    @classmethod
    def from_directory(cls, path: str | os.PathLike) -> Checkpoint:
        path = os.fspath(path)
        if not os.path.isdir(path):
            raise ValueError(f"Checkpoint.from_directory: {path!r} is not a directory")
        return cls(path)

    def to_directory(self, path: str | os.PathLike | None = None) -> str:
        """Copy the checkpoint's files to ``path`` (a new temporary directory by
        default) and return it."""
        target = os.fspath(path) if path is not None else tempfile.mkdtemp(prefix="checkpoint_")
        shutil.copytree(self.path, target, dirs_exist_ok=True)
        return target

    @contextlib.contextmanager
    def as_directory(self) -> Iterator[str]:
        """The checkpoint as a local directory to read (no copy: it is local)."""
        yield self.path

    def get_metadata(self) -> dict:
        try:
            with open(os.path.join(self.path, _METADATA_FILE), encoding="utf-8") as file:
                return json.load(file)
        except FileNotFoundError:
            return {}

    def set_metadata(self, metadata: dict) -> None:
        with open(os.path.join(self.path, _METADATA_FILE), "w", encoding="utf-8") as file:
            json.dump(metadata, file)

    def update_metadata(self, metadata: dict) -> None:
        merged = self.get_metadata()
        merged.update(metadata)
        self.set_metadata(merged)

    def __eq__(self, other) -> bool:
        return isinstance(other, Checkpoint) and other.path == self.path

    def __hash__(self) -> int:
        return hash(self.path)

    def __repr__(self) -> str:
        return f"Checkpoint(path={self.path!r})"

    def __fspath__(self) -> str:
        return self.path


Checkpoint.__module__ = "tray.tune"


def persist(source: str, target: str) -> None:
    """Copy a checkpoint directory to its place in the trial directory, all
    or nothing: a crash in the middle leaves a ``.tmp`` directory that no
    one reads (and the next save of that index replaces)."""
    staging = target + ".tmp"
    shutil.rmtree(staging, ignore_errors=True)
    if os.path.abspath(source) == os.path.abspath(target):
        return
    shutil.copytree(source, staging)
    shutil.rmtree(target, ignore_errors=True)
    os.replace(staging, target)
