"""The session directory trusts nobody else (issue 11, item 4): a per-user
root that must be ours, files made with O_EXCL | O_NOFOLLOW and 0600, /dev/shm
0700, and ``tray stop`` signalling only processes it can prove are its own."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys

import psutil
import pytest

import tray
from tray.backends.local import session as session_module
from tray.backends.local.session import free_port


def _cli(root, *args, env_extra=None):
    env = {**os.environ, "TRAY_SESSION_ROOT": str(root), **(env_extra or {})}
    return subprocess.run([sys.executable, "-m", "tray.scripts.cli", *args], env=env,
                          capture_output=True, text=True, timeout=120)


def _mode(path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_the_default_root_is_per_user():
    uid = os.getuid()
    assert session_module.default_root({}) == f"/tmp/tray-{uid}"
    assert session_module.default_root({"XDG_RUNTIME_DIR": "/run/user/7"}) == "/run/user/7/tray"
    assert session_module.default_root({"TRAY_SESSION_ROOT": "/x", "XDG_RUNTIME_DIR": "/r"}) \
        == "/x"


def _plant_symlinks(root, victim):
    """What another user who made the root first leaves there: every name
    tray used to write, pointing at a file of the attacker's choosing."""
    for name in ("current_cluster.json.tmp", "current_cluster.json"):
        os.symlink(victim, root / name)


def test_a_root_others_can_write_is_refused_and_nothing_is_written(tmp_path):
    root = tmp_path / "shared"
    root.mkdir()
    os.chmod(root, 0o777)
    victim = tmp_path / "collected-by-the-attacker"
    victim.write_text("")
    _plant_symlinks(root, victim)
    result = _cli(root, "start", "--head", "--port", str(free_port()), "--num-cpus", "1")
    try:
        assert result.returncode == 1, result.stdout
        assert "writable by others" in result.stderr
        assert "TRAY_SESSION_ROOT" in result.stderr  # what to do about it
        assert victim.read_text() == ""
        assert [p.name for p in root.iterdir() if p.name.startswith("session-")] == []
    finally:
        os.chmod(root, 0o700)
        _cli(root, "stop")


@pytest.mark.skipif(os.getuid() != 0, reason="making a directory of another user needs root")
def test_a_root_of_another_user_is_refused(tmp_path):
    root = tmp_path / "theirs"
    root.mkdir(mode=0o755)
    victim = tmp_path / "collected-by-the-attacker"
    victim.write_text("")
    _plant_symlinks(root, victim)
    os.chown(root, 65534, 65534)
    result = _cli(root, "start", "--head", "--port", str(free_port()), "--num-cpus", "1")
    try:
        assert result.returncode == 1
        assert "belongs to user 65534" in result.stderr
        assert victim.read_text() == ""
    finally:
        os.chown(root, 0, 0)
        _cli(root, "stop")


def test_a_symlinked_root_is_refused(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    root = tmp_path / "link"
    root.symlink_to(elsewhere)
    with pytest.raises(session_module.UnsafeSessionRoot, match="not a directory"):
        session_module.ensure_root(str(root))


def test_private_files_never_follow_or_reuse_a_planted_name(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("mine")
    planted = tmp_path / "planted"
    planted.symlink_to(victim)
    with pytest.raises(FileExistsError):
        session_module.create_private_file(str(planted), "secret")
    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "would-be-created")
    with pytest.raises(FileExistsError):
        session_module.create_private_file(str(dangling), "secret")
    assert not (tmp_path / "would-be-created").exists()
    assert victim.read_text() == "mine"
    with pytest.raises(OSError):
        session_module.read_private_file(str(planted))
    target = tmp_path / "info.json"
    session_module.replace_private_file(str(target), "{}")
    assert _mode(target) == 0o600


def test_tray_start_keeps_everything_private(tmp_path):
    root = tmp_path / "sessions"
    result = _cli(root, "start", "--head", "--port", str(free_port()), "--num-cpus", "1")
    assert result.returncode == 0, result.stderr
    try:
        assert _mode(root) == 0o700
        assert _mode(root / "current_cluster.json") == 0o600
        [session_dir] = [p for p in root.iterdir() if p.name.startswith("session-")]
        assert _mode(session_dir) == 0o700
        for name in ("token", "node.log", "started-by-tray-start.json", "node-0.json"):
            assert _mode(session_dir / name) == 0o600, name
        shm = f"/dev/shm/tray-{session_dir.name}"
        assert _mode(shm) == 0o700
        assert os.stat(shm).st_uid == os.getuid()
    finally:
        _cli(root, "stop")


def test_the_shared_memory_directory_of_tray_init_is_0700():
    info = tray.init(num_cpus=1)
    try:
        assert tray.get(tray.put(1)) == 1
        shm = f"/dev/shm/tray-{os.path.basename(info['session_dir'])}"
        assert _mode(shm) == 0o700  # others cannot list object ids
        assert _mode(info["session_dir"]) == 0o700
    finally:
        tray.shutdown()


def _sleeper() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"],
                            start_new_session=True)


@pytest.mark.parametrize("marker_kind", ["pid only (old format)", "another start time",
                                         "another program"])
def test_stop_signals_only_processes_it_can_prove_are_its_own(tmp_path, marker_kind):
    """A session whose recorded pid now belongs to another process (the
    node died, the pid was recycled): ``tray stop`` must leave it alone."""
    root = tmp_path / "sessions"
    root.mkdir(mode=0o700)
    session_dir = root / "session-1-deadbeef"
    session_dir.mkdir(mode=0o700)
    bystander = _sleeper()
    try:
        marker = {"pid": bystander.pid, "gcs": "tcp:127.0.0.1:1", "head": True}
        if marker_kind == "another start time":
            marker["create_time"] = psutil.Process(bystander.pid).create_time() - 3600
        elif marker_kind == "another program":
            marker["create_time"] = psutil.Process(bystander.pid).create_time()
        (session_dir / "started-by-tray-start.json").write_text(json.dumps(marker))
        result = _cli(root, "stop")
        assert result.returncode == 0, result.stderr
        # The old tray stop waited for its SIGTERM to take effect before returning.
        assert bystander.poll() is None, "tray stop signalled a process that is not its node"
        assert "Stopped 0 tray node(s)" in result.stdout
        assert str(bystander.pid) in result.stderr  # it says whom it left alone
    finally:
        bystander.kill()
        bystander.wait()
