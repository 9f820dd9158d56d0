"""The autoscaling policy: how many replicas a deployment should have.

Ray Serve's default policy, as plain functions of the state, so the
controller calls it once per control-loop period and tests drive it without
a cluster:

1. ongoing requests per replica are sampled every ``metrics_interval_s``;
   a replica's load is the mean of its samples in the last
   ``look_back_period_s``, the deployment's the sum over running replicas;
2. ``desired = running * (load / (target_ongoing_requests * running))``,
   moved from the current count by ``upscaling_factor`` /
   ``downscaling_factor`` (rounded up; at least one step when shrinking);
3. bounded by ``[min_replicas, max_replicas]``;
4. applied only once the same direction was decided in consecutive periods
   for ``upscale_delay_s`` (``downscale_delay_s``; to zero,
   ``downscale_to_zero_delay_s``): a burst shorter than the delay moves
   nothing. From zero replicas, any demand scales to one at once.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from .config import AutoscalingConfig

# The controller's loop period, which the delays count in (Ray's 0.1 s).
CONTROL_LOOP_PERIOD_S = 0.1


@dataclass
class PolicyState:
    decision_counter: int = 0


class LoadSamples:
    """A replica's ongoing-request samples over the look-back window;
    bounded: at most as many samples as fit in the window."""

    def __init__(self, config: AutoscalingConfig) -> None:
        self.maxlen = max(2, int(math.ceil(config.look_back_period_s /
                                           config.metrics_interval_s)) + 1)
        self.samples: deque = deque(maxlen=self.maxlen)

    def add(self, now_s: float, ongoing: float) -> None:
        self.samples.append((now_s, ongoing))

    def mean(self, now_s: float, look_back_period_s: float) -> float | None:
        recent = [v for t, v in self.samples if now_s - t <= look_back_period_s]
        if not recent:
            return None
        return sum(recent) / len(recent)


def desired_replicas(config: AutoscalingConfig, current: int, total_load: float) -> int:
    """Steps 2 and 3: the bounded replica count the load asks for."""
    if current == 0:
        return max(1, config.min_replicas) if total_load > 0 else config.min_replicas
    raw = current * (total_load / (config.target_ongoing_requests * current))
    delta = raw - current
    factor = (config.upscaling_factor if delta > 0 else config.downscaling_factor) or 1.0
    scaled = math.ceil(current + factor * delta)
    if math.ceil(raw) < current and scaled == current:
        scaled -= 1
    return max(config.min_replicas, min(config.max_replicas, scaled))


def decide(config: AutoscalingConfig, state: PolicyState, target: int, current: int,
           total_load: float) -> int:
    """Step 4: the new target replica count, given the current target, the
    running count and the deployment's load; updates ``state``."""
    if current == 0:
        state.decision_counter = 0
        return max(target, desired_replicas(config, 0, total_load))
    desired = desired_replicas(config, current, total_load)
    if desired > target:
        state.decision_counter = max(state.decision_counter, 0) + 1
        if state.decision_counter > int(config.upscale_delay_s / CONTROL_LOOP_PERIOD_S):
            state.decision_counter = 0
            return desired
    elif desired < target:
        state.decision_counter = min(state.decision_counter, 0) - 1
        delay_s = config.downscale_delay_s
        if target == 1 and config.downscale_to_zero_delay_s is not None:
            delay_s = config.downscale_to_zero_delay_s
        if target > 1:
            desired = max(1, desired)  # to zero only from one
        if state.decision_counter < -int(delay_s / CONTROL_LOOP_PERIOD_S):
            state.decision_counter = 0
            return desired
    else:
        state.decision_counter = 0
    return target
