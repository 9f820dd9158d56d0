"""Settings a backend reads from its process's environment for the core,
which reads none itself (the layer rule)."""

from __future__ import annotations

import dataclasses
import os


def with_task_events_setting(config, environ=None):
    """``config`` with task events turned off where ``TRAY_TASK_EVENTS=0``
    (every process of a cluster reads its own environment, as before)."""
    environ = os.environ if environ is None else environ
    if environ.get("TRAY_TASK_EVENTS", "1") == "0" and config.task_events_enabled:
        return dataclasses.replace(config, task_events_enabled=False)
    return config
