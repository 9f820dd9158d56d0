"""tray.rllib under the simulator's faults: an algorithm trains while
workers, nodes, the GCS and the network fail around its env runners.

Each seed picks an algorithm (PPO, PG or APPO), 1-3 env runners and 2-4
iterations of a small CartPole training whose env steps cost virtual time
(``SlowCartPole``: 2 ms per step), so the iterations overlap the fault
window. Without injected faults, half of the seeds kill one env runner's
worker themselves in the middle of an iteration. Runners restart
(``restart_failed_env_runners``) and the reference model says what must
hold however the faults fell:

* ``train()`` returns for every iteration (no error reaches the user);
* every iteration sampled at least its train batch (a lost request is made
  up for, not skipped), and the learner trained exactly what was sampled;
* the lifetime counters add up (lifetime steps = sum of the iterations');
* every runner is healthy at the end, and the group's failure counters
  agree with each other (each lost request was either a restart or, with
  no restart allowed, nothing);
* episode returns are finite and at least CartPole's minimum of 8.

Requires gymnasium, and torch for the learner; without them the workload
is a no-op that says so (``program.expect`` of a skip marker)."""

from __future__ import annotations

import gc
import math
import time

import tray

BATCH = 200
STEP_COST_S = 0.002


class SlowCartPole:
    """CartPole whose every step costs ``step_cost_s`` of (virtual) time."""

    def __init__(self, config=None) -> None:
        import gymnasium

        config = config or {}
        self.env = gymnasium.make("CartPole-v1")
        self.step_cost_s = float(config.get("step_cost_s", STEP_COST_S))
        self.observation_space = self.env.observation_space
        self.action_space = self.env.action_space

    def reset(self, *, seed=None, options=None):
        return self.env.reset(seed=seed, options=options)

    def step(self, action):
        time.sleep(self.step_cost_s)
        return self.env.step(action)

    def close(self) -> None:
        self.env.close()


def _available() -> bool:
    try:
        import gymnasium  # noqa: F401
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


def _config(name: str, num_runners: int, seed: int):
    small = {"fcnet_hiddens": [16, 16]}
    if name == "PPO":
        from tray.rllib.algorithms.ppo import PPOConfig

        config = PPOConfig().training(lr=3e-4, train_batch_size=BATCH, minibatch_size=50,
                                      num_epochs=2, model=small)
    elif name == "PG":
        from tray.rllib.algorithms.pg import PGConfig

        config = PGConfig().training(lr=0.01, train_batch_size=BATCH, model=small)
    else:
        from tray.rllib.algorithms.appo import APPOConfig

        config = APPOConfig().training(train_batch_size=BATCH, model=small)
        config.env_runners(rollout_fragment_length=25)
    return (config.environment(SlowCartPole, env_config={"step_cost_s": STEP_COST_S})
            .env_runners(num_env_runners=num_runners, sample_timeout_s=30.0)
            .fault_tolerance(restart_failed_env_runners=True)
            .debugging(seed=seed))


def rllib(program) -> None:
    rng = program.rng
    if not _available():
        program.expect(tray.put("skipped"), "skipped", label="rllib needs torch and gymnasium")
        return
    import torch

    torch.set_num_threads(1)
    name = rng.choice(["PPO", "PPO", "PG", "APPO"])
    num_runners = rng.randint(1, 3)
    iterations = rng.randint(2, 4)
    algo = _config(name, num_runners, rng.randrange(2**31)).build()
    if not program.kills and rng.random() < 0.5:
        sim = tray.simtest.cluster()
        victim = algo.env_runner_group.runners[rng.randint(1, num_runners)]

        def kill_runner(tries_left: int = 20) -> None:
            try:
                sim.kill_actor_worker(victim)
            except tray.exceptions.TrayError:  # the GCS is restarting: a little later
                if tries_left:
                    sim.at(0.1, lambda: kill_runner(tries_left - 1))
        sim.at(rng.uniform(0.05, 0.5), kill_runner)
    try:
        results = [algo.train() for _ in range(iterations)]
    finally:
        algo.stop()
        del algo
        gc.collect()  # its refs are freed here, in a deterministic order
    last = results[-1]
    faults = last["fault_tolerance"]
    returns = [r["env_runners"]["episode_return_mean"] for r in results]
    summary = {
        "iterations": [r["training_iteration"] for r in results],
        "every iteration sampled its batch": all(
            r["env_runners"]["num_env_steps_sampled"] >= BATCH for r in results),
        "trained what was sampled": last["num_env_steps_trained_lifetime"] ==
        last["num_env_steps_sampled_lifetime"],
        "lifetime adds up": last["num_env_steps_sampled_lifetime"] == sum(
            r["env_runners"]["num_env_steps_sampled"] for r in results),
        "runners healthy": faults["num_healthy_workers"] == num_runners,
        "restarts match losses": faults["num_remote_worker_restarts"] ==
        faults["num_lost_sample_requests"] - faults["num_lost_results"],
        "returns finite and plausible": all(math.isfinite(x) and x >= 8.0 for x in returns),
    }
    expected = {key: True for key in summary}
    expected["iterations"] = list(range(1, iterations + 1))
    program.expect(tray.put(summary), expected,
                   label=f"{name} with {num_runners} env runner(s), {iterations} iterations")


WORKLOADS = {"rllib": rllib}
