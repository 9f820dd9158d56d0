"""tray.tune: hyperparameter tuning on tray, with Ray Tune's API.

``from tray import tune``; then ``tune.Tuner(train, param_space=...,
tune_config=tune.TuneConfig(...), run_config=tune.RunConfig(...)).fit()``.
In the simulator (``tray.init(backend="sim", seed=N)``) a whole experiment
is deterministic: the same seed gives the same trials, the same scheduling
decisions and the same best result, with ``time.sleep`` in trainables free
(virtual time) and with injected faults.
"""

from . import schedulers as schedulers
from . import search as search
from . import stopper as stopper
from ._session import TuneContext as TuneContext
from ._session import get_checkpoint as get_checkpoint
from ._session import get_context as get_context
from ._session import report as report
from .checkpoint import Checkpoint as Checkpoint
from .config import CheckpointConfig as CheckpointConfig
from .config import FailureConfig as FailureConfig
from .config import RunConfig as RunConfig
from .config import TuneConfig as TuneConfig
from .error import TuneError as TuneError
from .experiment import Trial as Trial
from .result_grid import Result as Result
from .result_grid import ResultGrid as ResultGrid
from .search.sample import choice as choice
from .search.sample import grid_search as grid_search
from .search.sample import lograndint as lograndint
from .search.sample import loguniform as loguniform
from .search.sample import qloguniform as qloguniform
from .search.sample import qrandint as qrandint
from .search.sample import qrandn as qrandn
from .search.sample import quniform as quniform
from .search.sample import randint as randint
from .search.sample import randn as randn
from .search.sample import sample_from as sample_from
from .search.sample import uniform as uniform
from .stopper import Stopper as Stopper
from .trainable import Trainable as Trainable
from .trainable import with_parameters as with_parameters
from .trainable import with_resources as with_resources
from .tuner import Tuner as Tuner

for _cls in (CheckpointConfig, FailureConfig, RunConfig, TuneConfig):
    _cls.__module__ = "tray.tune"
del _cls

__all__ = [
    "Tuner", "TuneConfig", "RunConfig", "CheckpointConfig", "FailureConfig", "ResultGrid",
    "Result", "Checkpoint", "report", "get_checkpoint", "get_context", "TuneContext",
    "Trainable", "with_parameters", "with_resources", "TuneError", "Trial", "Stopper",
    "grid_search", "choice", "uniform", "quniform", "loguniform", "qloguniform", "randint",
    "qrandint", "lograndint", "randn", "qrandn", "sample_from", "schedulers", "search",
    "stopper",
]
