"""Seeds for the operations a user did not seed (shuffles, block order,
local shuffle buffers, the file-name prefix of writes).

On a real cluster they are random, as in Ray; in the simulator they come
from the cluster's seed, so a simulated program replays exactly.
"""

from __future__ import annotations

import itertools
import random
import weakref

_counters: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def fresh_seed() -> int:
    """A seed for an operation the user did not seed.

    On a real cluster it is random, as in Ray. In the simulator it comes
    from the cluster's seed and a count of such draws in this run, so a
    simulated program replays exactly, unseeded shuffles included."""
    from tray import simtest

    if not simtest.is_simulated():
        return random.SystemRandom().getrandbits(62)
    counter = _counters.setdefault(simtest.cluster(), itertools.count())
    return simtest.rng(f"tray.data:{next(counter)}").getrandbits(62)
