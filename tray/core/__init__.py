"""The runtime logic of tray, free of I/O (see ARCHITECTURE.md, "The rule").

``tray.core.init`` is ``tray.init``: backends register by name, so the core
never imports one."""

from .api import init as init
from .api import register_backend as register_backend
from .api import shutdown as shutdown
