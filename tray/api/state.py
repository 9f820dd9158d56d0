"""The API's process-wide state: the runtime ``tray.init`` started in this
process (a backend's object: ``run``/``run_sync`` enter its loop, ``driver``
is its core worker, ``shutdown`` ends it); None before ``init`` and after
``shutdown``. The core knows only the driver's core worker
(``tray.core.context.set_driver``)."""

from __future__ import annotations

runtime = None
