"""Autoscaling of each deployment with an ``autoscaling_config`` (Ray Serve's
``autoscaling_state.py``): its load, and the target that follows it.

A deployment's load is the sum of its running replicas' ongoing requests —
sampled every ``metrics_interval_s`` (``get_metrics``) and averaged over
``look_back_period_s`` — plus the requests routers hold waiting for a
replica (the demand their long polls report: what scales a deployment up
from zero). Once per control-loop step the target follows
``_autoscaling.decide`` (Ray's default policy); the replicas follow the
target in ``_deployment_state``'s reconcile."""

from __future__ import annotations

import logging

from . import _autoscaling
from ._aio import await_ref, spawn
from ._autoscaling import LoadSamples
from ._deployment_state import DeploymentState
from ._status import DeploymentStatus

logger = logging.getLogger("tray.serve")


def record_demand(dep: DeploymentState, pending: int, now: float) -> None:
    """A router holds ``pending`` requests waiting for a replica of ``dep``:
    they count as load."""
    dep.demand_s, dep.demand = now, pending


def sample_load(dep: DeploymentState, now: float) -> None:
    """Collect the replicas' answers to the last ``get_metrics`` and ask the
    ones whose sample is due."""
    scaling = dep.spec.config.autoscaling_config
    if scaling is None:
        return
    for replica in dep.replicas:
        if not replica.serving():
            continue
        if replica.samples is None:
            replica.samples = LoadSamples(scaling)
        task = replica.metrics_task
        if task is not None:
            if not task.done():
                continue
            replica.metrics_task = None
            if task.exception() is None:
                replica.samples.add(now, task.result())
        if now >= replica.next_metrics_s:
            replica.next_metrics_s = now + scaling.metrics_interval_s
            replica.metrics_task = spawn(await_ref(replica.handle.get_metrics.remote()))


def _load(dep: DeploymentState, now: float) -> float:
    scaling = dep.spec.config.autoscaling_config
    total = 0.0
    for replica in dep.replicas:
        if replica.serving() and replica.samples is not None:
            mean = replica.samples.mean(now, scaling.look_back_period_s)
            if mean is not None:
                total += mean
    if now - dep.demand_s <= scaling.look_back_period_s:
        total += dep.demand
    return total


def autoscale(dep: DeploymentState, now: float) -> bool:
    """Move the deployment's target where the policy says; whether it moved
    (then the controller's state has changed)."""
    scaling = dep.spec.config.autoscaling_config
    if scaling is None or dep.deleting:
        return False
    current = sum(1 for r in dep.replicas if r.serving())
    target = _autoscaling.decide(scaling, dep.policy, dep.target_num, current,
                                 _load(dep, now))
    if target != dep.target_num:
        logger.info("serve controller: autoscaling %s/%s from %d to %d replicas",
                    dep.app_name, dep.name, dep.target_num, target)
        dep.status = DeploymentStatus.UPSCALING if target > dep.target_num else \
            DeploymentStatus.DOWNSCALING
        dep.target_num = target
        return True
    return False

