"""The tray.train workload: a DataParallelTrainer run under the seed's faults.

The training function keeps a running total, ``total += quality`` per step,
resumed from its checkpoint, and reports ``total`` (rank 0's) with every
step; every rank writes its own file into each checkpoint (a sharded
checkpoint). So a group restarted from the wrong checkpoint, a checkpoint
missing a rank's files, or a report lost or duplicated shows up as a wrong
number. Reference model, checked against the ``Result`` and the run
directory:

* the run finishes (the failure budget is far above what the faults can
  cause) with rank 0's last report at ``steps`` and ``total = quality * steps``;
* every reported row has ``total == quality * step``; within an attempt the
  steps are consecutive, and an attempt that reported starts right after
  the step of the latest checkpoint reported before it (nothing lost,
  nothing repeated beyond what the dead attempt did past its checkpoint);
* ``num_restarts`` is at least the last attempt that reported;
* on storage: only ``checkpoint_NNNNNN`` directories and ``result.json``
  (no staging directories left), at most ``num_to_keep`` + 1 (the latest)
  checkpoints, each holding the state of the row that named it and one file
  per rank with that step; the ``Result``'s checkpoint is the latest one;
* ``train-checkpoints-kept``: the run's ``CheckpointConfig`` (``num_to_keep``
  None, 1, 2 or 3; a ``score`` metric, max or min, or none) replayed over
  the reported checkpoints (each step reports a distinct score, in mixed
  order) gives exactly the checkpoints on storage: the ``num_to_keep`` best
  by score (the newest without a score attribute) plus the latest, which
  always stays (Ray's ``_CheckpointManager``: the bottom ones are deleted
  "except for the latest checkpoint"); ``Result.best_checkpoints`` lists
  exactly those, worst to best, with their reported metrics.

Some runs (those with a large failure budget) also fail on purpose once:
a rank raises at a drawn step of an attempt that started without a
checkpoint, so the group restarts from the latest checkpoint kept — which
must still be there, intact.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time

import tray
from tray import train


def train_counter(config: dict) -> None:
    context = train.get_context()
    rank = context.get_world_rank()
    step, total = 0, 0.0
    checkpoint = train.get_checkpoint()
    scores = config.get("scores")  # step -> a distinct score, in mixed order
    fail_at = config.get("fail_at")  # (rank, step): raise there once, before a restore
    if checkpoint is not None:
        with open(os.path.join(checkpoint.path, "state.json"), encoding="utf-8") as file:
            state = json.load(file)
        step, total = state["step"], state["total"]
    while step < config["steps"]:
        time.sleep(config["step_s"])
        step += 1
        total = round(total + config["quality"], 9)
        if fail_at is not None and checkpoint is None and [rank, step] == list(fail_at):
            raise RuntimeError(f"the training function fails on purpose at step {step}")
        with tempfile.TemporaryDirectory() as directory:
            save = step % config["checkpoint_every"] == 0
            if save:
                if rank == 0:
                    with open(os.path.join(directory, "state.json"), "w",
                              encoding="utf-8") as file:
                        json.dump({"step": step, "total": total}, file)
                with open(os.path.join(directory, f"rank-{rank}.json"), "w",
                          encoding="utf-8") as file:
                    json.dump({"step": step, "world_rank": rank,
                               "local_rank": context.get_local_rank(),
                               "local_world_size": context.get_local_world_size(),
                               "node_rank": context.get_node_rank(),
                               "node_id": tray.get_runtime_context().get_node_id()}, file)
            metrics = {"step": step, "total": total, "world_size": context.get_world_size()}
            if scores is not None:
                metrics["score"] = scores[step - 1]
            train.report(metrics,
                         checkpoint=train.Checkpoint.from_directory(directory) if save else None)


def _violation(invariant: str, message: str):
    from .invariants import InvariantViolation

    return InvariantViolation(invariant, message)


def train_data_parallel(program) -> None:
    import random

    import tray.simtest

    rng = program.rng
    cpus = int(tray.cluster_resources().get("CPU", 1))
    num_nodes = len(tray.nodes())
    num_workers = rng.randint(1, max(1, min(3, cpus)))
    strategies = ["PACK", "SPREAD"] + (["STRICT_SPREAD"] if num_workers <= num_nodes else [])
    config = {"steps": rng.randint(4, 8), "step_s": rng.choice([0.03, 0.05, 0.08]),
              "quality": round(rng.uniform(0.1, 1.0), 6),
              "checkpoint_every": rng.choice([1, 1, 2])}
    num_to_keep = rng.choice([None, 1, 2])
    strategy = rng.choice(strategies)
    # The draws added later come from an RNG of their own: the original
    # ones (and the seeds pinned by them) stay as they were.
    extra = random.Random(f"{tray.simtest.cluster().seed}:train-variations")
    max_failures = extra.choice([50, 50, 50, 0, 1])
    if extra.random() < 0.2 and _fits_on_one_node(num_workers):
        strategy = "STRICT_PACK"
    if extra.random() < 0.35:
        _check_never_placed(extra)
    keeping = _checkpoint_variations(config, num_to_keep, num_workers, max_failures)
    num_to_keep = keeping.num_to_keep
    storage = tempfile.mkdtemp(prefix="tray-simtest-train-")
    try:
        trainer = train.DataParallelTrainer(
            train_counter, train_loop_config=config,
            scaling_config=train.ScalingConfig(num_workers=num_workers,
                                               placement_strategy=strategy),
            run_config=train.RunConfig(
                name="run", storage_path=storage, verbose=0,
                failure_config=train.FailureConfig(max_failures=max_failures),
                checkpoint_config=keeping))
        try:
            result = trainer.fit()
        except train.TrainingFailedError as error:
            if max_failures >= 50:
                # A run that failed for good because its restore point
                # vanished is explained by the checkpoints it kept.
                _check_checkpoints_kept(error.result, _rows(error.result), keeping)
                raise _violation("train-finishes", f"the run failed after "
                                 f"{error.num_restarts} restarts:\n{error}") from None
            # A small budget may be spent by the faults: then the run
            # failed after exactly max_failures restarts, and what it did
            # report holds as a finished run's would.
            if error.num_restarts != max_failures or \
                    f"max_failures={max_failures}" not in str(error):
                raise _violation("train-failure-budget",
                                 f"TrainingFailedError after {error.num_restarts} restart(s) "
                                 f"with max_failures={max_failures}:\n{error}") from None
            _check(error.result, config, num_workers, keeping, strategy, finished=False)
            return
        if result.num_restarts > max_failures:
            raise _violation("train-failure-budget",
                             f"the run finished after {result.num_restarts} restarts; "
                             f"max_failures is {max_failures}")
        _check(result, config, num_workers, keeping, strategy)
    finally:
        shutil.rmtree(storage, ignore_errors=True)


def _checkpoint_variations(config: dict, num_to_keep, num_workers: int, max_failures: int):
    """The run's ``CheckpointConfig`` and scores (and, with a large failure
    budget, a failure on purpose), drawn from an RNG of their own."""
    import random

    import tray.simtest

    draw = random.Random(f"{tray.simtest.cluster().seed}:train-checkpoints")
    if draw.random() < 0.25:
        num_to_keep = 3  # the original draw gives None, 1 or 2
    attribute = draw.choice([None, "score", "score"])
    order = draw.choice(["max", "min"])
    scores = [value / 8 for value in draw.sample(range(-40, 40), config["steps"])]
    if attribute is not None or draw.random() < 0.5:
        config["scores"] = scores  # reported even when it ranks nothing
    if max_failures >= 50 and draw.random() < 0.5:
        # After a checkpoint (one is reported every 1 or 2 steps).
        config["fail_at"] = [draw.randrange(num_workers),
                             draw.randint(config["checkpoint_every"] + 1, config["steps"])]
    return train.CheckpointConfig(num_to_keep=num_to_keep, checkpoint_score_attribute=attribute,
                                  checkpoint_score_order=order)


def _rows(result) -> list:
    return result.metrics_dataframe.to_dict("records") \
        if result.metrics_dataframe is not None else []


def _fits_on_one_node(num_workers: int) -> bool:
    return any(node["Alive"] and node["Resources"].get("CPU", 0) >= num_workers
               for node in tray.nodes())


def _check_never_placed(extra) -> None:
    """A group no node can ever hold (a worker larger than every node; for
    STRICT_PACK, the group larger than every node) is refused before
    anything starts (``ValueError``); a group only larger than the cluster
    of the moment waits for nodes, within ``controller_failure_limit``
    (here 1: two tries, then ``TrainingFailedError`` saying so)."""
    nodes = [n for n in tray.nodes() if n["Alive"]]
    strategy = extra.choice(["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"])
    largest = int(max(n["Resources"].get("CPU", 0) for n in nodes))
    total = int(sum(n["Resources"].get("CPU", 0) for n in nodes))
    # (A STRICT_PACK group larger than the largest node never fits.)
    never = extra.random() < 0.5 or strategy == "STRICT_PACK"
    if never:
        workers, per_worker = ((largest + 1, 1) if strategy == "STRICT_PACK" else
                               (1, largest + 1))
    else:
        workers = len(nodes) + 1 if strategy == "STRICT_SPREAD" else total + 1
        per_worker = 1
    trainer = train.DataParallelTrainer(
        train_counter, train_loop_config={"steps": 1, "step_s": 0.0, "quality": 1.0,
                                          "checkpoint_every": 1},
        scaling_config=train.ScalingConfig(num_workers=workers, placement_strategy=strategy,
                                           resources_per_worker={"CPU": per_worker}),
        run_config=train.RunConfig(name="never", storage_path=tempfile.gettempdir(), verbose=0,
                                   failure_config=train.FailureConfig(
                                       controller_failure_limit=1)))
    what = (f"{workers} workers x {per_worker} CPU ({strategy}) on nodes with "
            f"{[n['Resources'].get('CPU', 0) for n in nodes]} CPUs")
    try:
        trainer.fit()
    except Exception as error:  # noqa: BLE001 - only the right error will do
        if never and isinstance(error, ValueError) and "can never be placed" in str(error):
            return
        if not never and isinstance(error, train.TrainingFailedError) and \
                "the worker group did not start" in str(error):
            return
        raise _violation("train-refuses-what-never-fits",
                         f"{what}: fit() raised {type(error).__name__}: {error}") from None
    raise _violation("train-refuses-what-never-fits", f"{what}: fit() ran")


def _check(result, config: dict, num_workers: int, keeping, strategy: str,
           finished: bool = True) -> None:
    steps, quality = config["steps"], config["quality"]
    expected_total = round(quality * steps, 6)
    rows = _rows(result)
    if not finished:
        if rows and result.metrics != {k: rows[-1][k] for k in result.metrics}:
            raise _violation("train-final-report", f"the failed run's result holds "
                             f"{result.metrics}, its last report {rows[-1]}")
        if not rows:
            _check_checkpoints_kept(result, rows, keeping)  # none reported, none kept
            return
    elif result.metrics is None or result.metrics["step"] != steps or \
            round(result.metrics["total"], 6) != expected_total:
        raise _violation("train-final-report", f"the run ended with {result.metrics}; the "
                         f"model says step {steps}, total {expected_total}")
    latest_step = 0  # the step of the latest checkpoint reported so far
    previous = None
    for row in rows:
        where = f"report {row['training_iteration']} (attempt {row['attempt']}, step {row['step']})"
        if round(row["total"], 6) != round(quality * row["step"], 6):
            raise _violation("train-reports-match-model",
                             f"{where} has total {row['total']}, the model says "
                             f"{quality * row['step']} (restored from the wrong checkpoint?)")
        if row["world_size"] != num_workers:
            raise _violation("train-reports-match-model",
                             f"{where}: world size {row['world_size']}, not {num_workers}")
        if previous is None or row["attempt"] != previous["attempt"]:
            if row["step"] != latest_step + 1:
                raise _violation("train-resumes-from-latest-checkpoint",
                                 f"{where} is the first of its attempt; the latest checkpoint "
                                 f"before it was at step {latest_step}")
            if previous is not None and row["attempt"] < previous["attempt"]:
                raise _violation("train-attempts-in-order", f"{where} after attempt "
                                 f"{previous['attempt']}")
        elif row["step"] != previous["step"] + 1:
            raise _violation("train-steps-consecutive",
                             f"{where} follows step {previous['step']} in the same attempt")
        if isinstance(row.get("checkpoint_dir_name"), str):
            latest_step = row["step"]
        previous = row
    if result.num_restarts < rows[-1]["attempt"]:
        raise _violation("train-restarts-counted", f"num_restarts={result.num_restarts} but "
                         f"attempt {rows[-1]['attempt']} reported")
    _check_storage(result, rows, num_workers, keeping, strategy)


def _check_placement(name: str, shards: list, strategy: str) -> None:
    """The ranks of one checkpoint (one attempt's group) follow the
    placement: nodes numbered in order, a node's workers consecutive
    world ranks with local ranks 0..k-1, the strategy respected."""
    shards = sorted(shards, key=lambda shard: shard["world_rank"])
    nodes: list = []
    for shard in shards:
        if shard["node_id"] not in nodes:
            nodes.append(shard["node_id"])
    for shard in shards:
        on_node = [s for s in shards if s["node_id"] == shard["node_id"]]
        expected = {"node_rank": nodes.index(shard["node_id"]),
                    "local_rank": on_node.index(shard),
                    "local_world_size": len(on_node)}
        got = {key: shard[key] for key in expected}
        if got != expected:
            raise _violation("train-ranks-follow-placement",
                             f"{name}: rank {shard['world_rank']} has {got}; its place says "
                             f"{expected}")
    ranks_by_node = [[s["world_rank"] for s in shards if s["node_id"] == node] for node in nodes]
    flat = [rank for ranks in ranks_by_node for rank in ranks]
    if flat != list(range(len(shards))):
        raise _violation("train-ranks-follow-placement",
                         f"{name}: world ranks by node {ranks_by_node}, not consecutive")
    if (strategy == "STRICT_SPREAD" and len(nodes) != len(shards)) or \
            (strategy == "STRICT_PACK" and len(nodes) != 1):
        raise _violation("train-ranks-follow-placement",
                         f"{name}: {len(shards)} workers on {len(nodes)} node(s) with "
                         f"{strategy}")


def _check_checkpoints_kept(result, rows: list, keeping) -> None:
    """``train-checkpoints-kept``: Ray's ``CheckpointConfig`` replayed over
    the reported checkpoints. With ``num_to_keep`` K, the K best by
    ``checkpoint_score_attribute`` (in ``checkpoint_score_order``; the K
    newest without one) stay on storage, and the latest too, even when it
    is not among them (a restart resumes from it): at most K + 1. Every
    other reported checkpoint is deleted. ``Result.checkpoint`` is the
    latest, on storage; ``Result.best_checkpoints`` is exactly the kept
    ones, worst to best, each with the metrics its report carried."""
    keep, attribute = keeping.num_to_keep, keeping.checkpoint_score_attribute
    where = (f"num_to_keep={keep}, score attribute {attribute}"
             f"{'' if attribute is None else ' (' + keeping.checkpoint_score_order + ')'}")
    reported = {}  # checkpoint dir -> the row that reported it, in report order
    for row in rows:
        name = row.get("checkpoint_dir_name")
        if isinstance(name, str):
            if name in reported:
                raise _violation("train-checkpoints-kept",
                                 f"{name} reported twice ({where})")
            reported[name] = row

    def rank(name: str) -> tuple:  # worst first; a later one wins a tie (as in Ray)
        index = int(name[len("checkpoint_"):])
        if attribute is None:
            return (index,)
        score = reported[name][attribute]
        return (score if keeping.checkpoint_score_order == "max" else -score, index)

    ranked = sorted(reported, key=rank)
    latest = max(reported, default=None)  # the names number the reports in order
    expected = set(ranked if keep is None else ranked[-keep:]) | ({latest} if latest else set())
    on_storage = {n for n in os.listdir(result.path) if n.startswith("checkpoint_")}
    scores = {n: reported[n].get("score") for n in ranked}
    if on_storage != expected:
        raise _violation("train-checkpoints-kept",
                         f"{where}: on storage {sorted(on_storage)}, expected "
                         f"{sorted(expected)} (latest {latest}; missing "
                         f"{sorted(expected - on_storage)}, not deleted "
                         f"{sorted(on_storage - expected)}; scores {scores})")
    actual = result.checkpoint.path if result.checkpoint is not None else None
    if (actual and os.path.basename(actual)) != latest or \
            (actual is not None and os.path.dirname(actual) != result.path):
        raise _violation("train-checkpoints-kept",
                         f"{where}: the result's checkpoint is {actual}; the latest reported "
                         f"is {latest}")
    best = [(os.path.basename(c.path), os.path.dirname(c.path), m)
            for c, m in result.best_checkpoints]
    listed = [name for name, _, _ in best]
    if listed != [n for n in ranked if n in expected] or \
            any(folder != result.path for _, folder, _ in best):
        raise _violation("train-checkpoints-kept",
                         f"{where}: best_checkpoints lists {listed} (in {set(f for _, f, _ in best)})"
                         f"; kept, worst to best: {[n for n in ranked if n in expected]} "
                         f"(scores {scores})")
    for name, _, metrics in best:
        row = reported[name]
        wrong = {key: metrics.get(key) for key in ("step", "total", "score", "world_size")
                 if key in row and metrics.get(key) != row[key]}
        if wrong:
            raise _violation("train-checkpoints-kept",
                             f"{where}: best_checkpoints gives {name} the metrics {wrong}; its "
                             f"report had {{{', '.join(f'{k!r}: {row[k]!r}' for k in wrong)}}}")


def _check_storage(result, rows: list, num_workers: int, keeping, strategy: str) -> None:
    num_to_keep = keeping.num_to_keep
    names = sorted(os.listdir(result.path))
    stray = [n for n in names if not n.startswith("checkpoint_") and
             n not in ("result.json", "error.txt" if result.error is not None else "")]
    if stray:
        raise _violation("train-storage-clean", f"the run directory holds {stray}")
    kept = [n for n in names if n.startswith("checkpoint_")]
    named = {row["checkpoint_dir_name"]: row for row in rows
             if isinstance(row.get("checkpoint_dir_name"), str)}
    latest = max(named) if named else None
    actual = os.path.basename(result.checkpoint.path) if result.checkpoint else None
    if actual != latest:
        raise _violation("train-latest-checkpoint", f"the result's checkpoint is {actual}; "
                         f"the latest reported is {latest} (on storage: {kept})")
    _check_checkpoints_kept(result, rows, keeping)
    if num_to_keep is not None and len(kept) > num_to_keep + 1:
        raise _violation("train-num-to-keep", f"{len(kept)} checkpoints on storage with "
                         f"num_to_keep={num_to_keep}: {kept}")
    for name in kept:
        row = named.get(name)
        if row is None:
            raise _violation("train-checkpoints-reported", f"{name} is on storage but no "
                             f"report names it")
        path = os.path.join(result.path, name)
        try:
            with open(os.path.join(path, "state.json"), encoding="utf-8") as file:
                state = json.load(file)
        except (OSError, ValueError) as error:
            raise _violation("train-checkpoints-match-reports",
                             f"{name}: rank 0's state.json unreadable: {error!r}") from None
        if state["step"] != row["step"]:
            raise _violation("train-checkpoints-match-reports",
                             f"{name} holds step {state['step']}, reported at step {row['step']}")
        shards = []
        for rank in range(num_workers):
            try:
                with open(os.path.join(path, f"rank-{rank}.json"), encoding="utf-8") as file:
                    shard = json.load(file)
            except FileNotFoundError:
                raise _violation("train-checkpoints-hold-every-rank",
                                 f"{name} has no file from rank {rank}") from None
            if shard["step"] != row["step"] or shard["world_rank"] != rank:
                raise _violation("train-checkpoints-hold-every-rank",
                                 f"{name}: rank {rank}'s file is from step {shard['step']} "
                                 f"(rank {shard['world_rank']})")
            shards.append(shard)
        _check_placement(name, shards, strategy)


WORKLOADS = {"train": train_data_parallel}
