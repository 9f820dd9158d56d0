"""AlgorithmConfig: RLlib's builder of an algorithm's settings.

Each section method (``environment``, ``env_runners``, ``training``,
``learners``, ``resources``, ``fault_tolerance``, ``debugging``,
``evaluation``, ``multi_agent``, ``offline_data``, ``reporting``) sets what
it is given and returns the config, so calls chain; ``build()`` (or
``build_algo()``) validates and returns the Algorithm. Names and defaults
are RLlib 2.x's (new API stack); ``api_stack()`` and ``framework("torch")``
are accepted so that RLlib programs run unchanged. A wrong value raises
``ValueError`` naming the setting, at the call or at ``validate()``."""

from __future__ import annotations

import copy as copy_module

from tray.rllib.core.rl_module import DEFAULT_MODULE_ID, RLModuleSpec

DEFAULT_MODEL_CONFIG = {"fcnet_hiddens": [256, 256], "fcnet_activation": "tanh",
                        "vf_share_layers": False}
BATCH_MODES = ("truncate_episodes", "complete_episodes")


class _NotProvided:
    def __repr__(self) -> str:
        return "NotProvided"


NotProvided = _NotProvided()


def _default_mapping_fn(agent_id, episode=None, **kwargs) -> str:
    return DEFAULT_MODULE_ID


def _positive_int(name: str, value, *, zero: bool = False) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < (0 if zero else 1):
        raise ValueError(f"{name} must be {'a non-negative' if zero else 'a positive'} "
                         f"integer, got {value!r}")
    return value


def _positive_float(name: str, value, *, zero: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or \
            value < 0 or (value == 0 and not zero):
        raise ValueError(f"{name} must be a {'non-negative' if zero else 'positive'} number, "
                         f"got {value!r}")
    return float(value)


class AlgorithmConfig:
    """Settings of an algorithm; subclasses (PPOConfig, ...) add their own."""

    algo_class = None

    def __init__(self, algo_class=None) -> None:
        if algo_class is not None:
            self.algo_class = algo_class
        # environment
        self.env = None
        self.env_config: dict = {}
        self.observation_space = None
        self.action_space = None
        # env runners
        self.num_env_runners = 0
        self.num_envs_per_env_runner = 1
        self.rollout_fragment_length: int | str = "auto"
        self.batch_mode = "truncate_episodes"
        self.sample_timeout_s = 60.0
        self.num_cpus_per_env_runner = 1
        self.explore = True
        # training
        self.lr = 0.001
        self.gamma = 0.99
        self.train_batch_size = 4000
        self.train_batch_size_per_learner = None
        self.minibatch_size = None
        self.num_epochs = 1
        self.grad_clip = None
        self.model: dict = dict(DEFAULT_MODEL_CONFIG)
        # learners and resources
        self.num_learners = 0
        self.num_cpus_per_learner = 1
        self.num_gpus_per_learner = 0
        self.num_cpus_for_main_process = 1
        self.torch_num_threads = 1
        # fault tolerance
        self.restart_failed_env_runners = True
        self.ignore_env_runner_failures = False
        self.max_num_env_runner_restarts = 1000
        self.num_consecutive_env_runner_failures_tolerance = 100
        # debugging
        self.seed = None
        self.log_level = "WARN"
        # evaluation
        self.evaluation_interval = None
        self.evaluation_duration = 10
        self.evaluation_duration_unit = "episodes"
        self.evaluation_num_env_runners = 0
        self.evaluation_config: dict = {"explore": False}
        # multi-agent
        self.policies: dict | None = None
        self.policy_mapping_fn = _default_mapping_fn
        self.policies_to_train = None
        # offline data
        self.output = None
        self.output_format = "json"
        self.input_ = None
        self.offline_max_rows = 2_000_000
        # reporting
        self.metrics_num_episodes_for_smoothing = 100
        self.min_sample_timesteps_per_iteration = 0
        self.framework_str = "torch"

    # ------------------------------------------------------------ sections

    def environment(self, env=NotProvided, *, env_config=NotProvided,
                    observation_space=NotProvided, action_space=NotProvided):
        if env is not NotProvided:
            self.env = env
        if env_config is not NotProvided:
            if not isinstance(env_config, dict):
                raise ValueError(f"env_config must be a dict, got {type(env_config).__name__}")
            self.env_config = dict(env_config)
        if observation_space is not NotProvided:
            self.observation_space = observation_space
        if action_space is not NotProvided:
            self.action_space = action_space
        return self

    def env_runners(self, *, num_env_runners=NotProvided, num_envs_per_env_runner=NotProvided,
                    rollout_fragment_length=NotProvided, batch_mode=NotProvided,
                    sample_timeout_s=NotProvided, num_cpus_per_env_runner=NotProvided,
                    explore=NotProvided):
        if num_env_runners is not NotProvided:
            self.num_env_runners = _positive_int("num_env_runners", num_env_runners, zero=True)
        if num_envs_per_env_runner is not NotProvided:
            self.num_envs_per_env_runner = _positive_int("num_envs_per_env_runner",
                                                         num_envs_per_env_runner)
        if rollout_fragment_length is not NotProvided:
            if rollout_fragment_length != "auto":
                _positive_int("rollout_fragment_length", rollout_fragment_length)
            self.rollout_fragment_length = rollout_fragment_length
        if batch_mode is not NotProvided:
            if batch_mode not in BATCH_MODES:
                raise ValueError(f"batch_mode must be one of {BATCH_MODES}, got {batch_mode!r}")
            self.batch_mode = batch_mode
        if sample_timeout_s is not NotProvided:
            self.sample_timeout_s = _positive_float("sample_timeout_s", sample_timeout_s)
        if num_cpus_per_env_runner is not NotProvided:
            self.num_cpus_per_env_runner = _positive_float(
                "num_cpus_per_env_runner", num_cpus_per_env_runner, zero=True)
        if explore is not NotProvided:
            self.explore = bool(explore)
        return self

    def training(self, *, lr=NotProvided, gamma=NotProvided, train_batch_size=NotProvided,
                 train_batch_size_per_learner=NotProvided, minibatch_size=NotProvided,
                 num_epochs=NotProvided, grad_clip=NotProvided, model=NotProvided):
        if lr is not NotProvided:
            self.lr = _positive_float("lr", lr)
        if gamma is not NotProvided:
            if isinstance(gamma, bool) or not isinstance(gamma, int | float) or \
                    not 0.0 <= gamma <= 1.0:
                raise ValueError(f"gamma must be within [0, 1], got {gamma!r}")
            self.gamma = float(gamma)
        if train_batch_size is not NotProvided:
            self.train_batch_size = _positive_int("train_batch_size", train_batch_size)
        if train_batch_size_per_learner is not NotProvided:
            self.train_batch_size_per_learner = _positive_int(
                "train_batch_size_per_learner", train_batch_size_per_learner)
        if minibatch_size is not NotProvided:
            self.minibatch_size = None if minibatch_size is None else \
                _positive_int("minibatch_size", minibatch_size)
        if num_epochs is not NotProvided:
            self.num_epochs = _positive_int("num_epochs", num_epochs)
        if grad_clip is not NotProvided:
            self.grad_clip = None if grad_clip is None else _positive_float("grad_clip",
                                                                            grad_clip)
        if model is not NotProvided:
            self._set_model(model)
        return self

    def rl_module(self, *, model_config=NotProvided, rl_module_spec=NotProvided):
        """The new stack's place for the model config (a dict)."""
        if model_config is not NotProvided:
            self._set_model(model_config)
        if rl_module_spec is not NotProvided and rl_module_spec is not None:
            self._set_model(getattr(rl_module_spec, "model_config", None) or {})
        return self

    def _set_model(self, model) -> None:
        if not isinstance(model, dict):
            model = dict(vars(model)) if hasattr(model, "__dict__") else model
        if not isinstance(model, dict):
            raise ValueError(f"model config must be a dict, got {type(model).__name__}")
        self.model = {**self.model, **model}

    def learners(self, *, num_learners=NotProvided, num_cpus_per_learner=NotProvided,
                 num_gpus_per_learner=NotProvided):
        if num_learners is not NotProvided:
            self.num_learners = _positive_int("num_learners", num_learners, zero=True)
        if num_cpus_per_learner is not NotProvided:
            self.num_cpus_per_learner = 1 if num_cpus_per_learner == "auto" else \
                _positive_float("num_cpus_per_learner", num_cpus_per_learner, zero=True)
        if num_gpus_per_learner is not NotProvided:
            self.num_gpus_per_learner = _positive_float("num_gpus_per_learner",
                                                        num_gpus_per_learner, zero=True)
        return self

    def resources(self, *, num_cpus_for_main_process=NotProvided, num_gpus=NotProvided,
                  torch_num_threads=NotProvided):
        if num_cpus_for_main_process is not NotProvided:
            self.num_cpus_for_main_process = _positive_float(
                "num_cpus_for_main_process", num_cpus_for_main_process, zero=True)
        if num_gpus is not NotProvided:
            self.num_gpus_per_learner = _positive_float("num_gpus", num_gpus, zero=True)
        if torch_num_threads is not NotProvided:
            self.torch_num_threads = _positive_int("torch_num_threads", torch_num_threads)
        return self

    def fault_tolerance(self, *, restart_failed_env_runners=NotProvided,
                        ignore_env_runner_failures=NotProvided,
                        max_num_env_runner_restarts=NotProvided,
                        num_consecutive_env_runner_failures_tolerance=NotProvided):
        if restart_failed_env_runners is not NotProvided:
            self.restart_failed_env_runners = bool(restart_failed_env_runners)
        if ignore_env_runner_failures is not NotProvided:
            self.ignore_env_runner_failures = bool(ignore_env_runner_failures)
        if max_num_env_runner_restarts is not NotProvided:
            self.max_num_env_runner_restarts = _positive_int(
                "max_num_env_runner_restarts", max_num_env_runner_restarts, zero=True)
        if num_consecutive_env_runner_failures_tolerance is not NotProvided:
            self.num_consecutive_env_runner_failures_tolerance = _positive_int(
                "num_consecutive_env_runner_failures_tolerance",
                num_consecutive_env_runner_failures_tolerance)
        return self

    def debugging(self, *, seed=NotProvided, log_level=NotProvided):
        if seed is not NotProvided:
            if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
                raise ValueError(f"seed must be an integer or None, got {seed!r}")
            self.seed = seed
        if log_level is not NotProvided:
            self.log_level = log_level
        return self

    def evaluation(self, *, evaluation_interval=NotProvided, evaluation_duration=NotProvided,
                   evaluation_duration_unit=NotProvided, evaluation_num_env_runners=NotProvided,
                   evaluation_config=NotProvided):
        if evaluation_interval is not NotProvided:
            self.evaluation_interval = None if evaluation_interval in (None, 0) else \
                _positive_int("evaluation_interval", evaluation_interval)
        if evaluation_duration is not NotProvided:
            self.evaluation_duration = _positive_int("evaluation_duration", evaluation_duration)
        if evaluation_duration_unit is not NotProvided:
            if evaluation_duration_unit not in ("episodes", "timesteps"):
                raise ValueError(f"evaluation_duration_unit must be 'episodes' or "
                                 f"'timesteps', got {evaluation_duration_unit!r}")
            self.evaluation_duration_unit = evaluation_duration_unit
        if evaluation_num_env_runners is not NotProvided:
            self.evaluation_num_env_runners = _positive_int(
                "evaluation_num_env_runners", evaluation_num_env_runners, zero=True)
        if evaluation_config is not NotProvided:
            self.evaluation_config = {"explore": False, **dict(evaluation_config or {})}
        return self

    def multi_agent(self, *, policies=NotProvided, policy_mapping_fn=NotProvided,
                    policies_to_train=NotProvided):
        if policies is not NotProvided:
            if isinstance(policies, list | tuple | set):
                policies = {pid: None for pid in sorted(policies, key=str)}
            if not isinstance(policies, dict) or not policies:
                raise ValueError(f"policies must be a non-empty set or dict of policy ids, "
                                 f"got {policies!r}")
            self.policies = dict(policies)
        if policy_mapping_fn is not NotProvided:
            if not callable(policy_mapping_fn):
                raise ValueError("policy_mapping_fn must be callable: "
                                 "(agent_id, episode, **kwargs) -> policy id")
            self.policy_mapping_fn = policy_mapping_fn
        if policies_to_train is not NotProvided:
            self.policies_to_train = None if policies_to_train is None else \
                list(policies_to_train)
        return self

    def offline_data(self, *, output=NotProvided, output_format=NotProvided,
                     input_=NotProvided, max_rows=NotProvided):
        from ..offline.io import FORMATS

        if output is not NotProvided:
            self.output = output
        if output_format is not NotProvided:
            if output_format not in FORMATS:
                raise ValueError(f"output_format must be one of {FORMATS}, got "
                                 f"{output_format!r}")
            self.output_format = output_format
        if input_ is not NotProvided:
            self.input_ = input_
        if max_rows is not NotProvided:
            self.offline_max_rows = _positive_int("max_rows", max_rows)
        return self

    def reporting(self, *, metrics_num_episodes_for_smoothing=NotProvided,
                  min_sample_timesteps_per_iteration=NotProvided):
        if metrics_num_episodes_for_smoothing is not NotProvided:
            self.metrics_num_episodes_for_smoothing = _positive_int(
                "metrics_num_episodes_for_smoothing", metrics_num_episodes_for_smoothing)
        if min_sample_timesteps_per_iteration is not NotProvided:
            self.min_sample_timesteps_per_iteration = _positive_int(
                "min_sample_timesteps_per_iteration", min_sample_timesteps_per_iteration,
                zero=True)
        return self

    def framework(self, framework=NotProvided, **_ignored):
        if framework is not NotProvided:
            if framework != "torch":
                raise ValueError(f"tray.rllib supports framework='torch' only, got "
                                 f"{framework!r}")
            self.framework_str = framework
        return self

    def api_stack(self, *, enable_rl_module_and_learner=True,
                  enable_env_runner_and_connector_v2=True):
        """tray.rllib has only RLlib's new API stack."""
        if not (enable_rl_module_and_learner and enable_env_runner_and_connector_v2):
            raise ValueError("tray.rllib implements only RLlib's new API stack "
                             "(RLModule, Learner, EnvRunner)")
        return self

    # ----------------------------------------------------------- derived

    @property
    def is_multi_agent(self) -> bool:
        if self.policies is not None:
            return True
        from ..env.multi_agent_env import MultiAgentEnv

        return isinstance(self.env, type) and issubclass(self.env, MultiAgentEnv)

    @property
    def total_train_batch_size(self) -> int:
        if self.train_batch_size_per_learner is not None:
            return self.train_batch_size_per_learner * max(1, self.num_learners)
        return self.train_batch_size

    def get_rollout_fragment_length(self) -> int:
        if self.rollout_fragment_length != "auto":
            return int(self.rollout_fragment_length)
        runners = max(1, self.num_env_runners) * self.num_envs_per_env_runner
        return max(1, -(-self.total_train_batch_size // runners))

    def get_minibatch_size(self) -> int:
        return self.minibatch_size or self.total_train_batch_size

    def module_spec(self, observation_space, action_space) -> RLModuleSpec:
        return RLModuleSpec(observation_space, action_space, dict(self.model))

    def validate(self) -> None:
        if self.env is None and self.input_ is None:
            raise ValueError("no environment: call config.environment(env=...) with a "
                             "gymnasium id, a registered name, an env class or a creator")
        if self.framework_str != "torch":
            raise ValueError("tray.rllib supports framework='torch' only")
        if self.minibatch_size is not None and self.minibatch_size > self.total_train_batch_size:
            raise ValueError(f"minibatch_size ({self.minibatch_size}) must be <= the train "
                             f"batch size ({self.total_train_batch_size})")
        if self.output is not None and self.input_ is not None and self.output == self.input_:
            raise ValueError("offline_data output and input_ must differ")
        if self.policies is not None and self.policy_mapping_fn is _default_mapping_fn and \
                DEFAULT_MODULE_ID not in self.policies:
            raise ValueError(f"multi_agent(policies={sorted(self.policies, key=str)}) needs a "
                             f"policy_mapping_fn (agent_id, episode, **kw) -> policy id")
        RLModuleSpec(model_config=dict(self.model)).hiddens()
        RLModuleSpec(model_config=dict(self.model)).activation()

    # ------------------------------------------------------------ copies

    def copy(self, copy_frozen: bool | None = None) -> AlgorithmConfig:
        return copy_module.deepcopy(self)

    def to_dict(self) -> dict:
        return {key: value for key, value in vars(self).items() if not key.startswith("_")}

    def update_from_dict(self, values: dict) -> AlgorithmConfig:
        """Set attributes by name (Tune's param_space uses this)."""
        for key, value in values.items():
            if key == "model":
                self._set_model(value)
            elif not hasattr(self, key):
                raise ValueError(f"{type(self).__name__} has no setting {key!r}")
            else:
                setattr(self, key, value)
        return self

    def get(self, key: str, default=None):
        return getattr(self, key, default)

    def __getitem__(self, key: str):
        return getattr(self, key)

    # ------------------------------------------------------------- build

    def build_algo(self, env=None):
        if env is not None:
            self.environment(env)
        if self.algo_class is None:
            raise ValueError(f"{type(self).__name__} has no algorithm class to build")
        return self.algo_class(config=self.copy())

    def build(self, env=None):
        return self.build_algo(env)
