"""Counters shared by a simulated cluster's driver and workers (they run in
one process). Remote functions are pickled by value, so a test module's own
globals would be copied into each worker; this module is imported by
reference, so every simulated process sees the same counter."""

import collections

RUNS: collections.Counter = collections.Counter()
