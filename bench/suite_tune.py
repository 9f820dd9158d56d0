"""Tune's benchmarks, for tray.tune and Ray Tune with the same code.

* ``tune trials/s``: ``num_samples`` no-op function trials, each reporting
  10 times, on a local cluster of 2 CPUs (one trial per CPU, as Tune's
  default of 1 CPU per trial gives): trials finished per second of ``fit()``.
* ``tune time to fit()``: the same experiment, wall-clock seconds from
  ``Tuner(...).fit()`` to its return (cluster start not included).
* ``tune ASHA time per report``: the marginal cost of one report under
  ASHA: ``fit()`` of two no-op trials (one per CPU) reporting 10,000 times
  minus ``fit()`` of the same trials reporting once, over the extra reports
  (result handling, the scheduler and the trial's wait for its decision;
  start-up and per-trial costs cancel out, and with two trials they are
  small beside the reports: with many short trials Ray's per-trial noise
  of seconds swamps the difference). The reduction factor is so large that ASHA stops no
  trial: both runtimes then handle exactly the same reports (with a usual
  factor, which trials stop depends on the order results arrive in).

Scale: the issue asks for 1,000 trials. On this loaded 2-core machine Ray
Tune starts about one trial every two seconds (a new actor per trial), so
1,000 trials take over half an hour per round; the suite runs ``TRIALS``
(100) trials, one measured round
after a small warm-up, the same counts for both runtimes.
``TRAY_BENCH_TUNE_TRIALS=1000`` restores the issue's count; ``--quick``
divides the counts by 10. Every run sends traffic to 127.0.0.1 only.
"""

from __future__ import annotations

import os
import tempfile
import time

import harness

TRIALS = int(os.environ.get("TRAY_BENCH_TUNE_TRIALS", "100"))
REPORTS = 10
ASHA_TRIALS = 2  # one per CPU
ASHA_REPORTS = 10_000
CPUS = 2

# (name, unit, higher_is_better): the rows run.py shows.
DEFINITIONS = [
    (f"tune trials/s ({TRIALS:,} no-op trials x {REPORTS} reports)", "trials/s", True),
    (f"tune time to fit() ({TRIALS:,} no-op trials x {REPORTS} reports)", "s", False),
    (f"tune ASHA time per report (marginal, {ASHA_TRIALS:,} trials x {ASHA_REPORTS} reports)",
     "ms", False),
]
NAMES = [name for name, _unit, _better in DEFINITIONS]


def _noop(config):
    """The trainable: no work, ``reports`` reports (in a worker process)."""
    if config["runtime"] == "tray":
        from tray import tune
    else:
        from ray import tune
    for i in range(config["reports"]):
        tune.report({"score": config["x"] * (i + 1)})


def _runtime(name: str):
    if name == "tray":
        import tray
        from tray import tune

        tray.init(num_cpus=CPUS)
        return tray, tune
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    import ray
    from ray import tune

    ray.init(num_cpus=CPUS, include_dashboard=False, logging_level="ERROR",
             log_to_driver=False, _node_ip_address="127.0.0.1")
    return ray, tune


def _fit(runtime: str, tune, trials: int, reports: int, scheduler=None) -> float:
    """Seconds that ``fit()`` of the experiment takes."""
    storage = tempfile.mkdtemp(prefix="bench-tune-")
    config = tune.TuneConfig(num_samples=trials, metric="score", mode="max",
                             scheduler=scheduler)
    run_config = tune.RunConfig(name="bench", storage_path=storage, verbose=0)
    tuner = tune.Tuner(_noop, param_space={"x": tune.uniform(0, 1), "reports": reports,
                                           "runtime": runtime},
                       tune_config=config, run_config=run_config)
    start = time.perf_counter()
    grid = tuner.fit()
    elapsed = time.perf_counter() - start
    assert len(grid) == trials, (len(grid), trials)
    import shutil

    shutil.rmtree(storage, ignore_errors=True)
    return elapsed


def _experiment(runtime: str, trials: int, reports: int, asha: bool, rounds: int) -> list:
    module, tune = _runtime(runtime)
    try:
        def scheduler():
            if not asha:
                return None
            return tune.schedulers.ASHAScheduler(max_t=reports, grace_period=1,
                                                 reduction_factor=1000)

        _fit(runtime, tune, max(4, trials // 100), reports, scheduler())  # warm-up
        return [_fit(runtime, tune, trials, reports, scheduler()) for _ in range(rounds)]
    finally:
        module.shutdown()


def metric_for(runtime: str, name: str):
    """The function that measures ``name`` on ``runtime`` (tray or ray)."""
    rounds = 1
    trials = harness.n(TRIALS)

    def trials_per_s():
        return [trials / s for s in _experiment(runtime, trials, REPORTS, False, rounds)]

    def time_to_fit():
        return _experiment(runtime, trials, REPORTS, False, rounds)

    def asha_per_report():
        # The marginal cost of a report: fit() of n trials x R reports minus fit()
        # of n trials x 1 report, over the n x (R - 1) extra reports (cluster and
        # actor start-up, per-trial costs cancel out).
        asha_trials = ASHA_TRIALS
        module, tune = _runtime(runtime)
        try:
            reports = harness.n(ASHA_REPORTS)

            def scheduler():
                # One rung, at the end: ASHA judges every result and stops no trial
                # early, so both runtimes handle exactly the same reports.
                return tune.schedulers.ASHAScheduler(max_t=reports, grace_period=reports)

            _fit(runtime, tune, asha_trials, 10, scheduler())  # warm-up
            values = []
            for _ in range(rounds):
                many = _fit(runtime, tune, asha_trials, reports, scheduler())
                one = _fit(runtime, tune, asha_trials, 1, scheduler())
                values.append(max(many - one, 0.0) / (asha_trials * (reports - 1)) * 1000)
            return values
        finally:
            module.shutdown()

    return {NAMES[0]: trials_per_s, NAMES[1]: time_to_fit, NAMES[2]: asha_per_report}[name]
