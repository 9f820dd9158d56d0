"""tray.rllib: the config builder, training on the simulator (learning,
determinism, faults), checkpoints, modules, multi-agent and offline data.

Everything here runs on the simulated backend (virtual time; one process);
tests/test_rllib_local.py runs the same algorithms on real processes.
Learning is asserted only on seeded simulator runs, whose curves are
bit-for-bit reproducible, against bars well below what those seeds reach
(the numbers in the comments), so the assertions cannot flake."""

from __future__ import annotations

import math
import os
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
gymnasium = pytest.importorskip("gymnasium")

import tray  # noqa: E402
import tray.simtest  # noqa: E402
from tray.rllib import RLModuleSpec, register_env  # noqa: E402
from tray.rllib.algorithms.appo import APPOConfig  # noqa: E402
from tray.rllib.algorithms.bc import BCConfig  # noqa: E402
from tray.rllib.algorithms.pg import PGConfig  # noqa: E402
from tray.rllib.algorithms.ppo import PPO, PPOConfig  # noqa: E402
from tray.rllib.env import MultiAgentCartPole  # noqa: E402
from tray.rllib.env.env_runner_group import EnvRunnerFailedError  # noqa: E402
from tray.rllib.offline import read_transitions  # noqa: E402

SMALL = {"fcnet_hiddens": [32, 32]}


@pytest.fixture(autouse=True)
def _one_torch_thread():
    torch.set_num_threads(1)


@pytest.fixture
def sim():
    tray.init(backend="sim", seed=0, num_cpus=4)
    yield tray.simtest.cluster()
    tray.shutdown()


def ppo_config(seed: int = 0, runners: int = 2, batch: int = 1000) -> PPOConfig:
    """The CartPole PPO the learning tests use (RLlib's tuned CartPole
    example, scaled down): 1000 steps per iteration, 6 epochs."""
    return (PPOConfig().environment("CartPole-v1")
            .env_runners(num_env_runners=runners, num_envs_per_env_runner=2)
            .training(lr=3e-4, train_batch_size=batch, minibatch_size=128, num_epochs=6,
                      model=SMALL, vf_loss_coeff=0.01)
            .debugging(seed=seed))


def curve(algo, iterations: int) -> list[float]:
    return [algo.train()["env_runners"]["episode_return_mean"] for _ in range(iterations)]


# ================================================================ config


def test_config_builder_chains_and_keeps_rllib_defaults():
    config = (PPOConfig().environment("CartPole-v1", env_config={"a": 1})
              .env_runners(num_env_runners=3, num_envs_per_env_runner=2,
                           rollout_fragment_length=50, sample_timeout_s=5)
              .training(lr=1e-3, gamma=0.95, train_batch_size=600, minibatch_size=100,
                        num_epochs=3, model={"fcnet_hiddens": [8]}, clip_param=0.2)
              .learners(num_learners=1).resources(num_cpus_for_main_process=1)
              .fault_tolerance(restart_failed_env_runners=False).debugging(seed=5)
              .api_stack(enable_rl_module_and_learner=True,
                         enable_env_runner_and_connector_v2=True).framework("torch"))
    assert (config.num_env_runners, config.num_envs_per_env_runner) == (3, 2)
    assert (config.lr, config.gamma, config.clip_param) == (1e-3, 0.95, 0.2)
    assert config.model["fcnet_hiddens"] == [8] and config.model["fcnet_activation"] == "tanh"
    assert config.env_config == {"a": 1} and config.seed == 5
    assert config.restart_failed_env_runners is False
    defaults = PPOConfig()
    assert (defaults.lr, defaults.train_batch_size, defaults.minibatch_size,
            defaults.num_epochs, defaults.clip_param, defaults.kl_coeff) == \
        (5e-5, 4000, 128, 30, 0.3, 0.2)
    assert defaults.restart_failed_env_runners is True
    # "auto": the train batch split over runners x envs.
    auto = PPOConfig().env_runners(num_env_runners=2, num_envs_per_env_runner=2) \
        .training(train_batch_size=1000)
    assert auto.get_rollout_fragment_length() == 250
    copied = config.copy()
    copied.training(lr=0.5)
    assert config.lr == 1e-3


@pytest.mark.parametrize("call, message", [
    (lambda c: c.env_runners(num_env_runners=-1), "num_env_runners"),
    (lambda c: c.env_runners(batch_mode="episodes"), "batch_mode"),
    (lambda c: c.training(gamma=1.5), "gamma"),
    (lambda c: c.training(lr=0), "lr"),
    (lambda c: c.training(model={"fcnet_hiddens": [0]}).validate(), "fcnet_hiddens"),
    (lambda c: c.training(model={"fcnet_activation": "swish"}).validate(), "fcnet_activation"),
    (lambda c: c.training(train_batch_size=100, minibatch_size=200).validate(), "minibatch_size"),
    (lambda c: c.framework("tf2"), "torch"),
    (lambda c: c.api_stack(enable_rl_module_and_learner=False), "new API stack"),
    (lambda c: c.environment(env=None).validate(), "no environment"),
    (lambda c: c.multi_agent(policies={"a", "b"}).validate(), "policy_mapping_fn"),
    (lambda c: c.offline_data(output_format="csv"), "output_format"),
    (lambda c: c.debugging(seed="x"), "seed"),
])
def test_bad_settings_raise_clear_errors(call, message):
    with pytest.raises(ValueError, match=message):
        call(PPOConfig().environment("CartPole-v1"))


def test_algorithm_specific_validation():
    with pytest.raises(ValueError, match="complete_episodes"):
        PGConfig().environment("CartPole-v1").env_runners(
            batch_mode="truncate_episodes").validate()
    with pytest.raises(ValueError, match="input_"):
        BCConfig().environment("CartPole-v1").validate()
    with pytest.raises(ValueError, match="unknown environment"):
        PPOConfig().environment("NoSuchEnv-v0").env_runners(num_env_runners=0).build()
    with pytest.raises(ValueError, match="Discrete or one-dimensional Box"):
        PPOConfig().environment("CartPole-v1").environment(
            action_space=gymnasium.spaces.MultiBinary(3)).env_runners(num_env_runners=0).build()


# ============================================================= learning


def test_ppo_learns_cartpole_and_reports_rllib_result_keys(sim):
    algo = ppo_config(seed=0).build()
    returns = curve(algo, 8)  # seed 0: 19.3 23.2 33.6 52.7 44.2 93.9 88.8 142.8
    result = algo.train()
    assert returns[-1] >= 4 * returns[0], returns
    env_runners = result["env_runners"]
    for key in ("episode_return_mean", "episode_return_max", "episode_return_min",
                "episode_len_mean", "num_episodes", "num_env_steps_sampled",
                "num_env_steps_sampled_lifetime", "module_episode_returns_mean"):
        assert key in env_runners, key
    assert result["training_iteration"] == 9
    assert result["num_env_steps_sampled_lifetime"] == 9000
    assert env_runners["num_env_steps_sampled"] == 1000
    assert result["num_env_steps_trained_lifetime"] == 9000
    learner = result["learners"]["default_policy"]
    for key in ("policy_loss", "vf_loss", "entropy", "mean_kl_loss", "curr_kl_coeff",
                "total_loss", "vf_explained_var", "num_module_steps_trained"):
        assert math.isfinite(learner[key]), key
    assert result["learners"]["__all_modules__"]["num_env_steps_trained"] == 1000
    assert result["fault_tolerance"] == {
        "num_healthy_workers": 2, "num_remote_worker_restarts": 0,
        "num_lost_sample_requests": 0, "num_lost_results": 0, "num_faulty_episodes": 0,
        "num_timed_out_sample_requests": 0}
    assert result["time_this_iter_s"] > 0 and result["time_total_s"] >= result["time_this_iter_s"]
    # Greedy evaluation of the trained policy (seed 0: 238; random play: ~20).
    evaluation = algo.evaluate()["env_runners"]
    assert evaluation["num_episodes"] == 10
    assert evaluation["episode_return_mean"] >= 150, evaluation
    algo.stop()


def test_same_seed_same_learning_curve_bit_for_bit():
    def run() -> tuple[list, str, list]:
        tray.init(backend="sim", seed=3, num_cpus=4, num_nodes=2)
        try:
            algo = ppo_config(seed=11, batch=400).build()
            returns = curve(algo, 3)
            weights = algo.get_weights()["default_policy"]["pi"][0][0].copy()
            algo.stop()
            del algo
            return returns, tray.simtest.trace_digest(), weights
        finally:
            tray.shutdown()

    first, second = run(), run()
    assert first[0] == second[0]
    assert np.array_equal(first[2], second[2])
    assert first[1] == second[1]


def test_pg_learns_cartpole(sim):
    algo = (PGConfig().environment("CartPole-v1").env_runners(num_env_runners=2)
            .training(lr=0.01, train_batch_size=500, model=SMALL).debugging(seed=0).build())
    returns = curve(algo, 10)  # seed 0: 19.7 25.0 29.9 44.2 39.0 69.2 46.9 68.5 69.5 109.1
    assert returns[-1] >= 3 * returns[0], returns
    result_keys = algo.train()["learners"]["default_policy"]
    assert "policy_loss" in result_keys and "vf_loss" not in result_keys
    algo.stop()


def test_appo_samples_asynchronously_with_version_tracking(sim):
    algo = (APPOConfig().environment("CartPole-v1").env_runners(num_env_runners=2)
            .training(train_batch_size=200, model=SMALL).debugging(seed=0).build())
    results = [algo.train() for _ in range(15)]
    # Runners kept sampling while the learner updated: some fragments
    # arrived with older weights than the newest.
    assert max(r["env_runners"]["weights_lag_max"] for r in results) >= 1
    assert results[-1]["env_runners"]["weights_version"] == 16  # initial + one per update
    assert all(r["env_runners"]["num_env_steps_sampled"] >= 200 for r in results)
    assert results[-1]["env_runner_group"]["actor_manager_num_outstanding_async_reqs"] == 2
    returns = [r["env_runners"]["episode_return_mean"] for r in results]
    assert returns[-1] > returns[0], returns
    algo.stop()


# ============================================================ faults


def test_killed_env_runner_is_restarted_and_training_converges_alike(sim):
    """Kill one env runner's worker in the middle of iteration 3: the runner
    restarts, the lost request is counted, every iteration still samples
    its full batch, and the curve stays close to the fault-free one."""
    reference = ppo_config(seed=4).build()
    reference_curve = curve(reference, 8)  # seed 4: 23.6 28.8 30.0 41.0 57.9 59.6 74.1 94.8
    reference.stop()

    algo = ppo_config(seed=4).env_runners(num_envs_per_env_runner=2).build()
    curve(algo, 2)
    victim = algo.env_runner_group.runners[1]
    worker = sim.worker_of(victim)
    # The next sample request is in flight when the kill lands.
    sim.at(0.0001, lambda: sim.kill_worker(worker))
    results = [algo.train() for _ in range(6)]  # seed 4: 32.1 45.4 69.8 46.9 81.5 119.8
    faults = results[-1]["fault_tolerance"]
    assert faults["num_remote_worker_restarts"] >= 1
    assert faults["num_lost_sample_requests"] >= 1
    assert faults["num_lost_results"] == 0  # the runner died, not just a result
    assert faults["num_faulty_episodes"] == 2 * faults["num_lost_sample_requests"]
    assert faults["num_healthy_workers"] == 2
    assert all(r["env_runners"]["num_env_steps_sampled"] >= 1000 for r in results)
    assert sim.worker_of(victim) not in (None, worker)  # a new incarnation
    faulty_curve = [reference_curve[0], reference_curve[1]] + \
        [r["env_runners"]["episode_return_mean"] for r in results]
    assert faulty_curve[-1] >= 3 * faulty_curve[0]
    # The same shape: the last three iterations average within 25% of the
    # fault-free run's (seed 4: 82.7 against 76.2).
    late_faulty, late_reference = np.mean(faulty_curve[-3:]), np.mean(reference_curve[-3:])
    assert abs(late_faulty - late_reference) <= 0.25 * late_reference, \
        (reference_curve, faulty_curve)
    algo.stop()


def _kill_first_runner_during_next_train(sim, algo):
    worker = sim.worker_of(algo.env_runner_group.runners[1])
    sim.at(0.0001, lambda: sim.kill_worker(worker))


def test_without_restarts_a_failure_propagates_or_is_ignored(sim):
    algo = ppo_config(batch=400).fault_tolerance(restart_failed_env_runners=False).build()
    algo.train()
    _kill_first_runner_during_next_train(sim, algo)
    with pytest.raises(EnvRunnerFailedError, match="restart_failed_env_runners") as info:
        algo.train()
    assert isinstance(info.value.__cause__, tray.exceptions.ActorError)
    algo.stop()

    algo = ppo_config(batch=400).fault_tolerance(restart_failed_env_runners=False,
                                                 ignore_env_runner_failures=True).build()
    algo.train()
    _kill_first_runner_during_next_train(sim, algo)
    result = algo.train()
    assert result["fault_tolerance"]["num_healthy_workers"] == 1
    assert result["env_runners"]["num_env_steps_sampled"] >= 400
    algo.stop()


class _ExplodingEnv(gymnasium.Env):
    """CartPole that raises on its 30th step (per process)."""
    steps = 0

    def __init__(self, config=None):
        self.env = gymnasium.make("CartPole-v1")
        self.observation_space, self.action_space = self.env.observation_space, \
            self.env.action_space

    def reset(self, *, seed=None, options=None):
        return self.env.reset(seed=seed)

    def step(self, action):
        _ExplodingEnv.steps += 1
        if _ExplodingEnv.steps == 30:
            raise RuntimeError("the simulator crashed")
        return self.env.step(action)


def test_env_error_replaces_the_runner_and_a_broken_env_gives_up(sim):
    _ExplodingEnv.steps = 0
    algo = (PPOConfig().environment(_ExplodingEnv).env_runners(num_env_runners=1)
            .training(train_batch_size=100, minibatch_size=50, num_epochs=1, model=SMALL)
            .build())
    result = algo.train()
    assert result["fault_tolerance"]["num_remote_worker_restarts"] == 1
    assert result["env_runners"]["num_env_steps_sampled"] >= 100
    algo.stop()

    class AlwaysBroken(_ExplodingEnv):
        def step(self, action):
            raise RuntimeError("never works")

    algo = (PPOConfig().environment(AlwaysBroken).env_runners(num_env_runners=1)
            .training(train_batch_size=100, minibatch_size=50, num_epochs=1, model=SMALL)
            .fault_tolerance(num_consecutive_env_runner_failures_tolerance=2).build())
    with pytest.raises(EnvRunnerFailedError, match="(?s)3 times in a row.*never works"):
        algo.train()
    algo.stop()


# ===================================================== checkpoints, modules


def test_checkpoint_round_trip_and_continue_training(sim, tmp_path):
    algo = ppo_config(seed=2, batch=400).build()
    curve(algo, 2)
    path = algo.save(str(tmp_path / "ckpt")).checkpoint.path
    assert os.path.exists(os.path.join(path, "rllib_checkpoint.json"))
    assert os.path.exists(os.path.join(path, "learner_group", "learner", "rl_module",
                                       "default_policy", "module_state.npz"))
    following = algo.train()
    restored = PPO.from_checkpoint(path)
    assert restored.iteration == 2
    for a, b in zip(restored.get_weights()["default_policy"]["pi"],
                    algo.get_weights()["default_policy"]["pi"], strict=True):
        assert a[0].shape == b[0].shape
    # The restored algorithm holds the saved state: the same weights as at save.
    again = PPO.from_checkpoint(path)
    assert np.array_equal(again.get_weights()["default_policy"]["vf"][0][0],
                          restored.get_weights()["default_policy"]["vf"][0][0])
    result = restored.train()
    assert result["training_iteration"] == 3
    assert result["num_env_steps_sampled_lifetime"] == following["num_env_steps_sampled_lifetime"]
    with pytest.raises(ValueError, match="not a tray.rllib checkpoint"):
        PPO.from_checkpoint(str(tmp_path))
    for each in (algo, restored, again):
        each.stop()


def test_get_module_and_compute_single_action_agree(sim):
    algo = ppo_config(seed=1, batch=400).build()
    curve(algo, 2)
    module = algo.get_module()
    env = gymnasium.make("CartPole-v1")
    obs, _ = env.reset(seed=0)
    for _ in range(20):
        out = module.forward_inference({"obs": torch.as_tensor(obs[None])})
        greedy = int(out["action_dist_inputs"].argmax(-1)[0])
        assert algo.compute_single_action(obs) == greedy
        obs, *_ = env.step(greedy)
    train_out = module.forward_train({"obs": torch.zeros(3, 4)})
    assert train_out["vf_preds"].shape == (3,)
    with pytest.raises(ValueError, match="no module"):
        algo.get_module("other")
    algo.stop()


def test_continuous_actions_and_custom_envs_with_env_context(sim):
    seen = []

    def creator(context):
        seen.append((context.worker_index, context.vector_index, context["g"]))
        return gymnasium.make("Pendulum-v1", g=context["g"])

    register_env("my-pendulum", creator)
    algo = (PPOConfig().environment("my-pendulum", env_config={"g": 9.0})
            .env_runners(num_env_runners=1, num_envs_per_env_runner=2)
            .training(train_batch_size=200, minibatch_size=100, num_epochs=1, model=SMALL)
            .build())
    result = algo.train()
    assert result["env_runners"]["num_env_steps_sampled"] == 200
    action = algo.compute_single_action(np.zeros(3, dtype=np.float32))
    assert action.shape == (1,) and -2.0 <= float(action[0]) <= 2.0
    assert (1, 1, 9.0) in seen and (0, 0, 9.0) in seen  # runner 1's 2nd env; the driver's probe
    algo.stop()


# ========================================================== multi-agent


def test_multi_agent_trains_one_module_per_policy(sim):
    config = (PPOConfig().environment(MultiAgentCartPole, env_config={"num_agents": 2})
              .env_runners(num_env_runners=2)
              .multi_agent(policies={"p0", "p1"},
                           policy_mapping_fn=lambda agent_id, episode, **kw: f"p{agent_id}")
              .training(lr=3e-4, train_batch_size=600, minibatch_size=128, num_epochs=4,
                        model=SMALL, vf_loss_coeff=0.01)
              .debugging(seed=0))
    algo = config.build()
    before = algo.get_weights()
    results = [algo.train() for _ in range(4)]
    after = algo.get_weights()
    last = results[-1]
    assert sorted(last["learners"]) == ["__all_modules__", "p0", "p1"]
    assert sorted(last["env_runners"]["module_episode_returns_mean"]) == ["p0", "p1"]
    assert set(last["env_runners"]["num_module_steps_sampled"]) == {"p0", "p1"}
    for module_id in ("p0", "p1"):  # each module was trained, and separately
        assert not np.array_equal(before[module_id]["pi"][0][0], after[module_id]["pi"][0][0])
    assert not np.array_equal(after["p0"]["pi"][0][0], after["p1"]["pi"][0][0])
    # Episode returns are the sum over the agents.
    assert last["env_runners"]["episode_return_mean"] == pytest.approx(
        sum(last["env_runners"]["module_episode_returns_mean"].values()), rel=1e-6)
    assert algo.compute_single_action(np.zeros(4), policy_id="p1") in (0, 1)
    algo.stop()


def test_policies_to_train_freezes_the_others(sim):
    algo = (PPOConfig().environment(MultiAgentCartPole)
            .env_runners(num_env_runners=1)
            .multi_agent(policies={"p0", "p1"}, policies_to_train=["p0"],
                         policy_mapping_fn=lambda agent_id, episode, **kw: f"p{agent_id}")
            .training(train_batch_size=200, minibatch_size=100, num_epochs=1, model=SMALL)
            .build())
    before = algo.get_weights()
    result = algo.train()
    after = algo.get_weights()
    assert np.array_equal(before["p1"]["pi"][0][0], after["p1"]["pi"][0][0])
    assert not np.array_equal(before["p0"]["pi"][0][0], after["p0"]["pi"][0][0])
    assert "p1" not in result["learners"]
    algo.stop()


# ============================================================ offline


@pytest.mark.parametrize("output_format", ["json", "parquet"])
def test_offline_output_records_every_sampled_transition(sim, tmp_path, output_format):
    out = str(tmp_path / "episodes")
    algo = (ppo_config(batch=400).offline_data(output=out, output_format=output_format)
            .build())
    algo.train()
    algo.train()
    algo.stop()
    files = sorted(os.listdir(out))
    assert files and all(f.endswith("." + output_format) for f in files)
    data = read_transitions(out)
    assert len(data["rewards"]) == 800  # two iterations of 400 env steps
    assert data["obs"].shape == (800, 4) and data["new_obs"].shape == (800, 4)
    # Within an episode, each transition's new_obs is the next one's obs.
    order = np.lexsort((data["t"], data["eps_id"]))
    for this, nxt in zip(order[:-1], order[1:], strict=True):
        if data["eps_id"][this] == data["eps_id"][nxt]:
            assert data["t"][nxt] == data["t"][this] + 1
            assert np.array_equal(data["new_obs"][this], data["obs"][nxt])


def _heuristic_cartpole_episodes(path: str, episodes: int) -> None:
    """An expert's episodes (the pole-angle rule reaches 500) in the
    env runners' output format."""
    from tray.rllib.offline.io import chunk_transitions, write_transitions

    env = gymnasium.make("CartPole-v1")
    columns: dict = {}
    for episode in range(episodes):
        obs, _ = env.reset(seed=episode)
        observations, actions, rewards = [obs], [], []
        done = terminated = False
        while not done:
            action = int(obs[2] + 0.5 * obs[3] > 0)
            obs, reward, terminated, truncated, _ = env.step(action)
            observations.append(obs)
            actions.append(action)
            rewards.append(reward)
            done = terminated or truncated
        chunk = {"eps_id": f"expert-{episode}", "t_started": 0, "obs": np.array(observations),
                 "actions": np.array(actions), "rewards": np.array(rewards),
                 "action_logp": np.zeros(len(actions)), "terminated": terminated,
                 "truncated": not terminated}
        for name, values in chunk_transitions(chunk, "default_policy").items():
            columns.setdefault(name, []).extend(values)
    write_transitions(path, columns, "parquet")


def test_behaviour_cloning_learns_from_recorded_episodes(sim, tmp_path):
    path = str(tmp_path / "expert.parquet")
    _heuristic_cartpole_episodes(path, episodes=4)
    algo = (BCConfig().environment("CartPole-v1").offline_data(input_=path)
            .training(lr=1e-2, train_batch_size=1000, minibatch_size=200, num_epochs=2,
                      model=SMALL)
            .evaluation(evaluation_duration=3).debugging(seed=0).build())
    losses = [algo.train()["learners"]["default_policy"]["policy_loss"] for _ in range(6)]
    assert losses[-1] < 0.75 * losses[0], losses  # seed 0: 0.550 ... 0.338
    evaluation = algo.evaluate()["env_runners"]
    assert evaluation["episode_return_mean"] >= 200, evaluation  # seed 0: 500; random: ~20
    algo.stop()
    with pytest.raises(FileNotFoundError, match="does not exist"):
        BCConfig().environment("CartPole-v1").offline_data(
            input_=str(tmp_path / "missing")).build()


# ====================================================== learners, groups


def test_two_data_parallel_learners_match_one_learner(sim):
    """Gradients averaged over two learners' shards give the same update as
    one learner on the whole minibatch."""
    from tray.rllib.algorithms.ppo.ppo_learner import PPOLearner
    from tray.rllib.core.learner_group import LearnerGroup
    from tray.rllib.env.env_runner import SingleAgentEnvRunner

    config = ppo_config(seed=9, batch=256).training(minibatch_size=64, num_epochs=2)
    spec = RLModuleSpec(gymnasium.spaces.Box(-np.inf, np.inf, (4,)),
                        gymnasium.spaces.Discrete(2), dict(config.model))
    runner = SingleAgentEnvRunner(config, 1, 1, spec)
    batch = runner.sample([spec.initial_weights(9)], 1, num_timesteps=256)["chunks"]
    results, weights = {}, {}
    for learners in (0, 2):
        group = LearnerGroup(config.copy().learners(num_learners=learners), PPOLearner,
                             {"default_policy": spec})
        results[learners] = group.update(batch)
        weights[learners] = group.get_weights()["default_policy"]
        group.stop()
    for (w0, b0), (w2, b2) in zip(weights[0]["pi"] + weights[0]["vf"],
                                  weights[2]["pi"] + weights[2]["vf"], strict=True):
        np.testing.assert_allclose(w0, w2, atol=1e-5)
        np.testing.assert_allclose(b0, b2, atol=1e-5)
    assert results[2]["__all_modules__"]["num_minibatch_updates"] == 8
    assert results[0]["default_policy"]["curr_kl_coeff"] == \
        results[2]["default_policy"]["curr_kl_coeff"]


def test_remote_learner_trains(sim):
    algo = ppo_config(seed=0, batch=400).learners(num_learners=1).build()
    first = algo.get_weights()["default_policy"]["pi"][0][0].copy()
    result = algo.train()
    assert result["learners"]["default_policy"]["num_module_steps_trained"] == 400
    assert not np.array_equal(first, algo.get_weights()["default_policy"]["pi"][0][0])
    algo.stop()


def test_env_runners_and_sampling_work_without_torch(tmp_path):
    """The env runners act with numpy: the sampling path never imports torch."""
    script = tmp_path / "no_torch.py"
    script.write_text(
        "import sys\n"
        "sys.modules['torch'] = None  # any import of torch now fails\n"
        "import gymnasium, numpy as np, tray\n"
        "from tray.rllib.algorithms.ppo import PPOConfig\n"
        "from tray.rllib.core.rl_module import RLModuleSpec\n"
        "from tray.rllib.env import EnvRunnerGroup\n"
        "tray.init(backend='sim', seed=0)\n"
        "config = PPOConfig().environment('CartPole-v1').env_runners(\n"
        "    num_env_runners=2, rollout_fragment_length=50)\n"
        "env = gymnasium.make('CartPole-v1')\n"
        "spec = RLModuleSpec(env.observation_space, env.action_space, config.model)\n"
        "group = EnvRunnerGroup(config, {'default_policy': spec})\n"
        "weights = tray.put({'default_policy': spec.initial_weights(0)})\n"
        "results = group.sample(weights, 1, num_timesteps=300)\n"
        "print(sum(r['env_steps'] for r in results), "
        "sum(len(r['episodes']) for r in results) > 0)\n"
        "group.stop(); tray.shutdown()\n")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["300", "True"]


def test_readme_rllib_example_runs(tmp_path):
    import readme_examples

    block = readme_examples.python_blocks(page="rllib.md")[0]
    done = readme_examples.run(block, tmp_path, timeout_s=240,
                               env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split("\n")[:4] == ["8 8000", "True", "True", "1"], done.stdout


def test_tune_trains_an_algorithm_as_a_trainable(sim):
    from tray import tune

    config = (PPOConfig().environment("CartPole-v1").env_runners(num_env_runners=1)
              .training(train_batch_size=200, minibatch_size=100, num_epochs=1,
                        model={"fcnet_hiddens": [16]}))
    space = config.to_dict()
    space["lr"] = tune.grid_search([1e-3, 1e-4])
    tuner = tune.Tuner(PPO.as_trainable(), param_space=space,
                       tune_config=tune.TuneConfig(metric="episode_return_mean", mode="max"),
                       run_config=tune.RunConfig(stop={"training_iteration": 2}, verbose=0))
    grid = tuner.fit()
    assert len(grid) == 2
    assert sorted(r.config["lr"] for r in grid) == [1e-4, 1e-3]
    for result in grid:
        assert result.metrics["training_iteration"] == 2
        assert result.metrics["num_env_steps_sampled_lifetime"] == 400


def test_weights_are_broadcast_with_one_put_per_iteration(sim):
    def driver_puts() -> int:
        return sum(1 for e in sim.trace.events
                   if e["event"] == "put" and e["component"].endswith("/driver"))

    before = driver_puts()
    algo = ppo_config(batch=400, runners=3).build()
    assert driver_puts() - before == 1  # the initial weights
    for _ in range(3):
        algo.train()
    assert driver_puts() - before == 4  # one more per update, whatever the runner count
    versions = algo.env_runner_group.foreach_env_runner(lambda runner: runner.weights_version)
    assert versions == [algo.weights_version - 1] * 3  # sampled with the last broadcast
    algo.stop()


class _StuckOnceEnv(gymnasium.Env):
    """CartPole; the first copy made for env runner 1 hangs on its 5th step."""
    stuck = False

    def __init__(self, config):
        self.env = gymnasium.make("CartPole-v1")
        self.observation_space, self.action_space = self.env.observation_space, \
            self.env.action_space
        self.hangs = config.worker_index == 1 and not _StuckOnceEnv.stuck
        _StuckOnceEnv.stuck = _StuckOnceEnv.stuck or self.hangs
        self.steps = 0

    def reset(self, *, seed=None, options=None):
        return self.env.reset(seed=seed)

    def step(self, action):
        self.steps += 1
        if self.hangs and self.steps == 5:
            import time

            time.sleep(10_000)  # virtual time: the runner is alive but never answers
        return self.env.step(action)


def test_a_runner_that_keeps_missing_the_sample_timeout_is_replaced(sim):
    _StuckOnceEnv.stuck = False
    algo = (PPOConfig().environment(_StuckOnceEnv)
            .env_runners(num_env_runners=2, sample_timeout_s=5.0)
            .training(train_batch_size=200, minibatch_size=100, num_epochs=1, model=SMALL)
            .build())
    results = [algo.train() for _ in range(2)]
    faults = results[-1]["fault_tolerance"]
    assert faults["num_timed_out_sample_requests"] >= 2
    assert faults["num_remote_worker_restarts"] == 1
    assert faults["num_healthy_workers"] == 2
    assert all(r["env_runners"]["num_env_steps_sampled"] >= 200 for r in results)
    algo.stop()


def test_dqn_learns_cartpole_from_its_replay_buffer(sim):
    from tray.rllib.algorithms.dqn import DQNConfig

    algo = (DQNConfig().environment("CartPole-v1")
            .training(lr=1e-3, model=SMALL, epsilon=[[0, 1.0], [5000, 0.02]],
                      num_steps_sampled_before_learning_starts=500,
                      target_network_update_freq=500)
            .debugging(seed=0).build())
    results = [algo.train() for _ in range(6)]
    returns = [r["env_runners"]["episode_return_mean"] for r in results]
    # Per-iteration means of an epsilon-greedy policy are noisy (seed 0:
    # 27.4 15.9 29.7 62.4 39.2 27.7); the greedy evaluation below is the measure.
    assert max(returns[3:]) >= 1.5 * max(returns[:3]), returns
    assert results[0]["env_runners"]["epsilon"] == pytest.approx(0.804)
    assert results[-1]["env_runners"]["epsilon"] == pytest.approx(0.02)
    assert results[-1]["env_runners"]["replay_buffer_size"] == 6000
    assert "qf_loss" in results[-1]["learners"]["default_policy"]
    assert algo.evaluate()["env_runners"]["episode_return_mean"] >= 60  # seed 0: 110
    algo.stop()
    with pytest.raises(ValueError, match="Discrete actions"):
        DQNConfig().environment("Pendulum-v1").build()
