"""``tray.job_config.JobConfig``: Ray's per-job settings, for ``tray.init(job_config=...)``.

Ray programs build a ``JobConfig`` and hand it to ``init``. tray takes the
same object and honours what it supports, as Ray does:

* ``ray_namespace`` is the job's namespace (``init(namespace=...)``, when
  given, wins, as in Ray);
* ``metadata`` is kept (``set_metadata`` adds to it) and is opaque to tray;
* ``default_actor_lifetime="non_detached"`` (the default) is accepted;
* ``runtime_env`` is the job's runtime environment (``tray.runtime_env``),
  checked when set; ``init(runtime_env=...)``, when given, replaces it.

What tray does not support raises NotImplementedError at ``init``, naming
the field, rather than being accepted and ignored: a non-empty
``jvm_options`` and
``code_search_path`` (tray runs Python only; workers import what the
driver can import), and ``default_actor_lifetime="detached"``.
"""

from __future__ import annotations

LIFETIMES = ("detached", "non_detached")


class JobConfig:
    """A job's configuration, with Ray's constructor and setters."""

    def __init__(self, jvm_options: list | None = None, code_search_path: list | None = None,
                 runtime_env: dict | None = None, _client_job: bool = False,
                 metadata: dict | None = None, ray_namespace: str | None = None,
                 default_actor_lifetime: str = "non_detached",
                 _disable_job_level_lineage_reconstruction: bool = False,
                 _py_driver_sys_path: list | None = None) -> None:
        self.jvm_options = list(jvm_options or [])
        if not isinstance(code_search_path or [], (list, tuple)):
            raise TypeError(f"The type of code search path is incorrect: "
                            f"{type(code_search_path)}")
        self.code_search_path = list(code_search_path or [])
        self._client_job = _client_job
        self.metadata = dict(metadata or {})
        self.ray_namespace = None
        if ray_namespace is not None:
            self.set_ray_namespace(ray_namespace)
        self.set_runtime_env(runtime_env)
        self.set_default_actor_lifetime(default_actor_lifetime)
        self._disable_job_level_lineage_reconstruction = \
            _disable_job_level_lineage_reconstruction
        self._py_driver_sys_path = list(_py_driver_sys_path or [])

    # --------------------------------------------------------------- setters

    def set_metadata(self, key: str, value: str) -> None:
        self.metadata[key] = value

    def set_runtime_env(self, runtime_env: dict | None, validate: bool = False) -> None:
        if runtime_env is not None and not isinstance(runtime_env, dict):
            raise TypeError(f"runtime_env must be a dict, got {type(runtime_env).__name__}")
        from .runtime_env import validate as validate_runtime_env

        validate_runtime_env(runtime_env)
        self.runtime_env = dict(runtime_env or {})

    def set_ray_namespace(self, ray_namespace: str) -> None:
        if not isinstance(ray_namespace, str):
            raise TypeError(f"ray_namespace must be a string, got "
                            f"{type(ray_namespace).__name__}")
        self.ray_namespace = ray_namespace

    def set_default_actor_lifetime(self, default_actor_lifetime: str) -> None:
        if default_actor_lifetime not in LIFETIMES:
            raise ValueError("Default actor lifetime must be one of `detached`, `non_detached`")
        self.default_actor_lifetime = default_actor_lifetime

    # ---------------------------------------------------------------- other

    @classmethod
    def from_json(cls, job_config_json: dict) -> JobConfig:
        """A JobConfig from the dict form Ray's job submission uses."""
        return cls(jvm_options=job_config_json.get("jvm_options"),
                   code_search_path=job_config_json.get("code_search_path"),
                   runtime_env=job_config_json.get("runtime_env"),
                   metadata=job_config_json.get("metadata"),
                   ray_namespace=job_config_json.get("ray_namespace"),
                   default_actor_lifetime=job_config_json.get("default_actor_lifetime",
                                                              "non_detached"))

    def check_supported(self) -> None:
        """Raise NotImplementedError for what tray would otherwise ignore."""
        unsupported = []
        if self.jvm_options:
            unsupported.append("jvm_options (tray runs Python only)")
        if self.code_search_path:
            unsupported.append("code_search_path (workers import what the driver can "
                               "import; put the code on the driver's sys.path)")
        if self._py_driver_sys_path:
            unsupported.append("_py_driver_sys_path (workers get the driver's sys.path)")
        if self.default_actor_lifetime == "detached":
            unsupported.append("default_actor_lifetime='detached' (pass lifetime='detached' "
                               "to each actor that should outlive the job)")
        if unsupported:
            raise NotImplementedError("tray.init(job_config=...): not supported yet: " +
                                      "; ".join(unsupported))

    def __repr__(self) -> str:
        return (f"JobConfig(ray_namespace={self.ray_namespace!r}, metadata={self.metadata!r}, "
                f"runtime_env={self.runtime_env!r}, "
                f"default_actor_lifetime={self.default_actor_lifetime!r})")
