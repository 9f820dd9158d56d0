"""Serve's errors, with Ray Serve's names (``ray.serve.exceptions``)."""

from __future__ import annotations

from ..exceptions import TrayError


class RayServeException(TrayError):
    """A Serve call that cannot be carried out: an unknown application or
    deployment, a route prefix already taken, a failed deployment."""


class BackPressureError(RayServeException):
    """A request refused because every replica of its deployment is at
    ``max_ongoing_requests`` and ``max_queued_requests`` requests already wait
    (HTTP 503)."""

    def __init__(self, *, num_queued_requests: int, max_queued_requests: int,
                 deployment: str = "") -> None:
        self.num_queued_requests = num_queued_requests
        self.max_queued_requests = max_queued_requests
        self.deployment = deployment
        super().__init__(
            f"Request dropped due to backpressure: {num_queued_requests} requests to "
            f"deployment {deployment!r} are queued, max_queued_requests={max_queued_requests}")

    def __reduce__(self):
        return (_backpressure, (self.num_queued_requests, self.max_queued_requests,
                                self.deployment))


def _backpressure(queued: int, limit: int, deployment: str) -> BackPressureError:
    return BackPressureError(num_queued_requests=queued, max_queued_requests=limit,
                             deployment=deployment)


class DeploymentUnavailableError(RayServeException):
    """A deployment that has no replica to take a request within the wait
    allowed (it failed to deploy, or it is being deleted)."""


class ReplicaDrainedError(RayServeException):
    """A request reached a replica after it finished draining (it was being
    stopped): the replica did not run it, and the router sends it to another
    replica. Callers never see it unless every retry met the same fate."""


for _cls in (RayServeException, BackPressureError, DeploymentUnavailableError,
             ReplicaDrainedError):
    _cls.__module__ = "tray.serve.exceptions"
del _cls

__all__ = ["RayServeException", "BackPressureError", "DeploymentUnavailableError",
           "ReplicaDrainedError"]
