"""The LearnerGroup: where the Learner(s) run, and how an update reaches them.

* ``num_learners=0``: one Learner inside the driver's process (RLlib's
  "local learner"); no copying at all.
* ``num_learners=1``: one Learner actor (its own process and CPU,
  ``num_cpus_per_learner``); the train batch travels once through the
  object store and the whole update runs there.
* ``num_learners=N>=2``: N Learner actors, data-parallel. The batch is
  ``put`` once and every learner builds the same columns and minibatch
  schedule from it; then, per minibatch, each learner returns the gradient
  of its shard and the group hands back the rows-weighted average, which
  every learner applies (the next call carries it, so one round trip per
  minibatch). The learners' weights stay identical.

Learner actors are restarted by tray (``max_restarts``) but a restarted
learner starts from its initial weights, so the group re-sends the last
weights it fetched; a learner failure mid-update fails that ``train()``
call (RLlib, too, does not tolerate learner failures)."""

from __future__ import annotations

import numpy as np

LEARNER_RESTARTS_MAX = 3


class LearnerGroup:
    def __init__(self, config, learner_class, module_specs: dict,
                 weights: dict | None = None) -> None:
        self.config = config
        self.learner_class = learner_class
        self.module_specs = module_specs
        self.num_learners = int(config.num_learners)
        self.local = None
        self.actors: list = []
        if self.num_learners == 0:
            # The driver's own process: torch's thread count is the user's business.
            self.local = learner_class(config, module_specs, 0, 1, weights, set_threads=False)
            return
        import tray

        from ..utils.packing import Packed

        remote_class = tray.remote(learner_class)
        options = {"num_cpus": config.num_cpus_per_learner,
                   "max_restarts": LEARNER_RESTARTS_MAX}
        if config.num_gpus_per_learner:
            options["num_gpus"] = config.num_gpus_per_learner
        self.actors = [remote_class.options(**options).remote(
            Packed(config), Packed(module_specs), index, self.num_learners, Packed(weights))
            for index in range(self.num_learners)]

    @property
    def is_local(self) -> bool:
        return self.local is not None

    def update(self, batch: dict) -> dict:
        if self.local is not None:
            return self.local.update(batch)
        import tray

        if self.num_learners == 1:
            return tray.get(self.actors[0].update.remote([tray.put(batch)]))
        batch_ref = tray.put(batch)
        steps = tray.get([actor.prepare.remote([batch_ref]) for actor in self.actors])
        assert len(set(steps)) == 1, f"learners disagree on the schedule: {steps}"
        average = None
        for step in range(steps[0]):
            replies = tray.get([actor.compute_gradients.remote(step, average)
                                for actor in self.actors])
            average = _weighted_average(replies)
        if average is not None:
            tray.get([actor.apply_gradients.remote(average) for actor in self.actors])
        merged = _merge_stats(tray.get([actor.local_stats.remote() for actor in self.actors]))
        results = tray.get([actor.finish_update.remote(merged) for actor in self.actors])
        return results[0]

    def foreach_learner(self, method: str, *args) -> list:
        """``learner.<method>(*args)`` on every learner (local or actors)."""
        if self.local is not None:
            return [getattr(self.local, method)(*args)]
        import tray

        return tray.get([getattr(actor, method).remote(*args) for actor in self.actors])

    def get_weights(self, module_ids=None) -> dict:
        if self.local is not None:
            return self.local.get_weights(module_ids)
        import tray

        return tray.get(self.actors[0].get_weights.remote(module_ids))

    def set_weights(self, weights: dict) -> None:
        if self.local is not None:
            self.local.set_weights(weights)
            return
        import tray

        tray.get([actor.set_weights.remote(weights) for actor in self.actors])

    def get_state(self) -> dict:
        if self.local is not None:
            return self.local.get_state()
        import tray

        return tray.get(self.actors[0].get_state.remote())

    def set_state(self, state: dict) -> None:
        if self.local is not None:
            self.local.set_state(state)
            return
        import tray

        tray.get([actor.set_state.remote(state) for actor in self.actors])

    def stop(self) -> None:
        if not self.actors:
            return
        import tray

        for actor in self.actors:
            try:
                tray.kill(actor)
            except Exception:  # noqa: BLE001 - already gone
                pass
        self.actors = []


def _weighted_average(replies: list) -> dict:
    total_rows = sum(rows for _grads, rows, _stats in replies)
    average: dict = {}
    for grads, rows, _stats in replies:
        weight = rows / total_rows if total_rows else 1.0 / len(replies)
        for module_id, arrays in grads.items():
            if module_id not in average:
                average[module_id] = [np.zeros_like(a) for a in arrays]
            for target, array in zip(average[module_id], arrays, strict=True):
                target += weight * array
    return average


def _merge_stats(per_learner: list) -> dict:
    merged: dict = {}
    for stats in per_learner:
        for module_id, record in stats.items():
            into = merged.setdefault(module_id, {"rows": 0, "steps": 0, "sums": {}})
            into["rows"] += record["rows"]
            into["steps"] += record["steps"]
            for name, value in record["sums"].items():
                into["sums"][name] = into["sums"].get(name, 0.0) + value
    return merged
