"""tray's version (``tray.__version__``)."""

__version__ = "0.1.0"
