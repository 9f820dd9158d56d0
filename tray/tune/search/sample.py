"""Search-space primitives: ``tune.uniform``, ``tune.choice``, ``grid_search``...

Each primitive is a ``Domain`` that samples one value from a ``random.Random``
handed to it, never from global randomness, so that a seeded search draws the
same configs in any process (and in the simulator, for the same seed). The
classes keep their bounds public so that search algorithms with their own
samplers (``OptunaSearch``) can translate them.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from typing import Any


class Domain:
    """A search space for one parameter; ``sample(rng, spec)`` draws a value."""

    def sample(self, rng: random.Random, spec: Any = None) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError(f"{type(self).__name__} does not implement sample()")

    def describe(self) -> str:
        return type(self).__name__


class Float(Domain):
    """A float in ``[lower, upper)``: uniform, log-uniform (``base``) or
    normal (``mean``, ``sd``), rounded to a multiple of ``q`` when given."""

    def __init__(self, lower: float | None, upper: float | None, *, kind: str = "uniform",
                 base: float = 10.0, mean: float = 0.0, sd: float = 1.0,
                 q: float | None = None) -> None:
        if kind in ("uniform", "loguniform"):
            if not isinstance(lower, (int, float)) or not isinstance(upper, (int, float)):
                raise ValueError(f"tune.{kind} needs numeric bounds, got {lower!r}, {upper!r}")
            if lower >= upper:
                raise ValueError(f"tune.{kind}: lower ({lower}) must be less than upper "
                                 f"({upper})")
            if kind == "loguniform" and lower <= 0:
                raise ValueError(f"tune.loguniform: bounds must be positive, got lower={lower}")
        if kind == "normal" and not sd > 0:
            raise ValueError(f"tune.randn: sd must be positive, got {sd!r}")
        if q is not None and not q > 0:
            raise ValueError(f"q must be positive, got {q!r}")
        self.lower, self.upper, self.kind = lower, upper, kind
        self.base, self.mean, self.sd, self.q = base, mean, sd, q

    def sample(self, rng: random.Random, spec: Any = None) -> float:
        if self.kind == "uniform":
            value = rng.uniform(self.lower, self.upper)
        elif self.kind == "loguniform":
            low, high = math.log(self.lower, self.base), math.log(self.upper, self.base)
            value = self.base ** rng.uniform(low, high)
        else:
            value = rng.gauss(self.mean, self.sd)
        if self.q is not None:
            value = round(value / self.q) * self.q
            if self.lower is not None:
                value = min(max(value, self.lower), self.upper)
        return float(value)

    def describe(self) -> str:
        if self.kind == "normal":
            return f"randn(mean={self.mean}, sd={self.sd})"
        return f"{self.kind}({self.lower}, {self.upper})"


class Integer(Domain):
    """An integer in ``[lower, upper)`` (uniform or log-uniform), a multiple
    of ``q`` when given (then ``upper`` is inclusive, as in Ray)."""

    def __init__(self, lower: int, upper: int, *, log: bool = False, base: float = 10.0,
                 q: int | None = None) -> None:
        for name, value in (("lower", lower), ("upper", upper)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"tune.randint: {name} must be an integer, got {value!r}")
        if q is None and lower >= upper:
            raise ValueError(f"tune.randint: lower ({lower}) must be less than upper ({upper})")
        if q is not None and (q < 1 or lower > upper):
            raise ValueError(f"tune.qrandint: need q >= 1 and lower <= upper, got q={q!r}, "
                             f"lower={lower}, upper={upper}")
        if log and lower <= 0:
            raise ValueError(f"tune.lograndint: bounds must be positive, got lower={lower}")
        self.lower, self.upper, self.log, self.base, self.q = lower, upper, log, base, q

    def sample(self, rng: random.Random, spec: Any = None) -> int:
        if self.q is not None:
            value = rng.randint(self.lower, self.upper)
            value = int(round(value / self.q) * self.q)
            return min(max(value, self.lower), self.upper)
        if self.log:
            low, high = math.log(self.lower, self.base), math.log(self.upper, self.base)
            return min(int(self.base ** rng.uniform(low, high)), self.upper - 1)
        return rng.randrange(self.lower, self.upper)

    def describe(self) -> str:
        return f"{'lograndint' if self.log else 'randint'}({self.lower}, {self.upper})"


class Categorical(Domain):
    """One of ``categories``, uniformly."""

    def __init__(self, categories: Sequence) -> None:
        if isinstance(categories, (str, bytes)) or not isinstance(categories, Sequence):
            raise ValueError(f"tune.choice needs a list of categories, got {categories!r}")
        if not categories:
            raise ValueError("tune.choice needs at least one category")
        self.categories = list(categories)

    def sample(self, rng: random.Random, spec: Any = None) -> Any:
        return self.categories[rng.randrange(len(self.categories))]

    def describe(self) -> str:
        return f"choice({self.categories!r})"


class Function(Domain):
    """``tune.sample_from(fn)``: ``fn(spec)`` computes the value; ``spec.config``
    holds the parameters resolved so far (attribute access works)."""

    def __init__(self, func: Callable) -> None:
        if not callable(func):
            raise ValueError(f"tune.sample_from needs a callable, got {func!r}")
        self.func = func

    def sample(self, rng: random.Random, spec: Any = None) -> Any:
        try:
            return self.func(spec)
        except TypeError:
            import inspect

            if len(inspect.signature(self.func).parameters) == 0:
                return self.func()
            raise

    def describe(self) -> str:
        return f"sample_from({getattr(self.func, '__name__', self.func)!r})"


# ------------------------------------------------------------ the public names

def uniform(lower: float, upper: float) -> Float:
    return Float(lower, upper)


def quniform(lower: float, upper: float, q: float) -> Float:
    return Float(lower, upper, q=q)


def loguniform(lower: float, upper: float, base: float = 10) -> Float:
    return Float(lower, upper, kind="loguniform", base=base)


def qloguniform(lower: float, upper: float, q: float, base: float = 10) -> Float:
    return Float(lower, upper, kind="loguniform", base=base, q=q)


def randn(mean: float = 0.0, sd: float = 1.0) -> Float:
    return Float(None, None, kind="normal", mean=mean, sd=sd)


def qrandn(mean: float, sd: float, q: float) -> Float:
    return Float(None, None, kind="normal", mean=mean, sd=sd, q=q)


def randint(lower: int, upper: int) -> Integer:
    """An integer in ``[lower, upper)`` (upper exclusive, as in Ray)."""
    return Integer(lower, upper)


def qrandint(lower: int, upper: int, q: int = 1) -> Integer:
    """A multiple of ``q`` in ``[lower, upper]`` (upper inclusive, as in Ray)."""
    return Integer(lower, upper, q=q)


def lograndint(lower: int, upper: int, base: float = 10) -> Integer:
    return Integer(lower, upper, log=True, base=base)


def choice(categories: Sequence) -> Categorical:
    return Categorical(categories)


def sample_from(func: Callable) -> Function:
    return Function(func)


def grid_search(values: Sequence) -> dict:
    """Every value in ``values``, each in its own trial (times ``num_samples``)."""
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
        raise ValueError(f"tune.grid_search needs a list of values, got {values!r}")
    return {"grid_search": list(values)}


def is_grid(value: Any) -> bool:
    return isinstance(value, dict) and len(value) == 1 and "grid_search" in value
