"""Errors of tray.tune."""

from __future__ import annotations

from ..exceptions import TrayError


class TuneError(TrayError):
    """An experiment could not run, or could not finish (its message says why)."""


TuneError.__module__ = "tray.tune"
