"""tray: a distributed task-and-actor runtime with Ray's core API.

``import tray`` works like ``import ray`` for the core API; every cluster can
also run as a deterministic simulation (``tray.init(backend="sim", seed=N)``)."""

from . import actor as actor
from . import backends as _backends  # registers the backends
from . import exceptions as exceptions
from . import job_config as job_config
from . import util as util
from ._timeline import timeline as timeline
from .api import ActorClass as ActorClass
from .api import ActorHandle as ActorHandle
from .api import RemoteFunction as RemoteFunction
from .api import TrayContext as TrayContext
from .api import available_resources as available_resources
from .api import cancel as cancel
from .api import cluster_resources as cluster_resources
from .api import get as get
from .api import get_actor as get_actor
from .api import get_gpu_ids as get_gpu_ids
from .api import get_runtime_context as get_runtime_context
from .api import init as init
from .api import is_initialized as is_initialized
from .api import kill as kill
from .api import method as method
from .api import nodes as nodes
from .api import put as put
from .api import remote as remote
from .api import shutdown as shutdown
from .api import wait as wait
from .core.object_ref import ObjectRef as ObjectRef
from .version import __version__ as __version__

ObjectID = ObjectRef  # Ray's old name for it, still exported by ray


# Show public names in tracebacks and reprs (as trio does).
for _name in ("ObjectRef", "ActorHandle", "ActorClass", "RemoteFunction", "TrayContext"):
    globals()[_name].__module__ = "tray"
del _name, _backends

__all__ = ["init", "shutdown", "is_initialized", "remote", "method", "get", "put", "wait",
           "cancel", "kill", "get_actor", "nodes", "cluster_resources", "available_resources",
           "get_gpu_ids", "get_runtime_context", "ObjectRef", "ObjectID", "ActorHandle",
           "TrayContext", "actor", "exceptions", "job_config", "util", "timeline",
           "__version__"]
