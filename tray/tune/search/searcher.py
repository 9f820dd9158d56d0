"""The ``Searcher`` interface users implement, and ``ConcurrencyLimiter``.

A searcher is asked for one config at a time (``suggest(trial_id)``), told
every intermediate result and the end of every trial. It runs inside the
experiment's controller actor, one call at a time, so it needs no locking;
it must be picklable, because the controller ships it and snapshots it
(``Tuner.restore`` and a restarted controller resume from that snapshot).
"""

from __future__ import annotations

from typing import Any


class Searcher:
    """Base class of search algorithms (Ray's ``tune.search.Searcher``).

    Override ``suggest`` (return a config dict, ``None`` when nothing can be
    suggested right now, or ``Searcher.FINISHED`` when the search is over)
    and ``on_trial_complete``; ``on_trial_result`` and
    ``set_search_properties`` are optional."""

    FINISHED = "FINISHED"

    def __init__(self, metric: str | None = None, mode: str | None = None) -> None:
        if mode is not None and mode not in ("min", "max"):
            raise ValueError(f"mode must be 'min' or 'max', got {mode!r}")
        self._metric = metric
        self._mode = mode

    @property
    def metric(self) -> str | None:
        return self._metric

    @property
    def mode(self) -> str | None:
        return self._mode

    def set_search_properties(self, metric: str | None, mode: str | None, config: dict,
                              **spec: Any) -> bool:
        """Called once before the first ``suggest`` with the experiment's metric,
        mode and ``param_space``. Return False if the searcher cannot take them."""
        if metric and self._metric is None:
            self._metric = metric
        if mode and self._mode is None:
            self._mode = mode
        return True

    def suggest(self, trial_id: str) -> dict | str | None:
        raise NotImplementedError(f"{type(self).__name__} must implement suggest(trial_id)")

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        """An intermediate result of a live trial."""

    def on_trial_complete(self, trial_id: str, result: dict | None = None,
                          error: bool = False) -> None:
        """The trial ended: ``result`` is its last result; ``error`` says it failed."""

    def add_evaluated_point(self, parameters: dict, value: float, error: bool = False,
                            pruned: bool = False, intermediate_values: list | None = None
                            ) -> None:
        raise NotImplementedError(f"{type(self).__name__} takes no evaluated points")

    def get_state(self) -> dict:
        return dict(self.__dict__)

    def set_state(self, state: dict) -> None:
        self.__dict__.update(state)


class ConcurrencyLimiter(Searcher):
    """Wraps a searcher so that at most ``max_concurrent`` of its suggestions
    run at once; with ``batch=True`` it suggests in batches of
    ``max_concurrent`` and waits for the whole batch to end."""

    def __init__(self, searcher: Searcher, max_concurrent: int, batch: bool = False) -> None:
        if not isinstance(searcher, Searcher):
            raise ValueError(f"ConcurrencyLimiter wraps a Searcher, got {searcher!r}")
        if isinstance(max_concurrent, bool) or not isinstance(max_concurrent, int) \
                or max_concurrent < 1:
            raise ValueError(f"max_concurrent must be a positive integer, got "
                             f"{max_concurrent!r}")
        super().__init__(searcher.metric, searcher.mode)
        self.searcher = searcher
        self.max_concurrent = max_concurrent
        self.batch = batch
        self.live_trials: dict[str, None] = {}  # ordered, unlike a set
        self.num_unfinished_live_trials = 0

    def set_search_properties(self, metric, mode, config, **spec) -> bool:
        ok = self.searcher.set_search_properties(metric, mode, config, **spec)
        self._metric, self._mode = self.searcher.metric, self.searcher.mode
        return ok

    def suggest(self, trial_id: str):
        if self.num_unfinished_live_trials >= self.max_concurrent:
            return None
        if self.batch and len(self.live_trials) >= self.max_concurrent:
            return None
        suggestion = self.searcher.suggest(trial_id)
        if isinstance(suggestion, dict):
            self.live_trials[trial_id] = None
            self.num_unfinished_live_trials += 1
        return suggestion

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        if trial_id in self.live_trials:
            self.searcher.on_trial_result(trial_id, result)

    def on_trial_complete(self, trial_id: str, result=None, error: bool = False) -> None:
        if trial_id not in self.live_trials:
            return
        self.num_unfinished_live_trials -= 1
        if not self.batch:
            del self.live_trials[trial_id]
        self.searcher.on_trial_complete(trial_id, result=result, error=error)
        if self.batch and self.num_unfinished_live_trials == 0:
            self.live_trials.clear()
