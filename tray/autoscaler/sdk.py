"""``tray.autoscaler.sdk``: what a program asks of the autoscaler directly.

``request_resources`` is Ray's: the cluster is scaled to hold the requested
bundles at once (a floor, packed against the nodes' total resources, not
their free ones), whatever runs; the next call replaces the request and an
empty call withdraws it."""

from __future__ import annotations

import math

REQUEST_BUNDLES_MAX = 10_000


def _check_bundle(index: int, bundle) -> dict:
    if not isinstance(bundle, dict) or not bundle:
        raise ValueError(f"bundles[{index}] must be a non-empty dict of resource amounts, "
                         f"got {bundle!r}")
    for name, amount in bundle.items():
        if not isinstance(name, str) or isinstance(amount, bool) or \
                not isinstance(amount, (int, float)) or not math.isfinite(amount) or \
                amount < 0:
            raise ValueError(f"bundles[{index}]: {name!r} must map to a non-negative "
                             f"number, got {amount!r}")
    return {name: float(amount) for name, amount in bundle.items()}


def request_resources(num_cpus: int | None = None, bundles: list | None = None) -> None:
    """Ask the autoscaler to scale the cluster to hold ``num_cpus`` CPUs (as
    that many 1-CPU bundles) and ``bundles`` at once, as in Ray."""
    if num_cpus is not None and (isinstance(num_cpus, bool) or not isinstance(num_cpus, int)
                                 or num_cpus < 0):
        raise ValueError(f"num_cpus must be a non-negative integer, got {num_cpus!r}")
    if bundles is not None and not isinstance(bundles, list):
        raise ValueError(f"bundles must be a list of dicts, got {type(bundles).__name__}")
    wanted = [{"CPU": 1.0}] * (num_cpus or 0)
    wanted += [_check_bundle(index, bundle) for index, bundle in enumerate(bundles or [])]
    if len(wanted) > REQUEST_BUNDLES_MAX:
        raise ValueError(f"request_resources takes at most {REQUEST_BUNDLES_MAX} bundles, "
                         f"got {len(wanted)}")
    from ..api.blocking import gcs_call

    gcs_call("request_resources", wanted)


__all__ = ["request_resources"]
