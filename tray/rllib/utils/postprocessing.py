"""Returns and advantages computed from trajectories (numpy only).

These run on the learner side, as RLlib's learner connectors do: the env
runners send raw trajectories, and the learner, which owns the value
function, turns them into training columns. That keeps the env runners
free of value networks and of torch."""

from __future__ import annotations

import numpy as np


def discounted_returns(rewards: np.ndarray, gamma: float, bootstrap: float = 0.0) -> np.ndarray:
    """``G_t = r_t + gamma * G_{t+1}``, with ``G_T = bootstrap``."""
    out = np.zeros(len(rewards), dtype=np.float32)
    running = float(bootstrap)
    for t in range(len(rewards) - 1, -1, -1):
        running = float(rewards[t]) + gamma * running
        out[t] = running
    return out


def gae(rewards: np.ndarray, values: np.ndarray, gamma: float, lambda_: float
        ) -> tuple[np.ndarray, np.ndarray]:
    """Generalized advantage estimation over one trajectory chunk.

    ``values`` has one more entry than ``rewards``: the value of the last
    observation, which is 0 for a terminated episode and the critic's
    estimate for a truncated one or a chunk cut by the fragment length.
    Returns (advantages, value targets)."""
    assert len(values) == len(rewards) + 1, (len(values), len(rewards))
    deltas = rewards + gamma * values[1:] - values[:-1]
    advantages = np.zeros(len(rewards), dtype=np.float32)
    running = 0.0
    for t in range(len(rewards) - 1, -1, -1):
        running = float(deltas[t]) + gamma * lambda_ * running
        advantages[t] = running
    return advantages, (advantages + values[:-1]).astype(np.float32)


def vtrace(behaviour_logp: np.ndarray, target_logp: np.ndarray, rewards: np.ndarray,
           values: np.ndarray, gamma: float, rho_bar: float = 1.0, c_bar: float = 1.0
           ) -> tuple[np.ndarray, np.ndarray]:
    """V-trace targets (Espeholt et al., 2018) for one trajectory chunk.

    ``values`` has one more entry than ``rewards`` (the bootstrap value).
    Returns (vs, policy-gradient advantages ``rho_t (r_t + gamma vs_{t+1} - V(x_t))``)."""
    assert len(values) == len(rewards) + 1
    ratios = np.exp(target_logp - behaviour_logp)
    rhos = np.minimum(rho_bar, ratios)
    cs = np.minimum(c_bar, ratios)
    deltas = rhos * (rewards + gamma * values[1:] - values[:-1])
    vs_minus_v = np.zeros(len(rewards) + 1, dtype=np.float64)
    for t in range(len(rewards) - 1, -1, -1):
        vs_minus_v[t] = deltas[t] + gamma * cs[t] * vs_minus_v[t + 1]
    vs = values + vs_minus_v
    advantages = rhos * (rewards + gamma * vs[1:] - values[:-1])
    return vs[:-1].astype(np.float32), advantages.astype(np.float32)


def explained_variance(targets: np.ndarray, predictions: np.ndarray) -> float:
    variance = float(np.var(targets))
    if variance == 0.0:
        return 0.0
    return max(-1.0, 1.0 - float(np.var(targets - predictions)) / variance)
