"""``tray.init`` takes the keywords Ray programs pass to ``ray.init``:
logging, ``log_to_driver``, ``local_mode``, ``address="local"`` and the
private ``_temp_dir``/``_system_config``/``_node_ip_address``; it honours
what tray has and logs one warning for what it ignores."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap

import pytest
from conftest import BACKENDS

import tray

needs_local = pytest.mark.skipif("local" not in BACKENDS, reason="the local backend is not "
                                 "under test")


@pytest.fixture
def tray_logger():
    logger = logging.getLogger("tray")
    level, handlers = logger.level, list(logger.handlers)
    yield logger
    logger.setLevel(level)
    logger.handlers[:] = handlers


def _init(backend: str, **kwargs):
    if backend == "sim":
        return tray.init(backend="sim", num_cpus=1, **kwargs)
    return tray.init(num_cpus=1, include_dashboard=False, **kwargs)


@pytest.mark.parametrize("backend", BACKENDS)
def test_ray_keywords_are_taken_and_the_ignored_ones_said_once(backend, tray_logger, caplog):
    caplog.set_level(logging.WARNING, logger="tray")
    _init(backend, local_mode=True, configure_logging=True, logging_level="debug",
          logging_format="%(levelname)s|%(message)s", _system_config={"task_retry_delay_ms": 0},
          _node_ip_address="127.0.0.1")

    @tray.remote
    def double(x):
        return 2 * x

    assert tray.get(double.remote(21)) == 42
    assert tray_logger.level == logging.DEBUG
    init_handlers = [h for h in tray_logger.handlers if getattr(h, "_tray_init", False)]
    assert len(init_handlers) == 1
    assert init_handlers[0].formatter._fmt == "%(levelname)s|%(message)s"
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("tray.init():")]
    assert len([s for s in said if "local_mode=True is ignored" in s]) == 1
    assert len([s for s in said if "_system_config is ignored (task_retry_delay_ms)" in s]) == 1
    assert not [s for s in said if "_node_ip_address" in s]  # loopback: what tray does anyway


def test_a_second_init_adds_no_second_handler(tray_logger):
    for level in ("warning", logging.ERROR):
        _init("sim", logging_level=level)
        tray.shutdown()
    assert tray_logger.level == logging.ERROR
    assert len([h for h in tray_logger.handlers if getattr(h, "_tray_init", False)]) == 1


def test_without_a_level_or_format_the_logger_is_left_alone(tray_logger):
    before = (tray_logger.level, list(tray_logger.handlers))
    _init("sim", configure_logging=True)
    assert (tray_logger.level, list(tray_logger.handlers)) == before
    tray.shutdown()
    _init("sim", configure_logging=False, logging_level="debug")
    assert (tray_logger.level, list(tray_logger.handlers)) == before


@pytest.mark.parametrize("bad, error", [
    ({"logging_level": "loud"}, ValueError), ({"logging_level": True}, TypeError),
    ({"logging_format": 3}, TypeError), ({"_system_config": [1]}, TypeError),
    ({"_temp_dir": 5}, TypeError), ({"_no_such_option": 1}, ValueError),
])
def test_bad_values_fail_init_with_a_clear_error(bad, error, tray_logger):
    with pytest.raises(error, match=next(iter(bad)).lstrip("_") if error is TypeError
                       else "logging_level|_no_such_option"):
        _init("sim", **bad)
    assert not tray.is_initialized()


def test_a_non_loopback_node_ip_is_said_to_be_ignored(tray_logger, caplog):
    caplog.set_level(logging.WARNING, logger="tray")
    _init("sim", _node_ip_address="10.1.2.3")
    assert any("_node_ip_address='10.1.2.3' is ignored" in r.getMessage()
               for r in caplog.records)


def _run_driver(init_kwargs: str, tmp_path, **env) -> subprocess.CompletedProcess:
    program = textwrap.dedent(f"""
        import tray
        ctx = tray.init(num_cpus=1, include_dashboard=False, {init_kwargs})
        print("SESSION", ctx.address_info.get("session_dir"), flush=True)

        @tray.remote
        def speak():
            print("a worker speaks", flush=True)
            return 7

        assert tray.get(speak.remote()) == 7
        tray.shutdown()
    """)
    return subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path, env={**os.environ, **env})


@needs_local
def test_log_to_driver_false_keeps_worker_output_in_the_log_files(tmp_path):
    loud = _run_driver("", tmp_path)
    assert loud.returncode == 0, loud.stderr
    assert "a worker speaks" in loud.stdout
    root = tempfile.mkdtemp(prefix="tray-kw-", dir="/tmp")  # (sockets: a short path)
    try:
        quiet = _run_driver(f"log_to_driver=False, _temp_dir={root!r}", tmp_path)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    assert quiet.returncode == 0, quiet.stderr
    assert "a worker speaks" not in quiet.stdout + quiet.stderr
    session = quiet.stdout.split("SESSION ", 1)[1].split()[0]
    assert session.startswith(root + os.sep)  # _temp_dir honoured
    logs = os.path.join(session, "logs")
    if os.path.isdir(logs):  # (removed with the session at shutdown, unless kept)
        text = "".join(open(os.path.join(logs, name)).read() for name in os.listdir(logs))
        assert "a worker speaks" in text


@needs_local
def test_address_local_starts_a_new_cluster_whatever_tray_address_names(tmp_path):
    # Nothing listens at port 1: joining it would fail.
    result = _run_driver("address='local'", tmp_path, TRAY_ADDRESS="127.0.0.1:1")
    assert result.returncode == 0, result.stderr
    assert "a worker speaks" in result.stdout


@needs_local
def test_a_temp_dir_too_long_for_the_sockets_is_refused_with_the_limit():
    with pytest.raises(ValueError, match="too long: the cluster's unix sockets"):
        _init("local", _temp_dir="/tmp/" + "d" * 80)
    assert not tray.is_initialized()
