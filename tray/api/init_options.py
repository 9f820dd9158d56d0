"""The keywords of Ray's ``ray.init`` that are not about which cluster to
start: logging, ``log_to_driver``, ``local_mode``, and the private ones Ray
programs pass (``_temp_dir``, ``_system_config``, ``_node_ip_address``).

A Ray program passes them all the time, so ``tray.init`` takes every one:
it honours what tray has (the ``tray`` logger's level and format; the
worker output a cluster started by ``init`` sends to this terminal; the
directory its session lives in), and for the rest logs one warning that
says what tray does instead (docs/differences.md lists them)."""

from __future__ import annotations

import logging

logger = logging.getLogger("tray")

# Ray's default format for its own logger (``ray._private.ray_constants``).
LOGGING_FORMAT = "%(asctime)s\t%(levelname)s %(filename)s:%(lineno)s -- %(message)s"
LOOPBACK = ("127.0.0.1", "localhost", "::1")


class RayInitOptions:
    """What ``init`` was given of Ray's other keywords, checked."""

    def __init__(self, *, configure_logging: bool = True, logging_level=None,
                 logging_format: str | None = None, logging_config=None,
                 log_to_driver: bool | None = None, local_mode: bool = False,
                 private: dict | None = None) -> None:
        private = dict(private or {})
        if logging_config is not None and logging_level is None:
            logging_level = getattr(logging_config, "log_level", None)
        # Ray configures its logger on every init (INFO by default); tray's
        # stays as Python's logging left it unless a level or format is given.
        self.configure_logging = bool(configure_logging) and (
            logging_level is not None or logging_format is not None)
        self.logging_level = logging.INFO if logging_level is None else _level(logging_level)
        if logging_format is not None and not isinstance(logging_format, str):
            raise TypeError(f"logging_format must be a string, got {logging_format!r}")
        self.logging_format = logging_format
        self.log_to_driver = True if log_to_driver is None else bool(log_to_driver)
        self.temp_dir = private.pop("_temp_dir", None)
        if self.temp_dir is not None and not isinstance(self.temp_dir, str):
            raise TypeError(f"_temp_dir must be a path (a string), got {self.temp_dir!r}")
        self.warnings: list[str] = []
        if local_mode:
            self.warnings.append(
                "local_mode=True is ignored: tray has no local mode (Ray deprecated it); "
                "tasks run in worker processes. backend='sim' runs the whole cluster in "
                "this process, deterministically")
        system_config = private.pop("_system_config", None)
        if system_config:
            if not isinstance(system_config, dict):
                raise TypeError(f"_system_config must be a dict, got {system_config!r}")
            self.warnings.append(
                f"_system_config is ignored ({', '.join(sorted(map(str, system_config)))}): "
                "tray reads its settings from RAY_*/TRAY_* environment variables where the "
                "cluster starts")
        node_ip = private.pop("_node_ip_address", None)
        if node_ip is not None and node_ip not in LOOPBACK:
            self.warnings.append(
                f"_node_ip_address={node_ip!r} is ignored: a cluster started by tray.init() "
                "listens on 127.0.0.1 (start nodes with 'tray start' to listen elsewhere)")
        if logging_config is not None and getattr(logging_config, "encoding", "TEXT") != "TEXT":
            self.warnings.append("logging_config's encoding is ignored: tray's logs are text")
        if private:
            raise ValueError(f"unknown option(s) for tray.init(): {', '.join(sorted(private))}")

    def apply_logging(self) -> None:
        """As Ray's ``configure_logging=True``, when a level or format is
        given: the ``tray`` logger at ``logging_level`` (INFO if only a
        format is given), to stderr in ``logging_format`` (one handler, not
        one more per init)."""
        if not self.configure_logging:
            return
        logger.setLevel(self.logging_level)
        handler = next((h for h in logger.handlers if getattr(h, "_tray_init", False)), None)
        if handler is None:
            handler = logging.StreamHandler()
            handler._tray_init = True
            logger.addHandler(handler)
        handler.setFormatter(logging.Formatter(self.logging_format or LOGGING_FORMAT))

    def warn(self) -> None:
        for text in self.warnings:
            logger.warning("tray.init(): %s", text)


def split_private(options: dict) -> tuple[dict, dict]:
    """Ray's private ``init`` keywords (``_temp_dir`` & co.), and the rest:
    the backend's own options."""
    private = {k: v for k, v in options.items()
               if k in ("_temp_dir", "_system_config", "_node_ip_address")}
    return private, {k: v for k, v in options.items() if k not in private}


def _level(level) -> int:
    if isinstance(level, bool):
        raise TypeError(f"logging_level must be a level name or number, got {level!r}")
    if isinstance(level, int):
        return level
    if isinstance(level, str):
        number = logging.getLevelName(level.upper())
        if isinstance(number, int):
            return number
    raise ValueError(f"logging_level must be a level name (debug, info, warning, error, "
                     f"critical) or number, got {level!r}")
