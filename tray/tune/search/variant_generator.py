"""Turning a ``param_space`` into configs: grid search times random sampling.

``BasicVariantGenerator`` is Tune's default search algorithm: each of the
``num_samples`` samples expands every ``grid_search`` into the cross product
of its values (the first grid parameter varies fastest, as in Ray) and draws
every other domain once per variant. ``sample_from`` functions run last, with
``spec.config`` holding what is resolved so far.

The generator keeps no list of future configs: it walks (sample, grid index)
lazily, so a million-trial space costs nothing up front, and its whole state
is two counters and an RNG (what an experiment snapshot stores to resume).
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator
from typing import Any

from .sample import Domain, Function, is_grid

# Modules whose search-space objects users sometimes pass by mistake.
_FOREIGN_SPACES = ("optuna.distributions", "ray.tune", "hyperopt", "skopt", "nevergrad")


class _AttrDict(dict):
    """The ``spec.config`` that ``sample_from`` functions read (``spec.config.lr``)."""

    def __getattr__(self, name: str) -> Any:
        try:
            value = self[name]
        except KeyError:
            raise AttributeError(name) from None
        return _AttrDict(value) if isinstance(value, dict) and not is_grid(value) else value


class _Spec:
    def __init__(self, config: dict) -> None:
        self.config = _AttrDict(config)


class _Unresolved(Exception):
    """A ``sample_from`` function read a value that is not resolved yet."""


def _path_str(path: tuple) -> str:
    return "/".join(str(part) for part in path)


def _check_leaf(path: tuple, value: Any) -> None:
    module = type(value).__module__ or ""
    if any(module == prefix or module.startswith(prefix + ".") for prefix in _FOREIGN_SPACES):
        raise TypeError(
            f"param_space[{_path_str(path)!r}] is a {module}.{type(value).__name__}, a search "
            f"space type tray.tune does not know; use tray.tune's own (tune.uniform, "
            f"tune.loguniform, tune.choice, tune.randint, tune.grid_search, ...)")
    if isinstance(value, dict) and "grid_search" in value:
        if len(value) != 1 or not isinstance(value["grid_search"], (list, tuple)) \
                or not value["grid_search"]:
            raise ValueError(f"param_space[{_path_str(path)!r}] = {value!r}: a grid search is "
                             f"{{'grid_search': [value, ...]}} with a non-empty list; use "
                             f"tune.grid_search([...])")
    if isinstance(value, Domain) and type(value).sample is Domain.sample:
        raise TypeError(f"param_space[{_path_str(path)!r}] is a {type(value).__name__}, a Domain "
                        f"without a sample() method: tray.tune cannot draw from it")


def leaves(space: Any, path: tuple = ()) -> list[tuple[tuple, Any]]:
    """Every grid or domain leaf of ``space`` with its path (dict keys, list
    indexes), in a fixed order; raises on search-space objects it cannot use."""
    found: list[tuple[tuple, Any]] = []
    _check_leaf(path, space)
    if is_grid(space) or isinstance(space, Domain):
        return [(path, space)]
    if isinstance(space, dict):
        for key, value in space.items():
            found += leaves(value, path + (key,))
    elif isinstance(space, list):
        for index, value in enumerate(space):
            found += leaves(value, path + (index,))
    return found


def copy_structure(space: Any) -> Any:
    """Copies dicts and lists (what resolution writes into), shares the rest."""
    if isinstance(space, dict):
        return {key: copy_structure(value) for key, value in space.items()}
    if isinstance(space, list):
        return [copy_structure(value) for value in space]
    return space


def get_path(config: Any, path: tuple) -> Any:
    for part in path:
        config = config[part]
    return config


def set_path(config: Any, path: tuple, value: Any) -> None:
    for part in path[:-1]:
        config = config[part]
    config[path[-1]] = value


def grid_size(space: Any) -> int:
    size = 1
    for _path, leaf in leaves(space):
        if is_grid(leaf):
            size *= len(leaf["grid_search"])
    return size


def _grid_assignments(space: Any) -> list[list[tuple[tuple, Any]]]:
    grids = [(path, leaf["grid_search"]) for path, leaf in leaves(space) if is_grid(leaf)]
    if not grids:
        return [[]]
    # itertools.product varies the last factor fastest; Ray varies the first.
    combos = itertools.product(*[values for _path, values in reversed(grids)])
    paths = [path for path, _values in reversed(grids)]
    return [list(zip(paths, combo, strict=True)) for combo in combos]


def resolve(space: Any, rng: random.Random, fixed: dict | None = None,
            grid: list[tuple[tuple, Any]] = ()) -> tuple[dict, dict]:
    """One config from ``space``: ``grid`` assignments and ``fixed`` values
    (flattened ``"a/b"`` keys, from points_to_evaluate) first, then every
    domain drawn from ``rng``. Returns (config, resolved values by path)."""
    config = copy_structure(space)
    resolved: dict[str, Any] = {}
    for path, value in grid:
        set_path(config, path, value)
        resolved[_path_str(path)] = value
    fixed = dict(fixed or {})
    functions = []
    for path, leaf in leaves(config):
        key = _path_str(path)
        if key in fixed:
            value = fixed.pop(key)
        elif isinstance(leaf, Function):
            functions.append((path, leaf))
            continue
        elif is_grid(leaf):  # a grid inside a fixed point's structure: first value
            value = leaf["grid_search"][0]
        else:
            value = leaf.sample(rng)
        set_path(config, path, value)
        resolved[key] = value
    for key, value in fixed.items():  # points may add keys the space lacks
        set_path_creating(config, tuple(key.split("/")), value)
    # sample_from functions may read each other: resolve in passes.
    for _ in range(len(functions) + 1):
        if not functions:
            break
        pending = []
        for path, leaf in functions:
            try:
                value = leaf.sample(rng, _Spec(config))
            except (AttributeError, KeyError, TypeError, _Unresolved):
                pending.append((path, leaf))
                continue
            if isinstance(value, Domain):
                value = value.sample(rng)
            set_path(config, path, value)
            resolved[_path_str(path)] = value
        if len(pending) == len(functions):
            path, leaf = pending[0]
            value = leaf.sample(rng, _Spec(config))  # raise the function's own error
        functions = pending
    return config, resolved


def set_path_creating(config: dict, path: tuple, value: Any) -> None:
    for part in path[:-1]:
        config = config.setdefault(part, {})
    config[path[-1]] = value


def flatten(config: dict, prefix: str = "") -> dict:
    """``{"a": {"b": 1}}`` -> ``{"a/b": 1}`` (the dataframe and tag format)."""
    flat: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            flat.update(flatten(value, name + "/"))
        else:
            flat[name] = value
    return flat


def format_tag(index: int, resolved: dict) -> str:
    parts = []
    for key, value in resolved.items():
        if isinstance(value, float):
            text = f"{value:.4g}"
        else:
            text = str(value)
        parts.append(f"{key.split('/')[-1]}={text[:20]}")
    return f"{index}_" + ",".join(parts) if parts else str(index)


class BasicVariantGenerator:
    """Tune's default search algorithm: grid search times random sampling.

    ``points_to_evaluate`` (partial configs, flattened or nested) are run
    first and count toward ``num_samples``; ``random_state`` seeds the
    draws (by default the experiment's seed, see ``Tuner``);
    ``constant_grid_search`` draws the random parameters once per sample and
    shares them across that sample's grid variants; ``max_concurrent`` caps
    running trials (0: no cap)."""

    def __init__(self, points_to_evaluate: list[dict] | None = None, max_concurrent: int = 0,
                 constant_grid_search: bool = False, random_state: int | None = None) -> None:
        if points_to_evaluate is not None and not isinstance(points_to_evaluate, list):
            raise ValueError("points_to_evaluate must be a list of dicts")
        if isinstance(max_concurrent, bool) or not isinstance(max_concurrent, int) \
                or max_concurrent < 0:
            raise ValueError(f"max_concurrent must be an integer >= 0, got {max_concurrent!r}")
        self.points_to_evaluate = [flatten(p) for p in (points_to_evaluate or [])]
        self.max_concurrent = max_concurrent
        self.constant_grid_search = constant_grid_search
        self.random_state = random_state
        self._space: Any = None
        self._num_samples = 0
        self._rng: random.Random | None = None
        self._sample = 0
        self._grid_index = 0
        self._grid: list = []
        self._constant_rng_state: Any = None

    def setup(self, space: Any, num_samples: int, seed: int) -> None:
        leaves(space)  # validate now: a bad space fails fit(), not a trial
        self._space = space
        self._num_samples = num_samples
        self._grid = _grid_assignments(space)
        self._rng = random.Random(self.random_state if self.random_state is not None else seed)

    @property
    def total(self) -> int:
        return self._num_samples * len(self._grid)

    def is_finished(self) -> bool:
        return self._sample >= self._num_samples

    def next_config(self) -> tuple[dict, dict] | None:
        """The next (config, resolved values), or None when every variant is out."""
        if self.is_finished():
            return None
        assert self._rng is not None
        fixed = self.points_to_evaluate[self._sample] \
            if self._sample < len(self.points_to_evaluate) else None
        if self.constant_grid_search:
            if self._grid_index == 0:
                self._constant_rng_state = self._rng.getstate()
            else:
                self._rng.setstate(self._constant_rng_state)
        config, resolved = resolve(self._space, self._rng, fixed, self._grid[self._grid_index])
        self._grid_index += 1
        if self._grid_index >= len(self._grid):
            self._grid_index = 0
            self._sample += 1
        return config, resolved

    def iter_configs(self) -> Iterator[tuple[dict, dict]]:
        while (item := self.next_config()) is not None:
            yield item
