"""The public API, above the core: what ``import tray`` offers a program
(``init``, ``remote``, ``get``, ``put``, ``wait``, actors, placement groups,
the runtime context), implemented against whatever runtime ``init``
started.

The core (``tray/core``) knows nothing of this layer. One concern per file:

* ``session``: ``init``/``shutdown``, auto-init, the backends by name, the
  job's runtime environment;
* ``blocking``: how a user's call waits for the core's async operations,
  from the driver's thread, a task, an async actor or a method thread;
* ``remote_function``, ``actor``, ``remote``: what ``@tray.remote`` makes;
* ``objects``: ``get``, ``put``, ``wait``, ``cancel``;
* ``cluster_info``, ``runtime_context``: what the cluster has, what runs here;
* ``options``, ``scheduling_strategies``, ``placement_group``: options of a
  task or actor and where it runs;
* ``futures``: what Ray's API hands the user's threads and asyncio
  (``ref.future()``, ``ref.as_future()``, ``await ref`` under ``asyncio.run``),
  attached to the core's ``ObjectRef`` from here;
* ``state``: the runtime this process started."""

from __future__ import annotations

from ..core.object_ref import ObjectRef as ObjectRef
from . import futures as _futures  # attaches ref.future() & co. to ObjectRef
from .actor import ActorClass as ActorClass
from .actor import ActorHandle as ActorHandle
from .actor import ActorMethod as ActorMethod
from .actor import exit_actor as exit_actor
from .actor import get_actor as get_actor
from .actor import kill as kill
from .actor import method as method
from .cluster_info import available_resources as available_resources
from .cluster_info import cluster_resources as cluster_resources
from .cluster_info import get_gpu_ids as get_gpu_ids
from .cluster_info import nodes as nodes
from .objects import cancel as cancel
from .objects import get as get
from .objects import put as put
from .objects import wait as wait
from .remote import remote as remote
from .remote_function import RemoteFunction as RemoteFunction
from .runtime_context import get_runtime_context as get_runtime_context
from .session import TrayContext as TrayContext
from .session import init as init
from .session import is_initialized as is_initialized
from .session import register_backend as register_backend
from .session import shutdown as shutdown

del _futures
