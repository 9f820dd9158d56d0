"""Runtime environments (tray.runtime_env): validation, Ray's merge rule,
packing, and envs on both backends (env_vars, working_dir, per-worker
os.environ, pools per env). pip and py_modules, which need real processes,
are in test_runtime_env_local.py."""

from __future__ import annotations

import io
import os
import zipfile

import pytest

import tray
from tray import runtime_env as renv
from tray.exceptions import RuntimeEnvSetupError
from tray.job_config import JobConfig


@tray.remote
def _env_of(*names):
    return {name: os.environ.get(name) for name in names}


# ================================================================ validation


@pytest.mark.parametrize("bad,error,match", [
    ("env", TypeError, "runtime_env must be a dict"),
    ({"envvars": {}}, ValueError, "unknown runtime_env key 'envvars'; valid keys are"),
    ({"env_vars": {"A": 1}}, TypeError, "must map strings to strings"),
    ({"env_vars": ["A=1"]}, TypeError, r"runtime_env\['env_vars'\] must be a dict"),
    ({"env_vars": {"A=B": "1"}}, ValueError, "not a valid environment variable name"),
    ({"working_dir": 5}, TypeError, "working_dir"),
    ({"py_modules": "mod"}, TypeError, "py_modules"),
    ({"py_modules": [5]}, TypeError, "py_modules"),
    ({"excludes": "*.pyc"}, TypeError, "excludes"),
    ({"pip": 3}, TypeError, "pip"),
    ({"pip": [""]}, TypeError, "non-empty requirement"),
    ({"pip": {"packages": ["x"], "pip_chek": True}}, ValueError, "unknown runtime_env\\['pip'\\]"),
    ({"pip": {"packages": ["x"], "pip_version": "==23"}}, NotImplementedError, "pip_version"),
    ({"config": {"setup_timeout_seconds": 0}}, ValueError, "positive integer or -1"),
    ({"config": {"setup_timeout_seconds": "10"}}, TypeError, "setup_timeout_seconds"),
    ({"config": {"timeout": 10}}, ValueError, "unknown runtime_env\\['config'\\] key"),
    ({"config": {"eager_install": True}}, NotImplementedError, "eager_install"),
    ({"conda": "myenv"}, NotImplementedError, "conda environments are not supported"),
    ({"container": {"image": "x"}}, NotImplementedError, "containers"),
])
def test_bad_runtime_envs_fail_at_options_decoration_and_init(bad, error, match):
    with pytest.raises(error, match=match):
        _env_of.options(runtime_env=bad)
    with pytest.raises(error, match=match):
        tray.remote(runtime_env=bad)(lambda: None)
    with pytest.raises(error, match=match):
        tray.remote(runtime_env=bad)(type("A", (), {}))
    with pytest.raises(error, match=match):
        JobConfig(runtime_env=bad)
    with pytest.raises(error, match=match):
        tray.init(backend="sim", runtime_env=bad)
    assert not tray.is_initialized()


def test_runtime_env_class_is_a_checked_dict():
    env = renv.RuntimeEnv(env_vars={"A": "1"}, pip=["x"])
    assert env == {"env_vars": {"A": "1"}, "pip": ["x"]}
    with pytest.raises(ValueError, match="unknown runtime_env key 'bogus'"):
        renv.RuntimeEnv(bogus=1)
    config = renv.RuntimeEnvConfig(setup_timeout_seconds=30)
    assert renv.RuntimeEnv(config=config)["config"]["setup_timeout_seconds"] == 30
    with pytest.raises(ValueError, match="positive integer or -1"):
        renv.RuntimeEnvConfig(setup_timeout_seconds=-5)


def test_merge_is_rays_child_keys_replace_env_vars_merge():
    job = {"env_vars": {"A": "job", "B": "job"}, "working_dir": "gcs://_tray_pkg_1.zip",
           "pip": {"packages": ["x"]}}
    task = {"env_vars": {"B": "task", "C": "task"}, "pip": {"packages": ["y"]}}
    assert renv.merge(job, task) == {
        "env_vars": {"A": "job", "B": "task", "C": "task"},
        "working_dir": "gcs://_tray_pkg_1.zip", "pip": {"packages": ["y"]}}
    assert renv.merge(None, task) == task
    assert renv.merge(job, None) == job
    assert renv.env_hash({}) == ""
    assert renv.env_hash({"env_vars": {"A": "1"}}) == renv.env_hash({"env_vars": {"A": "1"}})
    assert renv.env_hash({"env_vars": {"A": "1"}}) != renv.env_hash({"env_vars": {"A": "2"}})


# ================================================================== packing


def _tree(root, files: dict) -> str:
    for relative, content in files.items():
        path = os.path.join(root, relative)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as handle:
            handle.write(content)
    return str(root)


def _names(package) -> list:
    return sorted(zipfile.ZipFile(io.BytesIO(package.data)).namelist())


def test_packing_is_content_named_and_honours_excludes(tmp_path):
    root = _tree(tmp_path / "wd", {"main.py": b"x = 1\n", "pkg/util.py": b"", "pkg/x.pyc": b"0",
                                   "data/big.bin": b"0" * 10, "sub/data/keep.txt": b"k",
                                   ".git/HEAD": b"ref"})
    everything = renv.pack_directory(root)
    assert _names(everything) == [".git/HEAD", "data/big.bin", "main.py", "pkg/util.py",
                                  "pkg/x.pyc", "sub/data/keep.txt"]
    # A name matches at any depth; '/data' (anchored) only at the root; 'x/' directories.
    packed = renv.pack_directory(root, ["*.pyc", "/data", ".git/"])
    assert _names(packed) == ["main.py", "pkg/util.py", "sub/data/keep.txt"]
    assert _names(renv.pack_directory(root, ["data"])) == [".git/HEAD", "main.py",
                                                           "pkg/util.py", "pkg/x.pyc"]
    # Same files, same bytes, same URI; a changed file, another URI.
    again = renv.pack_directory(root, ["*.pyc", "/data", ".git/"])
    assert again == packed and renv.is_package_uri(packed.uri)
    with open(os.path.join(root, "main.py"), "w") as handle:
        handle.write("x = 2\n")
    assert renv.pack_directory(root, ["*.pyc", "/data", ".git/"]).uri != packed.uri
    # A .zip is taken as it is.
    archive = tmp_path / "wd.zip"
    archive.write_bytes(packed.data)
    assert renv.pack_directory(str(archive)).uri == packed.uri


def test_packing_refuses_a_missing_dir_and_too_much_naming_the_biggest(tmp_path):
    with pytest.raises(ValueError, match="does not exist or is not a directory"):
        renv.pack_directory(str(tmp_path / "nope"))
    root = _tree(tmp_path / "wd", {"small.txt": b"s", "models/weights.bin": b"w" * 300_000,
                                   "mid.csv": b"m" * 100_000})
    with pytest.raises(ValueError) as caught:
        renv.pack_directory(root, max_size_bytes=200_000)
    message = str(caught.value)
    assert "over the limit" in message and "excludes" in message
    assert message.index("models/weights.bin") < message.index("mid.csv")
    assert renv.pack_directory(root, ["models/"], max_size_bytes=200_000).size_bytes < 200_000


def test_setup_timeout_fails_with_runtime_env_setup_error(monkeypatch):
    import trio

    from tray.runtime_env import setup

    async def slow(env, cache_dir, fetch):
        await trio.sleep(5)

    monkeypatch.setattr(setup, "prepare", slow)

    async def main():
        with pytest.raises(RuntimeEnvSetupError, match="setup_timeout_seconds=1"):
            await setup.prepare_with_timeout({"config": {"setup_timeout_seconds": 1}}, "", None)

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def test_a_package_is_fetched_and_unpacked_once_however_many_ask(tmp_path):
    import trio

    from tray.runtime_env import setup

    package = renv.pack_directory(_tree(tmp_path / "wd", {"m.py": b"x = 1\n"}))
    fetches = []

    async def fetch(key):
        fetches.append(key)
        await trio.sleep(1)  # a slow GCS: the others wait on the lock meanwhile
        return package.data

    async def main():
        found = []
        async with trio.open_nursery() as nursery:
            for _ in range(5):
                async def one():
                    found.append(await setup.ensure_package(package.uri, str(tmp_path / "c"),
                                                            fetch))
                nursery.start_soon(one)
        return found

    found = trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert fetches == [renv.KV_PREFIX + package.uri]
    assert len(set(found)) == 1 and os.path.isfile(os.path.join(found[0], "m.py"))


def test_unpacking_refuses_entries_outside_the_directory(tmp_path):
    from tray.runtime_env.packaging import unpack

    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("../escaped.txt", b"no")
    with pytest.raises(ValueError, match="outside its directory"):
        unpack(buffer.getvalue(), str(tmp_path / "target"))
    assert not (tmp_path / "escaped.txt").exists()


def test_unpacking_refuses_a_package_that_unpacks_past_the_limit(tmp_path):
    from tray.runtime_env.packaging import unpack

    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("zeros.bin", b"\0" * (8 * 2**20))  # 8 MiB in a few KB
    assert len(buffer.getvalue()) < 64 * 1024
    with pytest.raises(ValueError, match="unpacks to 8388608 bytes, over the limit of 1048576"):
        unpack(buffer.getvalue(), str(tmp_path / "bomb"), max_bytes=2**20)
    assert not (tmp_path / "bomb" / "zeros.bin").exists()
    unpack(buffer.getvalue(), str(tmp_path / "fits"), max_bytes=16 * 2**20)
    assert (tmp_path / "fits" / "zeros.bin").stat().st_size == 8 * 2**20


@pytest.mark.parametrize("uri", [
    "gcs://_tray_pkg_../../../tmp/x.zip", "gcs://_tray_pkg_" + "0" * 63 + ".zip",
    "gcs://_tray_pkg_" + "A" * 64 + ".zip", "gcs://_tray_pkg_" + "0" * 64 + ".zip/../x.zip",
])
def test_a_package_uri_is_exactly_a_content_hash(uri):
    # The hash names a cache directory on every node: no path may stand there.
    from tray.runtime_env.packaging import is_package_uri, package_hash

    assert not is_package_uri(uri)
    with pytest.raises(ValueError, match="not a package URI"):
        package_hash(uri)
    assert is_package_uri("gcs://_tray_pkg_" + "0" * 64 + ".zip")


# ====================================================== envs on both backends


def test_env_vars_are_inherited_and_merged_as_rays(backend):
    tray.init(backend=backend, num_cpus=2,
              runtime_env={"env_vars": {"JOB_VAR": "job", "SHARED": "job"}})
    assert tray.get(_env_of.remote("JOB_VAR", "SHARED")) == {"JOB_VAR": "job", "SHARED": "job"}
    task_env = {"env_vars": {"SHARED": "task", "TASK_VAR": "t"}}
    assert tray.get(_env_of.options(runtime_env=task_env).remote(
        "JOB_VAR", "SHARED", "TASK_VAR")) == {"JOB_VAR": "job", "SHARED": "task",
                                              "TASK_VAR": "t"}

    @tray.remote(runtime_env={"env_vars": {"PARENT": "p"}})
    def parent():
        # A task submitted from a task inherits its env (and adds to it).
        inner = _env_of.options(runtime_env={"env_vars": {"CHILD": "c"}})
        return tray.get([_env_of.remote("PARENT", "JOB_VAR"),
                         inner.remote("PARENT", "CHILD", "JOB_VAR")]), \
            tray.get_runtime_context().runtime_env["env_vars"]

    children, seen = tray.get(parent.remote())
    assert children == [{"PARENT": "p", "JOB_VAR": "job"},
                        {"PARENT": "p", "CHILD": "c", "JOB_VAR": "job"}]
    assert seen == {"JOB_VAR": "job", "SHARED": "job", "PARENT": "p"}
    # The driver's own environment is not changed.
    assert "JOB_VAR" not in os.environ


@tray.remote
class _Environ:
    def put(self, name, value):
        os.environ[name] = value

    def read(self, *names):
        return {name: os.environ.get(name) for name in names}

    def spawn_reads(self, *names):
        return tray.get(_env_of.remote(*names))


def test_actors_have_their_env_and_their_own_os_environ(backend):
    tray.init(backend=backend, num_cpus=4, runtime_env={"env_vars": {"JOB_VAR": "job"}})
    blue = _Environ.options(runtime_env={"env_vars": {"COLOR": "blue"}}).remote()
    plain = _Environ.remote()
    tray.get(blue.put.remote("WRITTEN", "by-blue"))
    assert tray.get(blue.read.remote("COLOR", "JOB_VAR", "WRITTEN")) == {
        "COLOR": "blue", "JOB_VAR": "job", "WRITTEN": "by-blue"}
    # Another actor sees neither blue's env nor its writes (in the simulator
    # too, where both share one process).
    assert tray.get(plain.read.remote("COLOR", "JOB_VAR", "WRITTEN")) == {
        "COLOR": None, "JOB_VAR": "job", "WRITTEN": None}
    # A task the actor submits inherits the actor's env.
    assert tray.get(blue.spawn_reads.remote("COLOR", "JOB_VAR")) == {
        "COLOR": "blue", "JOB_VAR": "job"}
    assert "WRITTEN" not in os.environ


@tray.remote
def _mark(env_name: str):
    """Which env last marked this worker's os.environ, then mark it."""
    seen = os.environ.get("MARKED_BY")
    os.environ["MARKED_BY"] = env_name
    assert os.environ.get("ENV_NAME") == env_name
    return seen


def test_a_worker_set_up_for_one_env_never_runs_another(backend):
    tray.init(backend=backend, num_cpus=2)
    refs = []
    for round_ in range(4):
        for name in ("a", "b", "c"):
            env = {"env_vars": {"ENV_NAME": name}}
            refs.append((name, _mark.options(runtime_env=env).remote(name)))
        if round_ % 2:
            tray.get([ref for _, ref in refs])
    for name, ref in refs:
        assert tray.get(ref) in (None, name), name


def test_simulated_workers_get_cuda_visible_devices():
    tray.init(backend="sim", num_cpus=2, num_gpus=2)

    @tray.remote(num_gpus=1)
    def gpu_task():
        return os.environ.get("CUDA_VISIBLE_DEVICES"), tray.get_gpu_ids()

    @tray.remote(num_gpus=0)
    def cpu_task():
        return os.environ.get("CUDA_VISIBLE_DEVICES")

    devices, ids = tray.get(gpu_task.remote())
    assert devices == ",".join(str(i) for i in ids) and len(ids) == 1
    assert tray.get(cpu_task.remote()) == ""  # a node with GPUs: none for this task


def test_working_dir_errors_are_clear_on_both_backends(backend, tmp_path, monkeypatch):
    tray.init(backend=backend, num_cpus=1)
    with pytest.raises(ValueError, match="does not exist or is not a directory"):
        _env_of.options(runtime_env={"working_dir": str(tmp_path / "missing")}).remote()
    big = _tree(tmp_path / "big", {"blob.bin": b"b" * (2 * 1024 * 1024), "small.py": b""})
    monkeypatch.setenv("TRAY_RUNTIME_ENV_MAX_PACKAGE_BYTES", str(1024 * 1024))
    with pytest.raises(ValueError, match=r"over the limit of 1.0 MiB; its largest files: "
                                         r"blob.bin \(2.0 MiB\)"):
        _env_of.options(runtime_env={"working_dir": big}).remote()
    assert tray.get(_env_of.options(runtime_env={"working_dir": big, "excludes": ["*.bin"]})
                    .remote("X")) == {"X": None}
    tray.shutdown()
    with pytest.raises(ValueError, match="does not exist"):
        tray.init(backend=backend, runtime_env={"working_dir": str(tmp_path / "missing")})
    assert not tray.is_initialized()


def test_working_dir_is_stored_in_the_cluster_and_resolves_in_the_simulator(tmp_path):
    root = _tree(tmp_path / "wd", {"main.py": b"x = 1\n"})
    tray.init(backend="sim", num_cpus=1, runtime_env={"working_dir": root})
    uri = tray.get_runtime_context().runtime_env["working_dir"]
    assert renv.is_package_uri(uri)
    assert renv.package_working_dir(root) == uri  # stored once, same name

    @tray.remote
    def env():
        return tray.get_runtime_context().runtime_env

    assert tray.get(env.remote())["working_dir"] == uri


def test_pip_is_refused_in_the_simulator_with_a_clear_error():
    tray.init(backend="sim", num_cpus=1)
    with pytest.raises(ValueError, match="pip.*not supported in the simulator"):
        _env_of.options(runtime_env={"pip": ["requests"]}).remote()
    with pytest.raises(ValueError, match="not supported in the simulator"):
        _Environ.options(runtime_env={"pip": ["requests"]}).remote()


def _env_program(seed: int, root: str) -> tuple:
    tray.init(backend="sim", seed=seed, num_nodes=3, num_cpus=2, num_gpus=1,
              runtime_env={"working_dir": root, "env_vars": {"JOB_VAR": "job"}})
    refs = [_mark.options(runtime_env={"env_vars": {"ENV_NAME": name}}).remote(name)
            for name in ("a", "b", "a", "c", "b", "a")]
    blue = _Environ.options(runtime_env={"env_vars": {"COLOR": "blue"}}, num_gpus=1).remote()
    tray.get(blue.put.remote("WRITTEN", "x"))
    values = (tray.get(refs), tray.get(blue.read.remote("COLOR", "JOB_VAR", "WRITTEN",
                                                         "CUDA_VISIBLE_DEVICES")),
              tray.get(blue.spawn_reads.remote("COLOR", "JOB_VAR")))
    tray.shutdown()
    from tray.simtest import trace_digest

    return values, trace_digest()


def test_runs_with_runtime_envs_replay_bit_for_bit(tmp_path):
    root = _tree(tmp_path / "wd", {"main.py": b"x = 1\n"})
    first = _env_program(7, root)
    assert first == _env_program(7, root)
    values, _ = first
    assert values[1] == {"COLOR": "blue", "JOB_VAR": "job", "WRITTEN": "x",
                         "CUDA_VISIBLE_DEVICES": "0"}
    assert values[2] == {"COLOR": "blue", "JOB_VAR": "job"}


def test_py_modules_that_cannot_ship_say_why(tmp_path):
    import sys as builtin_module

    from tray import runtime_env

    single = tmp_path / "alone.py"
    single.write_text("X = 1\n")
    with pytest.raises(ValueError, match="is a single file"):
        runtime_env.local_package(str(single), "py_modules", [])
    with pytest.raises(ValueError, match="has no file to ship"):
        runtime_env.local_package(builtin_module, "py_modules", [])
