"""tray.train: the worker group, reports and checkpoints, restarts, gang
scheduling, datasets, Tune, and every error a user can cause — on the
simulator (fast, virtual time, deterministic), with the basic run on real
processes too. DDP and a real SIGKILL are in test_train_local.py."""

from __future__ import annotations

import json
import os
import tempfile
import time

import pytest

import tray
import tray.simtest
from tray import train

# ================================================================ training functions


def counting_loop(config):
    """Counts steps; its state is the step, checkpointed by rank 0 (or by
    every rank into its own file, with ``shard``) at every report."""
    context = train.get_context()
    rank = context.get_world_rank()
    step = 0
    checkpoint = train.get_checkpoint()
    if checkpoint is not None:
        with open(os.path.join(checkpoint.path, "state.json"), encoding="utf-8") as file:
            step = json.load(file)["step"]
    while step < config["steps"]:
        time.sleep(config.get("step_s", 0.1))
        step += 1
        if config.get("kill_rank") == rank and step == config.get("kill_at") and \
                (checkpoint is None or config.get("kill_always")):
            # SIGKILL of this simulated worker process, mid-step.
            tray.simtest.cluster().kill_worker(tray.get_runtime_context().get_worker_id())
            time.sleep(10)
        if config.get("raise_rank") == rank and step == config.get("raise_at"):
            raise ValueError(f"bad batch at step {step}")
        with tempfile.TemporaryDirectory() as directory:
            wrote = False
            if rank == 0:
                with open(os.path.join(directory, "state.json"), "w", encoding="utf-8") as f:
                    json.dump({"step": step}, f)
                wrote = True
            if config.get("shard"):
                with open(os.path.join(directory, f"rank-{rank}.txt"), "w") as f:
                    f.write(str(step))
                wrote = True
            every = config.get("checkpoint_every", 1)
            train.report({"step": step, "loss": 10.0 / step, "rank": rank,
                          "score": config.get("score", {}).get(str(step), float(step))},
                         checkpoint=train.Checkpoint.from_directory(directory)
                         if wrote and step % every == 0 else None)


def context_loop():
    context = train.get_context()
    train.report({"world_rank": context.get_world_rank(),
                  "world_size": context.get_world_size(),
                  "local_rank": context.get_local_rank(),
                  "local_world_size": context.get_local_world_size(),
                  "node_rank": context.get_node_rank(),
                  "node_id": tray.get_runtime_context().get_node_id(),
                  "trial_name": context.get_trial_name(),
                  "experiment": context.get_experiment_name(),
                  "start_s": time.time()})


def trainer(loop, tmp_path, *, num_workers=2, config=None, name="run", max_failures=0,
            num_to_keep=None, score=None, order="max", verbose=0, strategy="PACK",
            **kwargs):
    return train.DataParallelTrainer(
        loop, train_loop_config=config,
        scaling_config=train.ScalingConfig(num_workers=num_workers, placement_strategy=strategy),
        run_config=train.RunConfig(
            name=name, storage_path=str(tmp_path), verbose=verbose,
            failure_config=train.FailureConfig(max_failures=max_failures),
            checkpoint_config=train.CheckpointConfig(num_to_keep=num_to_keep,
                                                     checkpoint_score_attribute=score,
                                                     checkpoint_score_order=order)),
        **kwargs)


def read_state(checkpoint) -> int:
    with open(os.path.join(checkpoint.path, "state.json"), encoding="utf-8") as file:
        return json.load(file)["step"]


@pytest.fixture
def sim():
    tray.init(backend="sim", num_nodes=2, num_cpus=2, seed=11)
    yield tray.simtest.cluster()
    tray.shutdown()


# ================================================================ both backends


@pytest.mark.cluster(num_cpus=2)
def test_reports_checkpoints_and_the_result(one_node, tmp_path, capsys):
    result = trainer(counting_loop, tmp_path, config={"steps": 4, "step_s": 0.01,
                                                      "shard": True},
                     num_to_keep=2, verbose=1).fit()
    assert result.error is None
    assert result.num_restarts == 0
    assert result.metrics == {"step": 4, "loss": 2.5, "rank": 0, "score": 4.0}  # rank 0's
    assert result.path == str(tmp_path / "run")
    assert result.checkpoint.path == str(tmp_path / "run" / "checkpoint_000003")
    # Every rank's files went into the one checkpoint directory.
    assert sorted(os.listdir(result.checkpoint.path)) == ["rank-0.txt", "rank-1.txt",
                                                          "state.json"]
    assert read_state(result.checkpoint) == 4
    # num_to_keep=2: the two newest stay on storage.
    assert sorted(n for n in os.listdir(result.path) if n.startswith("checkpoint")) == \
        ["checkpoint_000002", "checkpoint_000003"]
    assert [read_state(c) for c, _ in result.best_checkpoints] == [3, 4]
    frame = result.metrics_dataframe
    assert list(frame["step"]) == [1, 2, 3, 4]
    assert list(frame["training_iteration"]) == [1, 2, 3, 4]
    assert list(frame["checkpoint_dir_name"]) == [f"checkpoint_00000{i}" for i in range(4)]
    with open(os.path.join(result.path, "result.json"), encoding="utf-8") as file:
        assert [json.loads(line)["step"] for line in file] == [1, 2, 3, 4]
    out = capsys.readouterr().out
    assert "DataParallelTrainer 'run': 2 worker(s)" in out
    assert "| iter   | step" in out  # the table's header, then a row per report
    assert out.count("checkpoint_00000") >= 4
    assert "training finished: 4 report(s), 0 restart(s)" in out


# ================================================================ the simulator


RANKS: list = []


def ranks_loop():
    """Each rank records where it is and when it started (module-level, so the
    simulated workers append to this module's RANKS)."""
    context = train.get_context()
    RANKS.append({"w": context.get_world_rank(), "l": context.get_local_rank(),
                  "lw": context.get_local_world_size(), "n": context.get_node_rank(),
                  "size": context.get_world_size(),
                  "node": tray.get_runtime_context().get_node_id(), "start_s": time.time()})
    train.report({})


def test_ranks_follow_the_placement(tmp_path):
    tray.init(backend="sim", num_nodes=3, num_cpus=2, seed=4)
    RANKS.clear()
    result = trainer(context_loop, tmp_path, num_workers=5, strategy="SPREAD").fit()
    assert result.metrics["world_size"] == 5
    assert result.metrics["trial_name"] == "run"
    assert result.metrics["experiment"] == "run"
    trainer(ranks_loop, tmp_path, num_workers=5, strategy="SPREAD", name="ranks").fit()
    rows = sorted(RANKS, key=lambda r: r["w"])
    assert [r["w"] for r in rows] == [0, 1, 2, 3, 4]
    assert {r["size"] for r in rows} == {5}
    # Workers of a node hold consecutive world ranks; local ranks count within it.
    nodes = [r["node"] for r in rows]
    assert len(set(nodes)) == 3  # SPREAD over the three nodes
    for node_rank, node in enumerate(dict.fromkeys(nodes)):
        mine = [r for r in rows if r["node"] == node]
        assert [r["w"] for r in mine] == list(range(mine[0]["w"], mine[0]["w"] + len(mine)))
        assert [r["l"] for r in mine] == list(range(len(mine)))
        assert {r["lw"] for r in mine} == {len(mine)}
        assert {r["n"] for r in mine} == {node_rank}


def test_a_killed_worker_restarts_the_group_from_the_latest_checkpoint(sim, tmp_path):
    result = trainer(counting_loop, tmp_path, max_failures=2,
                     config={"steps": 6, "kill_rank": 1, "kill_at": 4}).fit()
    assert result.num_restarts == 1
    assert result.metrics["step"] == 6
    assert read_state(result.checkpoint) == 6
    frame = result.metrics_dataframe
    # Attempt 0 reported steps 1-3 and died in step 4; attempt 1 resumed from
    # step 3's checkpoint: the steps continue, none is lost or repeated.
    assert list(frame["step"]) == [1, 2, 3, 4, 5, 6]
    assert list(frame["attempt"]) == [0, 0, 0, 1, 1, 1]
    assert list(frame["training_iteration"]) == [1, 2, 3, 4, 5, 6]
    assert list(frame["checkpoint_dir_name"]) == [f"checkpoint_00000{i}" for i in range(6)]
    assert not [n for n in os.listdir(result.path) if n.startswith(".staging")]


def test_failures_past_max_failures_fail_the_run(sim, tmp_path):
    with pytest.raises(train.TrainingFailedError) as caught:
        trainer(counting_loop, tmp_path, max_failures=1,
                config={"steps": 6, "kill_rank": 0, "kill_at": 3, "kill_always": True}).fit()
    error = caught.value
    assert "max_failures=1" in str(error)
    assert "worker rank 0 (of 2) died: ActorDiedError" in str(error)
    assert error.num_restarts == 1
    result = error.result
    assert result.error is error
    assert result.num_restarts == 1
    # Attempt 0 reported steps 1-2 and died in step 3; so did attempt 1, resumed
    # from step 2's checkpoint.
    assert result.metrics["step"] == 2
    assert list(result.metrics_dataframe["attempt"]) == [0, 0]
    assert read_state(result.checkpoint) == 2
    with open(os.path.join(result.path, "error.txt"), encoding="utf-8") as file:
        assert "died" in file.read()


def test_a_raising_loop_fails_with_the_workers_traceback(sim, tmp_path):
    with pytest.raises(train.TrainingFailedError) as caught:
        trainer(counting_loop, tmp_path, config={"steps": 5, "raise_rank": 1,
                                                 "raise_at": 3}).fit()
    error = caught.value
    message = str(error)
    assert "worker rank 1 (of 2) raised ValueError in the training function" in message
    assert "bad batch at step 3" in message
    assert "in counting_loop" in message  # the worker's traceback, down to the user's line
    assert isinstance(error.__cause__, ValueError)  # the user's exception class too
    assert set(error.worker_failures) == {1}
    assert error.result.error is error
    assert error.result.num_restarts == 0
    assert error.result.metrics["step"] == 2


def test_retried_application_errors_count_as_failures(sim, tmp_path):
    # An error in the loop is a failure like a crash: retried from the latest
    # checkpoint (raise_at is step 3; the retry starts at step 2's checkpoint
    # and raises again at step 3, every time).
    with pytest.raises(train.TrainingFailedError) as caught:
        trainer(counting_loop, tmp_path, max_failures=2,
                config={"steps": 5, "raise_rank": 0, "raise_at": 3}).fit()
    assert caught.value.num_restarts == 2
    assert list(caught.value.result.metrics_dataframe["step"]) == [1, 2]


def mismatched_loop():
    rank = train.get_context().get_world_rank()
    for step in range(3 if rank == 0 else 1):
        train.report({"step": step})


def test_workers_that_disagree_on_the_number_of_reports_fail_clearly(sim, tmp_path):
    with pytest.raises(train.TrainingFailedError) as caught:
        trainer(mismatched_loop, tmp_path).fit()
    message = str(caught.value)
    assert "every worker must call tray.train.report() the same number of times" in message
    assert "rank 1 returned from its training function after 1 report(s)" in message
    assert "in mismatched_loop" in message  # raised at the user's report() call


def test_num_to_keep_keeps_the_best_by_score_and_the_latest(sim, tmp_path):
    scores = {"1": 5.0, "2": 9.0, "3": 1.0, "4": 7.0, "5": 2.0}
    result = trainer(counting_loop, tmp_path, num_to_keep=2, score="score",
                     config={"steps": 5, "score": scores}).fit()
    kept = sorted(n for n in os.listdir(result.path) if n.startswith("checkpoint"))
    # The best two by score (steps 2 and 4) and the latest (step 5).
    assert kept == ["checkpoint_000001", "checkpoint_000003", "checkpoint_000004"]
    assert [m["score"] for _, m in result.best_checkpoints] == [2.0, 7.0, 9.0]  # worst first
    assert read_state(result.get_best_checkpoint("score", "max")) == 2
    assert read_state(result.get_best_checkpoint("score", "min")) == 5
    assert read_state(result.checkpoint) == 5


def test_resume_from_checkpoint_and_reruns_in_the_same_directory(sim, tmp_path):
    first = trainer(counting_loop, tmp_path, config={"steps": 3}).fit()
    second = trainer(counting_loop, tmp_path, config={"steps": 5},
                     resume_from_checkpoint=first.checkpoint).fit()
    assert list(second.metrics_dataframe["step"]) == [4, 5]
    # The same run name: the new checkpoints are numbered after the old ones,
    # which stay (the one we resumed from included).
    assert second.checkpoint.path.endswith("checkpoint_000004")
    assert read_state(first.checkpoint) == 3
    assert read_state(second.checkpoint) == 5


def test_the_group_is_placed_all_at_once(sim, tmp_path):
    @tray.remote(num_cpus=1)
    def hold(seconds):
        time.sleep(seconds)
        return time.time()

    # 4 CPUs in the cluster; a task holds 1 of them for 5 s. Four workers
    # cannot all start before it ends: none may start early (3 CPUs were free).
    RANKS.clear()
    holder = hold.remote(5.0)
    assert tray.wait([holder], timeout=0.5)[0] == []  # it runs, holding its CPU
    trainer(ranks_loop, tmp_path, num_workers=4, strategy="SPREAD").fit()
    released_s = tray.get(holder)
    assert len(RANKS) == 4
    assert min(r["start_s"] for r in RANKS) >= released_s


def trainer_waiting(tmp_path, *, num_workers, limit=-1, strategy="PACK", verbose=1, **scaling):
    return train.DataParallelTrainer(
        context_loop, scaling_config=train.ScalingConfig(
            num_workers=num_workers, placement_strategy=strategy, **scaling),
        run_config=train.RunConfig(
            name="waits", storage_path=str(tmp_path), verbose=verbose,
            failure_config=train.FailureConfig(controller_failure_limit=limit)))


def test_a_run_waits_while_other_work_holds_the_resources(sim, tmp_path, monkeypatch, capsys):
    # As Ray Train's controller: a group that does not start in time is
    # scheduled again, without spending max_failures, saying what it lacks.
    from tray.train import trainer as trainer_module

    monkeypatch.setattr(trainer_module, "WORKER_GROUP_START_TIMEOUT_S", 3.0)

    @tray.remote(num_cpus=2)
    def hold(seconds):
        time.sleep(seconds)
        return time.time()

    holder = hold.remote(8.0)  # half of the cluster's 4 CPUs, for 8 s
    assert tray.wait([holder], timeout=0.5)[0] == []
    result = trainer_waiting(tmp_path, num_workers=3).fit()
    released_s = tray.get(holder)
    assert result.error is None and result.num_restarts == 0
    assert result.metrics["start_s"] >= released_s
    out = capsys.readouterr().out
    waits = [line for line in out.splitlines() if "waiting for resources" in line]
    assert len(waits) >= 2, out  # (3 s each, while the 8 s hold lasts)
    assert "other work holds the resources" in waits[0]
    assert "controller_failure_limit" in waits[0] and "(1 unlimited" in waits[0]


def test_a_group_larger_than_the_cluster_waits_for_nodes_within_the_limit(
        sim, tmp_path, monkeypatch, capsys):
    from tray.train import trainer as trainer_module

    monkeypatch.setattr(trainer_module, "WORKER_GROUP_START_TIMEOUT_S", 2.0)
    with pytest.raises(train.TrainingFailedError) as caught:
        trainer_waiting(tmp_path, num_workers=6, limit=2).fit()
    assert "scheduled again FailureConfig(controller_failure_limit=2) times" in \
        str(caught.value)
    assert "was not placed within 2 s" in str(caught.value)
    assert caught.value.num_restarts == 0
    waits = [line for line in capsys.readouterr().out.splitlines()
             if "waiting for resources" in line]
    assert len(waits) == 2
    assert "at most 4 fit in the whole cluster of 2 alive node(s): it waits for nodes to " \
        "join" in waits[0]
    assert tray.util.placement_group_table() == {} or all(
        group["state"] == "REMOVED" for group in tray.util.placement_group_table().values())


def test_a_group_waits_for_the_node_the_autoscaler_launches(sim, tmp_path, monkeypatch):
    # One worker needs 4 CPUs: no node has them, but a node type does.
    from tray import autoscaler
    from tray.train import trainer as trainer_module

    monkeypatch.setattr(trainer_module, "WORKER_GROUP_START_TIMEOUT_S", 5.0)
    monitor = autoscaler.start({
        "max_workers": 2, "idle_timeout_minutes": 5, "autoscaler_period_s": 1.0,
        "head_node_type": "head",
        "available_node_types": {"head": {"resources": {}, "max_workers": 0},
                                 "big": {"resources": {"CPU": 4}, "max_workers": 2}},
        "provider": {"type": "sim", "boot_delay_s": [1.0, 2.0]}})
    try:
        time.sleep(2.0)  # (its first status: the node types)
        result = trainer_waiting(tmp_path, num_workers=1, verbose=0,
                                 resources_per_worker={"CPU": 4}).fit()
    finally:
        monitor.stop()
    assert result.error is None
    launched = [d for d in monitor.decisions if d.action == "launch"]
    assert launched and launched[0].node_type == "big"


@pytest.mark.parametrize("scaling, expected", [
    (dict(num_workers=3, placement_strategy="STRICT_PACK"),
     "no node can hold 3 workers on one node (STRICT_PACK), and the largest node has "
     "{'CPU': 2.0}"),
    (dict(num_workers=1, use_gpu=True), "no node has 'GPU'"),
    (dict(num_workers=1, resources_per_worker={"CPU": 3}), "no node can hold one worker"),
])
def test_a_group_the_cluster_can_never_hold_fails_at_once(sim, tmp_path, scaling, expected):
    started = time.perf_counter()
    run = train.DataParallelTrainer(context_loop, scaling_config=train.ScalingConfig(**scaling),
                                    run_config=train.RunConfig(storage_path=str(tmp_path)))
    with pytest.raises(ValueError, match="can never be placed") as caught:
        run.fit()
    assert expected in str(caught.value)
    assert time.perf_counter() - started < 30  # an error, not a wait
    assert tray.util.placement_group_table() == {}  # nothing was reserved


def dataset_loop(config):
    rows = []
    for epoch in range(2):
        seen = []
        for batch in train.get_dataset_shard("train").iter_batches(batch_size=7):
            seen += [int(x) for x in batch["id"]]
        rows.append(seen)
        train.report({"epoch": epoch, "rows": seen,
                      "rank": train.get_context().get_world_rank()})
    SHARDS.append(rows)


SHARDS: list = []


def test_datasets_are_split_among_the_workers(tmp_path):
    import tray.data

    # Spare CPUs beside the workers' bundles for the data tasks (a lease request
    # queued on a node whose CPUs a placement group holds never moves on: a core
    # bug, see the report of issue 20).
    tray.init(backend="sim", num_nodes=1, num_cpus=4, seed=11)
    SHARDS.clear()
    dataset = tray.data.range(100, override_num_blocks=5)
    trainer(dataset_loop, tmp_path, num_workers=2, datasets={"train": dataset}).fit()
    assert len(SHARDS) == 2
    for epoch in range(2):
        shares = [sorted(worker[epoch]) for worker in SHARDS]
        assert len(shares[0]) == len(shares[1]) == 50  # equal=True
        assert sorted(shares[0] + shares[1]) == list(range(100))  # disjoint, complete


def shard_name_loop():
    train.get_dataset_shard("validation")


def test_errors_users_can_cause(sim, tmp_path):
    # Bad configurations fail where they are written, naming the field.
    for build, message in [
        (lambda: train.ScalingConfig(num_workers=0), "num_workers must be an integer >= 1"),
        (lambda: train.ScalingConfig(placement_strategy="CLOSE"), "placement_strategy"),
        (lambda: train.ScalingConfig(resources_per_worker={"cpu": 1}), "write 'CPU'"),
        (lambda: train.ScalingConfig(resources_per_worker={"CPU": -1}), "number >= 0"),
        (lambda: train.ScalingConfig(resources_per_worker={"CPU": 0}), "reserves nothing"),
        (lambda: train.ScalingConfig(use_gpu=True, resources_per_worker={"GPU": 0}),
         "use_gpu=True"),
        (lambda: train.RunConfig(name="a/b"), "plain directory name"),
        (lambda: train.FailureConfig(max_failures=-2), "max_failures"),
        (lambda: train.CheckpointConfig(num_to_keep=0), "num_to_keep"),
        (lambda: train.CheckpointConfig(checkpoint_score_order="up"), "'min' or 'max'"),
    ]:
        with pytest.raises(ValueError, match=message):
            build()
    from tray import tune

    for kwargs, message in [
        (dict(run_config=tune.RunConfig()), "tray.train.RunConfig"),
        (dict(scaling_config={"num_workers": 2}), "tray.train.ScalingConfig"),
        (dict(train_loop_config=[1]), "train_loop_config must be a dict"),
        (dict(datasets={"train": [1, 2]}), "tray.data datasets"),
        (dict(resume_from_checkpoint="/tmp"), "tray.train.Checkpoint"),
    ]:
        with pytest.raises(TypeError, match=message):
            train.DataParallelTrainer(context_loop, **kwargs)
    with pytest.raises(ValueError, match="takes no argument or one"):
        train.DataParallelTrainer(lambda a, b: None)
    # The worker-side API outside a worker.
    for call in (lambda: train.report({}), train.get_context, train.get_checkpoint,
                 lambda: train.get_dataset_shard("train")):
        with pytest.raises(RuntimeError, match="only be called inside a training function"):
            call()
    # Inside a worker: an unknown dataset, a bad report.
    with pytest.raises(train.TrainingFailedError, match="no dataset of that name"):
        trainer(shard_name_loop, tmp_path, num_workers=1, name="shard").fit()
    with pytest.raises(train.TrainingFailedError, match="takes a dict of metrics"):
        trainer(lambda: train.report(3), tmp_path, num_workers=1, name="bad").fit()


def test_fit_before_init_says_so(tmp_path):
    with pytest.raises(tray.exceptions.NotInitializedError, match="call tray.init"):
        trainer(context_loop, tmp_path).fit()


def run_with_a_crash(seed: int, storage: str) -> tuple:
    tray.init(backend="sim", num_nodes=2, num_cpus=2, seed=seed)
    try:
        result = trainer(counting_loop, storage, name=f"seed{seed}", max_failures=1,
                         config={"steps": 4, "kill_rank": 1, "kill_at": 2}).fit()
        return list(result.metrics_dataframe["time_total_s"]), tray.simtest.trace_digest()
    finally:
        tray.shutdown()


def test_a_run_with_a_crash_replays_exactly(tmp_path):
    first = run_with_a_crash(5, str(tmp_path / "a"))
    second = run_with_a_crash(5, str(tmp_path / "b"))
    assert first == second  # the same virtual times, the same trace


# ================================================================ Tune


def test_a_trainer_is_a_tune_trainable(tmp_path):
    from tray import tune

    tray.init(backend="sim", num_nodes=2, num_cpus=4, seed=8)
    base = trainer(counting_loop, tmp_path / "unused", max_failures=1,
                   config={"steps": 3, "kill_rank": 1, "kill_at": 2, "step_s": 0.05})
    tuner = tune.Tuner(
        tune.with_resources(base, {"cpu": 0}),  # the trial's runner only drives the trainer
        param_space={"train_loop_config": {"steps": tune.grid_search([3, 5])}},
        tune_config=tune.TuneConfig(metric="step", mode="max"),
        run_config=tune.RunConfig(name="tune", storage_path=str(tmp_path), verbose=0,
                                  stop={"training_iteration": 4}))
    grid = tuner.fit()
    assert len(grid) == 2
    assert not grid.errors
    by_steps = {r.config["train_loop_config"]["steps"]: r for r in grid}
    # Each trial ran the trainer, killed worker and restart included; its reports
    # are the trial's results and its checkpoints Tune's.
    assert by_steps[3].metrics["step"] == 3
    assert read_state(by_steps[3].checkpoint) == 3
    # The stopper ended the 5-step trial after 4 results: the trainer's workers
    # went with it.
    assert by_steps[5].metrics["step"] == 4
    assert grid.get_best_result().config == {"train_loop_config": {"steps": 5}}
    states = [row["state"] for row in tray.util.placement_group_table().values()]
    assert states and set(states) == {"REMOVED"}
    # The trainer wrote its own run under the trial's directory: two attempts.
    with open(os.path.join(by_steps[3].path, "train", "result.json"), encoding="utf-8") as f:
        rows = [json.loads(line) for line in f]
    assert [(r["step"], r["attempt"]) for r in rows] == [(1, 0), (2, 1), (3, 1)]
    with pytest.raises(ValueError, match="takes 'train_loop_config' and 'scaling_config'"):
        base._for_trial({"lr": 0.1})


# ================================================================ torch on the simulator


def torch_regression_loop(config):
    import torch

    from tray.train import torch as train_torch

    torch.manual_seed(0)
    x = torch.linspace(-1, 1, 64).unsqueeze(1)
    dataset = torch.utils.data.TensorDataset(x, 3 * x + 1)
    loader = train_torch.prepare_data_loader(
        torch.utils.data.DataLoader(dataset, batch_size=16, shuffle=True))
    model = train_torch.prepare_model(torch.nn.Linear(1, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.2)
    for epoch in range(config["epochs"]):
        total = 0.0
        for inputs, targets in loader:
            loss = torch.nn.functional.mse_loss(model(inputs), targets)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total += loss.item()
        train.report({"epoch": epoch, "loss": total / len(loader),
                      "model": type(model).__name__,
                      "device": str(train_torch.get_device())})


def test_torch_trainer_on_the_simulator(sim, tmp_path):
    from tray.train.torch import TorchTrainer

    run_config = train.RunConfig(storage_path=str(tmp_path), verbose=0)
    two = TorchTrainer(torch_regression_loop, train_loop_config={"epochs": 2},
                       scaling_config=train.ScalingConfig(num_workers=2), run_config=run_config)
    with pytest.raises(RuntimeError, match="cannot run on the simulated backend"):
        two.fit()
    # One worker needs no process group: it trains, unwrapped, on the CPU.
    one = TorchTrainer(torch_regression_loop, train_loop_config={"epochs": 15},
                       scaling_config=train.ScalingConfig(num_workers=1), run_config=run_config)
    result = one.fit()
    losses = list(result.metrics_dataframe["loss"])
    assert losses[-1] < losses[0] / 20
    assert result.metrics["model"] == "Linear"
    assert result.metrics["device"] == "cpu"


def test_torch_utilities_reject_what_they_cannot_prepare():
    import torch

    from tray.train import torch as train_torch

    with pytest.raises(TypeError, match="torch.nn.Module"):
        train_torch.prepare_model("model")
    with pytest.raises(ValueError, match="no FSDP support"):
        train_torch.prepare_model(torch.nn.Linear(1, 1), parallel_strategy="fsdp")
    with pytest.raises(TypeError, match="DataLoader"):
        train_torch.prepare_data_loader([1, 2])
    with pytest.raises(ValueError, match="TorchConfig.backend"):
        train_torch.TorchConfig(backend="mpi")
    # Outside a worker: one worker's view, the loader keeps its sampler.
    loader = train_torch.prepare_data_loader(torch.utils.data.DataLoader(list(range(8)),
                                                                         batch_size=4))
    assert [batch.tolist() for batch in loader] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert len(loader) == 2
