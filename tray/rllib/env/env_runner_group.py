"""The EnvRunnerGroup: the env runner actors of an algorithm, how they are
asked to sample, and what happens when one fails.

Sampling is synchronous (``sample``: every healthy runner samples one
fragment per round, rounds repeat until the train batch is full; PPO, PG)
or asynchronous (``submit``/``fetch_ready``: every runner always has a
request in flight and the algorithm takes whatever arrives; APPO).

Fault tolerance (``config.fault_tolerance``), as RLlib's:

* ``restart_failed_env_runners=True`` (the default): runner actors are
  created with ``max_restarts``; a request that fails because the runner
  died is counted as lost (``num_lost_sample_requests``; the episodes it was
  running, ``num_envs_per_env_runner`` of them, as ``num_faulty_episodes``),
  and the runner is asked again once tray has restarted it. A runner whose
  restarts are used up, or whose env raised, is replaced by a new actor with
  the same index. Synchronous sampling keeps going until the batch is full,
  so an iteration's env steps do not shrink with a failure.
* ``ignore_env_runner_failures=True`` (and no restarts): a failed runner is
  dropped and the others carry on.
* neither: the failure propagates out of ``train()`` as
  :class:`EnvRunnerFailedError` with the runner's error as ``__cause__``.

``num_consecutive_env_runner_failures_tolerance`` bounds how often one
runner may fail in a row before the group gives up (an env that raises on
every step would otherwise be restarted forever).

Requests that miss ``sample_timeout_s`` are abandoned (their results, when
they come, are dropped) and counted in ``num_timed_out_sample_requests``; a
runner that misses it twice in a row counts as failed, as above (a runner
that is alive but never answers would otherwise stall training forever)."""

from __future__ import annotations

from dataclasses import dataclass

from tray.rllib.core.rl_module import DEFAULT_MODULE_ID

SYNC_ROUNDS_MAX = 10_000  # a sampling loop that cannot fill its batch stops, loudly
ABANDONED_MAX = 1_000  # timed-out requests remembered; older ones are forgotten
# A runner that misses sample_timeout_s this many times in a row is treated
# as failed (replaced, if restarts are on): alive or not, it does not sample.
TIMEOUTS_BEFORE_REPLACING = 2


class EnvRunnerFailedError(RuntimeError):
    """An env runner failed and the fault-tolerance settings say to stop."""


class SampleTimeoutError(TimeoutError):
    """An env runner kept missing ``sample_timeout_s``."""


@dataclass(frozen=True)
class EnvRunnerGroupStatistics:
    num_env_runners: int
    num_healthy_env_runners: int
    num_remote_worker_restarts: int
    num_lost_sample_requests: int
    num_lost_results: int
    num_faulty_episodes: int
    num_timed_out_sample_requests: int
    num_in_flight_requests: int


def _fault_errors():
    from tray import exceptions

    return (exceptions.ActorError, exceptions.WorkerCrashedError, exceptions.NodeDiedError,
            exceptions.ObjectLostError, exceptions.TaskError)


def _describe(error: BaseException) -> str:
    """The user's own exception for an error raised by the env, else the error."""
    cause = getattr(error, "cause", None)
    if isinstance(cause, BaseException):
        return f"{type(cause).__name__}: {str(cause)[:300]}"
    return f"{type(error).__name__}: {str(error)[:300]}"


class EnvRunnerGroup:
    def __init__(self, config, module_specs: dict, *, num_env_runners: int | None = None,
                 evaluation: bool = False) -> None:
        from .env_runner import SingleAgentEnvRunner
        from .multi_agent_env_runner import MultiAgentEnvRunner

        self.config = config
        self.module_specs = module_specs
        self.evaluation = evaluation
        self.runner_class = MultiAgentEnvRunner if config.is_multi_agent else \
            SingleAgentEnvRunner
        self.num_env_runners = config.num_env_runners if num_env_runners is None else \
            num_env_runners
        self.local_runner = None
        self.runners: dict[int, object] = {}
        self.healthy: dict[int, bool] = {}
        self.consecutive_failures: dict[int, int] = {}
        self.consecutive_timeouts: dict[int, int] = {}
        self.inflight: dict = {}  # ref -> runner index (async sampling)
        self.abandoned: list = []  # timed-out refs, dropped
        self.num_restarts = 0
        self.num_lost_requests = 0
        self.num_faulty_episodes = 0
        self.num_timed_out = 0
        self.num_lost_results = 0
        if self.num_env_runners == 0:
            self.local_runner = self._construct_local()
        else:
            for index in range(1, self.num_env_runners + 1):
                self.runners[index] = self._make_actor(index)
                self.healthy[index] = True
                self.consecutive_failures[index] = 0
                self.consecutive_timeouts[index] = 0

    def _specs_arg(self):
        return self.module_specs if self.config.is_multi_agent else \
            self.module_specs.get(DEFAULT_MODULE_ID)

    def _construct_local(self):
        if self.config.is_multi_agent:
            return self.runner_class(self.config, 0, 0, self.module_specs, self.evaluation)
        return self.runner_class(self.config, 0, 0, self._specs_arg(), self.evaluation)

    def _make_actor(self, index: int):
        import tray

        config = self.config
        restarts = config.max_num_env_runner_restarts if config.restart_failed_env_runners \
            else 0
        from ..utils.packing import Packed

        remote_class = tray.remote(self.runner_class)
        return remote_class.options(
            num_cpus=config.num_cpus_per_env_runner, max_restarts=restarts,
            max_task_retries=0).remote(Packed(config), index, self.num_env_runners,
                                       Packed(self._specs_arg()), self.evaluation)

    # ------------------------------------------------------------ status

    def healthy_indices(self) -> list[int]:
        return [index for index in sorted(self.runners) if self.healthy[index]]

    def num_healthy_remote_workers(self) -> int:
        return len(self.healthy_indices())

    def statistics(self) -> EnvRunnerGroupStatistics:
        return EnvRunnerGroupStatistics(
            num_env_runners=self.num_env_runners,
            num_healthy_env_runners=len(self.healthy_indices()),
            num_remote_worker_restarts=self.num_restarts,
            num_lost_sample_requests=self.num_lost_requests,
            num_lost_results=self.num_lost_results,
            num_faulty_episodes=self.num_faulty_episodes,
            num_timed_out_sample_requests=self.num_timed_out,
            num_in_flight_requests=len(self.inflight))

    # ------------------------------------------------------ synchronous

    def sample(self, weights, version: int, *, num_timesteps: int | None = None,
               num_episodes: int | None = None, explore: bool | None = None,
               random_actions: bool = False, epsilon: float | None = None) -> list[dict]:
        """Sample until ``num_timesteps`` env steps (or ``num_episodes``
        episodes) have arrived; ``weights`` is a ref (or, for a local
        runner, the weights dict)."""
        if self.local_runner is not None:
            return self._sample_local(weights, version, num_timesteps, num_episodes, explore,
                                      random_actions, epsilon)
        import tray

        results: list[dict] = []
        steps = episodes = 0
        for _round in range(SYNC_ROUNDS_MAX):
            if num_timesteps is not None and steps >= num_timesteps:
                return results
            if num_episodes is not None and episodes >= num_episodes:
                return results
            indices = self.healthy_indices()
            if not indices:
                raise EnvRunnerFailedError("no healthy env runner is left to sample with "
                                           "(ignore_env_runner_failures dropped them all)")
            pending = {}
            for index in indices:
                kwargs = {"explore": explore, "random_actions": random_actions}
                if epsilon is not None:
                    kwargs["epsilon"] = epsilon
                if num_episodes is not None:
                    left = num_episodes - episodes
                    kwargs["num_episodes"] = max(1, -(-left // len(indices)))
                else:
                    kwargs["num_timesteps"] = self._fragment_steps()
                ref = self.runners[index].sample.remote([weights], version, **kwargs)
                pending[ref] = index
            ready, not_ready = tray.wait(list(pending), num_returns=len(pending),
                                         timeout=self.config.sample_timeout_s)
            for ref in not_ready:
                self.num_timed_out += 1
                self.abandoned.append(ref)
                index = pending[ref]
                self.consecutive_timeouts[index] += 1
                if self.consecutive_timeouts[index] >= TIMEOUTS_BEFORE_REPLACING:
                    self._on_failure(index, SampleTimeoutError(
                        f"env runner {index} missed sample_timeout_s="
                        f"{self.config.sample_timeout_s} {TIMEOUTS_BEFORE_REPLACING} times in "
                        f"a row"))
            del self.abandoned[:-ABANDONED_MAX]
            for ref in ready:
                index = pending[ref]
                try:
                    result = tray.get(ref)
                except _fault_errors() as error:
                    self._on_failure(index, error)
                    continue
                self.consecutive_failures[index] = 0
                self.consecutive_timeouts[index] = 0
                results.append(result)
                steps += result["env_steps"]
                episodes += len(result["episodes"])
            self._drop_finished_abandoned()
        raise EnvRunnerFailedError(f"sampling did not gather {num_timesteps or num_episodes} "
                                   f"{'steps' if num_timesteps else 'episodes'} in "
                                   f"{SYNC_ROUNDS_MAX} rounds")

    def _fragment_steps(self) -> int:
        return self.config.get_rollout_fragment_length() * self.config.num_envs_per_env_runner

    def _sample_local(self, weights, version, num_timesteps, num_episodes, explore,
                      random_actions, epsilon=None) -> list[dict]:
        results = []
        steps = episodes = 0
        for _round in range(SYNC_ROUNDS_MAX):
            if num_timesteps is not None and steps >= num_timesteps:
                break
            if num_episodes is not None and episodes >= num_episodes:
                break
            kwargs = {"explore": explore, "random_actions": random_actions}
            if epsilon is not None:
                kwargs["epsilon"] = epsilon
            if num_episodes is not None:
                kwargs["num_episodes"] = num_episodes - episodes
            else:
                kwargs["num_timesteps"] = self._fragment_steps()
            result = self.local_runner.sample([weights], version, **kwargs)
            results.append(result)
            steps += result["env_steps"]
            episodes += len(result["episodes"])
        return results

    # ------------------------------------------------------ asynchronous

    def submit(self, index: int, weights, version: int) -> None:
        ref = self.runners[index].sample.remote([weights], version,
                                                num_timesteps=self._fragment_steps())
        self.inflight[ref] = index

    def indices_without_request(self) -> list[int]:
        busy = set(self.inflight.values())
        return [index for index in self.healthy_indices() if index not in busy]

    def fetch_ready(self, timeout_s: float) -> list[dict]:
        """Results of the requests in flight that are ready: waits up to
        ``timeout_s`` for the first, then takes all that are ready."""
        if not self.inflight:
            return []
        import tray

        refs = list(self.inflight)
        ready, rest = tray.wait(refs, num_returns=1, timeout=timeout_s)
        if not ready:
            for ref in refs:  # nobody delivered within the timeout
                index = self.inflight[ref]
                self.num_timed_out += 1
                self.consecutive_timeouts[index] += 1
                if self.consecutive_timeouts[index] >= TIMEOUTS_BEFORE_REPLACING:
                    del self.inflight[ref]
                    self._on_failure(index, SampleTimeoutError(
                        f"env runner {index} delivered nothing within sample_timeout_s="
                        f"{self.config.sample_timeout_s} {TIMEOUTS_BEFORE_REPLACING} times in "
                        f"a row"))
            return []
        if ready and rest:
            more, _ = tray.wait(rest, num_returns=len(rest), timeout=0)
            ready += more
        # A dict, not a set: the refs' last holder when this returns may be
        # this, and a set lets them go (the driver frees their objects) in
        # the order of their hashes, which follows PYTHONHASHSEED.
        ready_set = dict.fromkeys(ready)
        results = []
        for ref in refs:  # in submission order: deterministic
            if ref not in ready_set:
                continue
            index = self.inflight.pop(ref)
            try:
                result = tray.get(ref)
            except _fault_errors() as error:
                self._on_failure(index, error)
                continue
            self.consecutive_failures[index] = 0
            self.consecutive_timeouts[index] = 0
            results.append(result)
        return results

    # ----------------------------------------------------------- failures

    def _on_failure(self, index: int, error: BaseException) -> None:
        from tray import exceptions

        self.num_lost_requests += 1
        if isinstance(error, exceptions.ObjectLostError) and \
                not isinstance(error, exceptions.OwnerDiedError):
            # The result was lost on its way (its node died), not the runner:
            # the runner keeps its envs and is simply asked again.
            self.num_lost_results += 1
            return
        self.num_faulty_episodes += int(self.config.num_envs_per_env_runner)
        config = self.config
        if not config.restart_failed_env_runners:
            if config.ignore_env_runner_failures:
                self.healthy[index] = False
                self._kill(index)
                return
            raise EnvRunnerFailedError(
                f"env runner {index} failed ({type(error).__name__}); set "
                f"fault_tolerance(restart_failed_env_runners=True) to restart it or "
                f"ignore_env_runner_failures=True to go on without it") from error
        self.consecutive_failures[index] += 1
        if self.consecutive_failures[index] > config.num_consecutive_env_runner_failures_tolerance:
            raise EnvRunnerFailedError(
                f"env runner {index} failed {self.consecutive_failures[index]} times in a row "
                f"(num_consecutive_env_runner_failures_tolerance="
                f"{config.num_consecutive_env_runner_failures_tolerance}); last error: "
                f"{_describe(error)}") from error
        self.num_restarts += 1
        if isinstance(error, exceptions.ActorUnavailableError):
            return  # tray is restarting the actor; its next request waits for it
        # Dead for good (restarts used up, or its owner's view says so), or
        # its env raised: a fresh actor with the same index.
        self._kill(index)
        self.runners[index] = self._make_actor(index)
        self.consecutive_timeouts[index] = 0

    def _kill(self, index: int) -> None:
        import tray

        try:
            tray.kill(self.runners[index])
        except Exception:  # noqa: BLE001 - already dead
            pass

    def _drop_finished_abandoned(self) -> None:
        if not self.abandoned:
            return
        import tray

        done, self.abandoned = tray.wait(self.abandoned, num_returns=len(self.abandoned),
                                         timeout=0)
        del done

    # ------------------------------------------------------------ others

    def foreach_env_runner(self, fn, *args) -> list:
        """``fn(runner, *args)`` on every healthy runner (or the local one)."""
        if self.local_runner is not None:
            return [fn(self.local_runner, *args)]
        import tray

        return tray.get([self.runners[i].apply.remote(fn, *args)
                         for i in self.healthy_indices()])

    def get_spaces(self) -> dict:
        if self.local_runner is not None:
            return self.local_runner.get_spaces()
        import tray

        return tray.get(self.runners[self.healthy_indices()[0]].get_spaces.remote())

    def stop(self) -> None:
        if self.local_runner is not None:
            self.local_runner.stop()
        self.inflight.clear()
        self.abandoned.clear()
        for index in sorted(self.runners):
            self._kill(index)
        self.runners.clear()
