"""Trial schedulers: FIFO, ASHA, HyperBand, the median stopping rule and PBT."""

from .async_hyperband import ASHAScheduler as ASHAScheduler
from .async_hyperband import AsyncHyperBandScheduler as AsyncHyperBandScheduler
from .hyperband import HyperBandScheduler as HyperBandScheduler
from .median_stopping_rule import MedianStoppingRule as MedianStoppingRule
from .pbt import PopulationBasedTraining as PopulationBasedTraining
from .trial_scheduler import FIFOScheduler as FIFOScheduler
from .trial_scheduler import TrialScheduler as TrialScheduler

__all__ = ["TrialScheduler", "FIFOScheduler", "AsyncHyperBandScheduler", "ASHAScheduler",
           "HyperBandScheduler", "MedianStoppingRule", "PopulationBasedTraining"]
