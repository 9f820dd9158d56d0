"""Search algorithms: the default variant generator, the ``Searcher`` base
class, ``ConcurrencyLimiter``, and ``OptunaSearch`` (``tray.tune.search.optuna``)."""

from .sample import Domain as Domain
from .searcher import ConcurrencyLimiter as ConcurrencyLimiter
from .searcher import Searcher as Searcher
from .variant_generator import BasicVariantGenerator as BasicVariantGenerator

for _cls in (Searcher, ConcurrencyLimiter, BasicVariantGenerator):
    _cls.__module__ = "tray.tune.search"
del _cls

__all__ = ["Searcher", "ConcurrencyLimiter", "BasicVariantGenerator", "Domain"]
