"""Waiting for a task's arguments before it is sent anywhere.

A task is never sent to a node before every object it takes by reference
exists (the paper's rule: dependencies first). The resolver asks each
argument's owner for the object's status — waiting while it is being
made — and replaces small values by the values themselves, so the worker
that runs the task need not fetch them. An argument that failed makes the
task fail with the same error, without running it."""

from __future__ import annotations

import operator

from ..ids import ObjectID
from ..messages import FailedResult, InlineResult
from ..serialization import SerializedObject
from ..task_spec import ArgByRef, ArgByValue


class DependencyResolver:
    """Keeps no state of its own (so no ``statistics()`` or
    ``validate_state()``): a task waiting for its arguments is in the task
    manager's table, and its wait is a task of the submitter's."""

    def __init__(self, object_status, config) -> None:
        # object_status(object_id, owner) -> ObjectStatus (waits until known)
        self._object_status = object_status
        self._config = config

    async def resolve(self, task) -> SerializedObject | None:
        """Wait until every ref argument exists; inline the small ones.
        Returns the error of a failed dependency, if any."""
        spec = task.spec

        async def resolve(arg):
            if not isinstance(arg, ArgByRef):
                return arg, None
            status = await self._object_status(ObjectID(arg.object_id), arg.owner)
            if isinstance(status, FailedResult):
                return arg, status.error
            if isinstance(status, InlineResult) and status.value.size_bytes() <= \
                    self._config.inline_object_max_bytes:
                return ArgByValue(status.value), None
            return arg, None

        failure = None
        args = []
        for arg in spec.args:
            arg, error = await resolve(arg)
            args.append(arg)
            failure = failure or error
        kwargs = {}
        for key, arg in spec.kwargs.items():
            kwargs[key], error = await resolve(arg)
            failure = failure or error
        # A spec is frozen: the task gets one with the values in (none when
        # no argument was inlined, as for most tasks).
        if not (all(map(operator.is_, args, spec.args)) and
                all(map(operator.is_, kwargs.values(), spec.kwargs.values()))):
            task.spec = task.spec.replace(args=tuple(args), kwargs=kwargs)
        return failure
