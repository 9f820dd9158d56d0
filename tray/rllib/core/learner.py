"""The Learner: a torch copy of every module, its optimizer, and the loss.

``update(batch)`` is one training step of the algorithm on a train batch
(trajectory chunks per module, straight from the env runners):

1. ``build_columns`` turns chunks into training columns (the learner
   connector: advantages, value targets; algorithm-specific);
2. a seeded schedule of minibatches: ``num_epochs`` passes, each a fresh
   permutation cut into ``minibatch_size`` rows, per module;
3. for each minibatch: ``compute_loss_for_module`` (algorithm-specific),
   backward, global-norm clipping, Adam step;
4. ``after_update`` (PPO adapts its KL coefficient there).

Data parallelism (``num_learners >= 2``) splits every minibatch across the
learners (``rows[rank::num_learners]``); each computes the gradient of its
shard, the LearnerGroup averages them weighted by rows, and every learner
applies the same average, so all copies hold the same weights, as torch's
DistributedDataParallel keeps them (without a collective library: the
gradients travel through the object store). Every learner computes the same
schedule from the same seed, so only gradients need to travel.

Determinism: torch uses one thread per learner process by default
(``config.resources(torch_num_threads=...)``), deterministic algorithms,
and no global RNG: shuffles come from ``numpy.random.default_rng``."""

from __future__ import annotations

import numpy as np
import torch

from ..utils.packing import unpack
from ..utils.postprocessing import explained_variance
from .rl_module import RLModuleSpec
from .torch_rl_module import TorchRLModule

ALL_MODULES = "__all_modules__"


class Learner:
    """Trains one or more modules; subclasses define the loss."""

    def __init__(self, config, module_specs: dict, learner_index: int = 0,
                 num_learners: int = 1, weights: dict | None = None,
                 set_threads: bool = True) -> None:
        config, module_specs, weights = unpack(config), unpack(module_specs), unpack(weights)
        if set_threads:
            torch.set_num_threads(int(config.torch_num_threads))
        self.config = config
        self.learner_index = learner_index
        self.num_learners = max(1, num_learners)
        seed = config.seed if config.seed is not None else 0
        self.rng = np.random.default_rng([seed & 0xFFFFFFFF, 17])
        self.modules: dict[str, TorchRLModule] = {}
        self.optimizers: dict[str, torch.optim.Optimizer] = {}
        for module_id in sorted(module_specs):
            spec: RLModuleSpec = module_specs[module_id]
            initial = (weights or {}).get(module_id) or spec.initial_weights(seed, module_id)
            module = TorchRLModule(spec, initial)
            self.modules[module_id] = module
            self.optimizers[module_id] = torch.optim.Adam(module.parameters(), lr=config.lr)
        trainable = config.policies_to_train
        self.trainable = [m for m in self.modules if trainable is None or m in trainable]
        self.setup()
        self._columns: dict = {}
        self._schedule: list = []
        self._stats: dict = {}
        self.num_updates = 0

    def setup(self) -> None:
        """Algorithm-specific state (PPO's KL coefficients)."""

    # ------------------------------------------------- algorithm-specific

    def build_columns(self, module_id: str, chunks: list) -> dict:
        raise NotImplementedError

    def compute_loss_for_module(self, module_id: str, batch: dict) -> tuple:
        """(loss tensor, {stat name: float}) for one minibatch of one module."""
        raise NotImplementedError

    def after_update(self, module_id: str, stats: dict) -> dict:
        return {}

    # ------------------------------------------------------------ update

    def update(self, batch: dict) -> dict:
        """One training step on ``batch`` ({module_id: [chunks]}), in this process."""
        steps = self.prepare(batch)
        for step in range(steps):
            module_id, rows = self._schedule[step]
            loss, stats = self._loss(module_id, rows)
            optimizer = self.optimizers[module_id]
            optimizer.zero_grad()
            loss.backward()
            self._clip(module_id)
            optimizer.step()
            self._accumulate(module_id, stats, len(rows))
        return self.finish_update(None)

    def prepare(self, batch: dict) -> int:
        """Build the columns and the minibatch schedule; the number of steps."""
        if isinstance(batch, list) and len(batch) == 1:
            batch = batch[0]
        from tray import ObjectRef

        if isinstance(batch, ObjectRef):
            import tray

            batch = tray.get(batch)
        self._columns = {}
        for module_id in self.trainable:
            chunks = batch.get(module_id) or []
            columns = self.build_columns(module_id, chunks) if chunks else None
            if columns is not None and len(columns["obs"]):
                self._columns[module_id] = columns
        self._schedule = []
        for _epoch in range(self.num_epochs()):
            for module_id in sorted(self._columns):
                size = len(self._columns[module_id]["obs"])
                order = self.rng.permutation(size)
                minibatch = min(self.minibatch_size(), size)
                for start in range(0, size - minibatch + 1, minibatch):
                    self._schedule.append((module_id, order[start:start + minibatch]))
        self._stats = {}
        return len(self._schedule)

    def num_epochs(self) -> int:
        return int(self.config.num_epochs)

    def minibatch_size(self) -> int:
        return int(self.config.get_minibatch_size())

    def _shard(self, rows: np.ndarray) -> np.ndarray:
        return rows[self.learner_index::self.num_learners]

    def _loss(self, module_id: str, rows: np.ndarray):
        columns = self._columns[module_id]
        batch = {name: torch.as_tensor(values[rows]) for name, values in columns.items()
                 if isinstance(values, np.ndarray)}
        return self.compute_loss_for_module(module_id, batch)

    def _clip(self, module_id: str) -> None:
        if self.config.grad_clip:
            torch.nn.utils.clip_grad_norm_(self.modules[module_id].parameters(),
                                           self.config.grad_clip)

    def _accumulate(self, module_id: str, stats: dict, rows: int) -> None:
        record = self._stats.setdefault(module_id, {"rows": 0, "steps": 0, "sums": {}})
        record["rows"] += rows
        record["steps"] += 1
        for name, value in stats.items():
            record["sums"][name] = record["sums"].get(name, 0.0) + float(value)

    # ------------------------------------------------- data-parallel steps

    def compute_gradients(self, step: int, apply: dict | None = None) -> tuple:
        """Apply the previous step's averaged gradients (if any), then the
        gradients of this learner's shard of step ``step``:
        ({module_id: [arrays]}, rows, stats)."""
        if apply is not None:
            self.apply_gradients(apply)
        module_id, rows = self._schedule[step]
        shard = self._shard(rows)
        module = self.modules[module_id]
        module.zero_grad()
        if len(shard) == 0:
            return ({module_id: [np.zeros(tuple(p.shape), np.float32)
                                 for p in module.parameters()]}, 0, {})
        loss, stats = self._loss(module_id, shard)
        loss.backward()
        grads = [p.grad.detach().numpy().copy() if p.grad is not None else
                 np.zeros(tuple(p.shape), np.float32) for p in module.parameters()]
        self._accumulate(module_id, stats, len(shard))
        return {module_id: grads}, len(shard), stats

    def apply_gradients(self, gradients: dict) -> None:
        for module_id, grads in gradients.items():
            module = self.modules[module_id]
            for parameter, grad in zip(module.parameters(), grads, strict=True):
                parameter.grad = torch.as_tensor(np.asarray(grad))
            self._clip(module_id)
            self.optimizers[module_id].step()

    def local_stats(self) -> dict:
        return {m: {"rows": r["rows"], "steps": r["steps"], "sums": dict(r["sums"])}
                for m, r in self._stats.items()}

    def finish_update(self, merged_stats: dict | None) -> dict:
        """Mean stats per module (``merged_stats`` from all learners when
        data-parallel), then ``after_update``; returns RLlib's learner results."""
        stats = merged_stats if merged_stats is not None else self.local_stats()
        results: dict = {}
        trained = 0
        for module_id in sorted(self._columns):
            record = stats.get(module_id)
            rows = len(self._columns[module_id]["obs"])
            trained += rows
            means = {} if not record or not record["steps"] else \
                {k: v / record["steps"] for k, v in record["sums"].items()}
            means.update(self.after_update(module_id, means))
            means["num_module_steps_trained"] = rows
            means["num_trainable_parameters"] = sum(
                p.numel() for p in self.modules[module_id].parameters())
            means["default_optimizer_learning_rate"] = float(self.config.lr)
            results[module_id] = means
        self.num_updates += 1
        results[ALL_MODULES] = {"num_env_steps_trained": trained,
                                "num_module_steps_trained": trained,
                                "num_minibatch_updates": len(self._schedule),
                                "num_updates": self.num_updates}
        self._columns = {}
        self._schedule = []
        return results

    # ------------------------------------------------------------ weights

    def get_weights(self, module_ids=None) -> dict:
        return {m: module.get_weights() for m, module in self.modules.items()
                if module_ids is None or m in module_ids}

    def set_weights(self, weights: dict) -> None:
        for module_id, module_weights in weights.items():
            self.modules[module_id].set_weights(module_weights)

    def get_state(self) -> dict:
        return {"weights": self.get_weights(),
                "optimizers": {m: o.state_dict() for m, o in self.optimizers.items()},
                "rng": self.rng.bit_generator.state, "num_updates": self.num_updates,
                "extra": self.extra_state()}

    def set_state(self, state: dict) -> None:
        self.set_weights(state["weights"])
        for module_id, optimizer_state in state["optimizers"].items():
            self.optimizers[module_id].load_state_dict(optimizer_state)
        self.rng.bit_generator.state = state["rng"]
        self.num_updates = state["num_updates"]
        self.set_extra_state(state.get("extra") or {})

    def extra_state(self) -> dict:
        return {}

    def set_extra_state(self, state: dict) -> None:
        pass

    def ping(self) -> str:
        return "pong"

    # ----------------------------------------------------------- helpers

    def values_and_logp(self, module_id: str, chunks: list) -> tuple[list, list]:
        """Per chunk: the critic's values of every observation (T+1) and the
        current policy's log-probability of every action (T)."""
        module = self.modules[module_id]
        obs = np.concatenate([c["obs"] for c in chunks])
        with torch.no_grad():
            out = module.forward_train({"obs": torch.as_tensor(obs)})
        values = out["vf_preds"].numpy()
        inputs = out["action_dist_inputs"]
        per_values, per_logp = [], []
        offset = 0
        for chunk in chunks:
            length = len(chunk["obs"])
            per_values.append(values[offset:offset + length].astype(np.float64))
            actions = torch.as_tensor(np.asarray(chunk["actions"]))
            with torch.no_grad():
                logp = module.dist_logp(inputs[offset:offset + length - 1], actions)
            per_logp.append(logp.numpy().astype(np.float64))
            offset += length
        return per_values, per_logp


def standardize(values: np.ndarray) -> np.ndarray:
    return ((values - values.mean()) / max(float(values.std()), 1e-4)).astype(np.float32)


def vf_explained_var(targets: np.ndarray, predictions: torch.Tensor) -> float:
    return explained_variance(targets, predictions.detach().numpy())


def _scalar(value) -> float:
    """A loss statistic as a plain float (detached: stats carry no graph)."""
    if isinstance(value, torch.Tensor):
        return float(value.detach())
    return float(value)
