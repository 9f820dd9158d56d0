"""RLModules (the networks) and Learners (what trains them)."""

from .rl_module import (
    DEFAULT_MODULE_ID,
    MultiRLModuleSpec,
    NumpyPolicy,
    RLModuleSpec,
)

__all__ = ["DEFAULT_MODULE_ID", "MultiRLModuleSpec", "NumpyPolicy", "RLModuleSpec"]
