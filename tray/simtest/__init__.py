"""tray.simtest: the public toolkit for simulated clusters.

``trace_digest()`` is the digest of the running (or last) simulated run's
event trace; the same program and seed give the same digest in any process.
``cluster()`` is the running simulated cluster. ``story(id)`` tells what
happened to one task or object in that run, from its trace.

Libraries (tray's and users') ask ``is_simulated()`` whether they run in a
simulated cluster, and draw randomness that a seed replays from ``rng(name)``."""

from __future__ import annotations

import os
import random


def _clusters() -> dict:
    from ..backends.sim.patches import _active

    return _active


def cluster():
    """The running simulated cluster; TrayError if none runs."""
    from ..exceptions import TrayError

    running = _clusters()["cluster"]
    if running is None:
        raise TrayError("no simulated cluster is running: call tray.init(backend='sim') first")
    return running


def is_simulated() -> bool:
    """Whether this process runs a simulated cluster
    (``tray.init(backend="sim")``): its driver, every worker and every task
    run here, on virtual time."""
    return _clusters()["cluster"] is not None


def rng(name: str) -> random.Random:
    """A random generator for ``name``: in a simulated cluster seeded from
    the cluster's seed and ``name`` (the same seed draws the same numbers, in
    any process), elsewhere from the operating system. Give each use a name
    of its own (``"mylib:shuffle:3"``): two uses of one name draw the same
    numbers."""
    running = _clusters()["cluster"]
    if running is None:
        return random.Random()
    return random.Random(f"{running.seed}:{name}")


def trace_digest() -> str:
    """Hex digest of the current, or most recently shut down, simulated run."""
    from ..exceptions import TrayError

    last = _clusters()["cluster"] or _clusters()["last"]
    if last is None:
        raise TrayError("no simulated run has happened in this process")
    return last.digest()


def story(what, events=None) -> list[dict]:
    """What happened to one task or object in a simulated run, as dask's
    ``story(key)`` tells it: the events of the run's trace that name it,
    oldest first, with what befell the workers that ran it (their kills and
    deaths, their nodes' crashes). ``what``: its hex id, a prefix of one, or
    an ``ObjectRef`` or id; an object's story holds the story of the task
    that made it. ``events``: a trace (event dicts, or the path of the JSON
    lines ``tray simtest replay --trace`` wrote); by default the current, or
    most recently shut down, simulated run's (its last events only, when
    the run recorded more than its trace keeps). Each event is a dict of
    ``t`` (virtual seconds), ``component``, ``event`` and its fields;
    ``tray.simtest.stories.format_story`` makes lines of them. Reading a
    story leaves the run's digest as it was."""
    from ..exceptions import TrayError
    from .stories import read_trace, story_of

    if events is None:
        last = _clusters()["cluster"] or _clusters()["last"]
        if last is None:
            raise TrayError("no simulated run has happened in this process: pass the "
                            "events of a trace")
        events = list(last.trace.events)
    elif isinstance(events, (str, os.PathLike)):
        events = read_trace(events)
    return story_of(what, events)


__all__ = ["cluster", "story", "trace_digest"]
