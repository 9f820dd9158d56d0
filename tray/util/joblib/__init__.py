"""A joblib backend that runs joblib's batches as tray tasks, as
``ray.util.joblib``.

    from tray.util.joblib import register_ray
    register_ray()
    with joblib.parallel_backend("ray"):      # or "tray", after register_tray()
        search.fit(X, y)                     # scikit-learn's n_jobs runs on the cluster

joblib (and scikit-learn, to use it there) are optional dependencies:
``pip install 'tray[util]'``. Importing this module does not import joblib;
registering does."""

from __future__ import annotations

__all__ = ["register_ray", "register_tray"]

_INSTALL_HINT = ("the tray joblib backend needs joblib: pip install 'tray[util]' "
                 "(or pip install joblib)")


def _register(name: str) -> None:
    try:
        from joblib.parallel import register_parallel_backend

        from .backend import TrayBackend
    except ImportError as error:
        raise ImportError(_INSTALL_HINT) from error
    register_parallel_backend(name, TrayBackend)


def register_ray() -> None:
    """Register the backend as ``"ray"``: ``joblib.parallel_backend("ray")``
    then runs on the tray cluster (Ray programs run unchanged)."""
    _register("ray")


def register_tray() -> None:
    """Register the backend as ``"tray"``: ``joblib.parallel_backend("tray")``."""
    _register("tray")
