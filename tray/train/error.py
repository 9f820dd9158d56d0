"""The errors of ``tray.train``.

``fit()`` raises ``TrainingFailedError`` when the run failed for good (the
last failure after ``FailureConfig.max_failures`` restarts), as Ray Train
does; the error is also the ``Result.error`` of the run, and carries that
``Result`` (``error.result``: the metrics and checkpoints the run reached).
Its message holds the failing worker's traceback; ``worker_failures`` maps
each failed rank to its error, and ``__cause__`` is the first of them (for
an error raised in the training function, also an instance of the user's
exception class).
"""

from __future__ import annotations

from tray.exceptions import TrayError


class TrainingFailedError(TrayError):
    """The training run failed, after every restart it was allowed."""

    def __init__(self, message: str, worker_failures: dict | None = None,
                 num_restarts: int = 0) -> None:
        super().__init__(message)
        self.message = message
        self.worker_failures = dict(worker_failures or {})
        self.num_restarts = num_restarts
        self.result = None  # the run's Result, set by fit()

    def __reduce__(self):
        return (type(self), (self.message, self.worker_failures, self.num_restarts))


class WorkerGroupStartError(TrayError):
    """The worker group could not be placed or started in time (a failure
    of the attempt, retried within ``max_failures`` like any other)."""


TrainingFailedError.__module__ = "tray.train"
WorkerGroupStartError.__module__ = "tray.train"
