"""Runtime environments on real processes (local backend): working_dir and
py_modules shipped to workers, pip environments built once per node from a
tiny wheel made here (no test reaches a package index), and what a failed
setup fails."""

from __future__ import annotations

import base64
import hashlib
import os
import zipfile

import pytest

import tray
from tray.exceptions import RuntimeEnvSetupError


def _write(path, text: str) -> str:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as handle:
        handle.write(text)
    return str(path)


def _wheel(directory, name: str, version: str, source: str) -> str:
    """A pure-Python wheel holding module ``name`` (``source``), built by hand."""
    dist = f"{name}-{version}.dist-info"
    files = {
        f"{name}/__init__.py": source.encode(),
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
        f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: tray-tests\nRoot-Is-Purelib: true\n"
                         b"Tag: py3-none-any\n",
    }
    record = []
    for path, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(data)}")
    record.append(f"{dist}/RECORD,,")
    files[f"{dist}/RECORD"] = ("\n".join(record) + "\n").encode()
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, f"{name}-{version}-py3-none-any.whl")
    with zipfile.ZipFile(path, "w") as archive:
        for member, data in files.items():
            archive.writestr(member, data)
    return path


def test_working_dir_is_cwd_and_first_on_sys_path(tmp_path):
    root = tmp_path / "project"
    _write(root / "shipped_helper_wd.py", "ANSWER = 42\n")
    _write(root / "data" / "config.txt", "from the working dir\n")
    _write(root / "logs" / "huge.log", "x" * 1000)
    tray.init(num_cpus=2, runtime_env={"working_dir": str(root), "excludes": ["logs/"]})

    @tray.remote
    def probe():
        import sys

        import shipped_helper_wd

        with open("data/config.txt") as handle:
            text = handle.read()
        return (shipped_helper_wd.ANSWER, text, os.getcwd(), sys.path[0],
                os.path.exists("logs/huge.log"))

    answer, text, cwd, first, has_log = tray.get(probe.remote())
    assert (answer, text, has_log) == (42, "from the working dir\n", False)
    assert cwd == first and cwd != str(root)  # a copy, unpacked on the node
    assert os.path.basename(os.path.dirname(cwd)) == "pkg"
    # A new cluster gets the package again (regression: this process
    # remembered it as stored, and the new cluster's workers failed to find it).
    tray.shutdown()
    tray.init(num_cpus=1, runtime_env={"working_dir": str(root), "excludes": ["logs/"]})
    assert tray.get(probe.remote())[:2] == (42, "from the working dir\n")


def test_py_modules_ship_a_package_directory_and_a_wheel(tmp_path):
    package = tmp_path / "src" / "shipped_pkg_dir"
    _write(package / "__init__.py", "from .inner import NAME\n")
    _write(package / "inner.py", "NAME = 'dir'\n")
    wheel = _wheel(str(tmp_path / "wheels"), "shipped_pkg_whl", "1.0", "NAME = 'wheel'\n")
    tray.init(num_cpus=1)

    @tray.remote(runtime_env={"py_modules": [str(package), wheel]})
    def names():
        import shipped_pkg_dir
        import shipped_pkg_whl

        return shipped_pkg_dir.NAME, shipped_pkg_whl.NAME

    assert tray.get(names.remote()) == ("dir", "wheel")
    with pytest.raises(ValueError, match="does not exist"):
        names.options(runtime_env={"py_modules": [str(tmp_path / "nope")]}).remote()


def test_pip_env_is_built_once_per_node_and_used_by_its_tasks(tmp_path):
    wheels = str(tmp_path / "wheels")
    _wheel(wheels, "tray_tiny_pip_pkg", "1.0", "VERSION = '1.0'\n")
    context = tray.init(num_cpus=3)
    env = {"pip": {"packages": ["tray_tiny_pip_pkg==1.0"],
                   "pip_install_options": ["--no-index", "--find-links", wheels]}}

    @tray.remote(runtime_env=env)
    def version():
        import sys

        import tray_tiny_pip_pkg

        return tray_tiny_pip_pkg.VERSION, [p for p in sys.path if "/pip/" in p], os.getpid()

    @tray.remote
    def plain():
        try:
            import tray_tiny_pip_pkg  # noqa: F401
        except ImportError:
            return "not installed"
        return "installed"

    results = tray.get([version.remote() for _ in range(3)])
    assert {result[0] for result in results} == {"1.0"}
    assert len({tuple(result[1]) for result in results}) == 1  # one env for all of them
    # A task without the env does not see its packages.
    assert tray.get(plain.remote()) == "not installed"
    pip_root = os.path.join(context["session_dir"], "runtime_resources", "pip")
    envs = [name for name in os.listdir(pip_root) if not name.endswith(".lock")]
    assert len(envs) == 1, envs

    # A requirements file works too (a wheel's path in it: no index).
    requirements = _write(tmp_path / "requirements.txt",
                          f"# what the task needs\n{_wheel(wheels, 'tray_tiny_req', '2.0', 'V = 2')}\n")

    @tray.remote(runtime_env={"pip": requirements})
    def from_file():
        import tray_tiny_req

        return tray_tiny_req.V

    assert tray.get(from_file.remote()) == 2


def test_a_failed_pip_install_fails_only_the_tasks_that_need_it():
    tray.init(num_cpus=2)
    env = {"pip": {"packages": ["tray-no-such-package-anywhere==9.9"],
                   "pip_install_options": ["--no-index"]}}

    @tray.remote(runtime_env=env)
    def needs_it():
        return "ran"

    @tray.remote
    def fine():
        return "fine"

    @tray.remote(runtime_env=env)
    class NeedsIt:
        def ping(self):
            return "pong"

    bad = [needs_it.remote() for _ in range(2)]
    good = fine.remote()
    for ref in bad:
        with pytest.raises(RuntimeEnvSetupError) as caught:
            tray.get(ref)
        message = str(caught.value)
        assert "pip install tray-no-such-package-anywhere==9.9 failed" in message
        assert "No matching distribution found" in message or \
            "Could not find a version" in message  # pip's own words
    assert tray.get(good) == "fine"
    actor = NeedsIt.remote()
    with pytest.raises(tray.exceptions.TrayError, match="No matching distribution|Could not"):
        tray.get(actor.ping.remote())
    assert tray.get(fine.remote()) == "fine"


def test_readme_runtime_env_example_runs(tmp_path):
    import readme_examples

    result = readme_examples.run(readme_examples.block("# runtime environments example",
                                                               page="jobs.md"),
                                 tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[:4] == ["60 m2", "60 ft2", "cm2", "10 m2 False"]


def test_an_env_too_large_to_start_fails_its_task_and_wedges_nothing():
    """A worker whose environment is too large to exec (E2BIG) fails the
    task that asked for it, with the reason; the node then starts workers
    for other envs as before (it used to wait for the one that never
    started: every later task with env_vars hung)."""
    tray.init(num_cpus=2, include_dashboard=False)

    @tray.remote(max_retries=0)
    def read(name):
        return os.environ.get(name)

    huge = read.options(runtime_env={"env_vars": {"TRAY_HUGE": "x" * 300_000}})
    with pytest.raises(tray.exceptions.TaskError, match="Argument list too long"):
        tray.get(huge.remote("TRAY_HUGE"), timeout=60)
    small = read.options(runtime_env={"env_vars": {"TRAY_SMALL": "ok"}})
    assert tray.get(small.remote("TRAY_SMALL"), timeout=30) == "ok"
    assert tray.get(read.remote("TRAY_SMALL"), timeout=30) is None


def test_env_vars_are_in_the_worker_process_environment_from_its_start():
    tray.init(num_cpus=1)  # (one worker prestarted: it must not take this env)

    @tray.remote(runtime_env={"env_vars": {"TRAY_AT_START": "yes", "PYTHONHASHSEED": "123"}})
    def initial_environment():
        with open("/proc/self/environ", "rb") as handle:
            entries = handle.read().split(b"\0")
        return [entry.decode() for entry in entries if entry.startswith(b"TRAY_AT_START=")], \
            hash("seeded")

    @tray.remote(runtime_env={"env_vars": {"PYTHONHASHSEED": "123"}})
    def seeded_hash():
        return hash("seeded")

    at_start, first_hash = tray.get(initial_environment.remote())
    assert at_start == ["TRAY_AT_START=yes"]
    # The interpreter read PYTHONHASHSEED when it started: str hashes agree.
    assert tray.get(seeded_hash.remote()) == first_hash
