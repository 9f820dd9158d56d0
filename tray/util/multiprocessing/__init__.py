"""``multiprocessing.Pool`` on a tray cluster, as ``ray.util.multiprocessing``.

``from tray.util.multiprocessing import Pool`` replaces
``from multiprocessing import Pool``: the same API, with the work done by
tray actors anywhere in the cluster (see ``pool.py`` for how it differs)."""

from multiprocessing import JoinableQueue as JoinableQueue

from .pool import AsyncResult as AsyncResult
from .pool import IMapIterator as IMapIterator
from .pool import Pool as Pool
from .pool import PoolStatistics as PoolStatistics
from .pool import TimeoutError as TimeoutError  # noqa: A004 - the stdlib's, as Ray exports it
from .remote_errors import RemoteTraceback as RemoteTraceback

__all__ = ["Pool", "AsyncResult", "IMapIterator", "PoolStatistics", "RemoteTraceback",
           "TimeoutError", "JoinableQueue"]
