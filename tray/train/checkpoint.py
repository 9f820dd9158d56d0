"""``Checkpoint``: a directory of files a run resumes from.

It is the very class of ``tray.tune.Checkpoint`` (as ``ray.train.Checkpoint``
is ``ray.tune.Checkpoint``): a trainer running as a Tune trial hands its
checkpoints to Tune unchanged, and a checkpoint from either library
restores the other. It lives in ``tray/tune/checkpoint.py``; this module
re-exports it so that ``tray.train.Checkpoint`` and
``tray.tune.Checkpoint`` stay one class whichever is imported first.
"""

from ..tune.checkpoint import Checkpoint as Checkpoint

__all__ = ["Checkpoint"]
