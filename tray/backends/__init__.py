"""Backends: how a cluster is assembled. Each registers by name."""

from ..api.session import register_backend

register_backend("sim", "tray.backends.sim:start")
register_backend("local", "tray.backends.local:start")
