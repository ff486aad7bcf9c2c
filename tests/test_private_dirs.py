"""Per-user private directories on a node: status files and Ray temp dirs.

Real directories, real FIFOs and symlinks, a real second user (a process
that drops to another uid) where the test runs as root.
"""

from __future__ import annotations

import multiprocessing
import os
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from elastic_ray.agent.node import private_dirs
from elastic_ray.agent import status as agent_status
from elastic_ray.agent.node.local_ray import LocalRay, NodePlace
from elastic_ray.agent.node.private_dirs import (
    TempDirEntry,
    ensure_private_dir,
    stale_temp_dirs,
    sweep_temp_roots,
)
from elastic_ray.config import SlurmWorkerAllocationConfig
from elastic_ray.config.launcher import RayLauncher
from elastic_ray.errors import UnsafePathError
from tests.helpers import node_state

ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="another user's files and a second uid need root")
OTHER_UID = 54321      # no passwd entry needed: the kernel takes any uid


@pytest.fixture
def node_tmp(monkeypatch):
    """A stand-in for the node's /tmp: world-writable and sticky, like /tmp
    (pytest's tmp_path is private to root, so a second user could not enter it)."""
    base = tempfile.mkdtemp(prefix="er-nodetmp-", dir="/tmp")
    os.chmod(base, 0o1777)
    monkeypatch.setattr(private_dirs, "NODE_TMP", base)
    monkeypatch.delenv("ELASTIC_AGENT_RUNTIME_DIR", raising=False)
    yield Path(base)
    subprocess.run(["rm", "-rf", "--one-file-system", base], check=False)


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


# ---------------------------------------------------------------- ensure_private_dir

def test_a_new_private_dir_is_0700_and_ours(tmp_path):
    path = ensure_private_dir(tmp_path / "a" / "b")
    assert _mode(path) == 0o700 and os.lstat(path).st_uid == os.geteuid()


def test_an_older_dir_of_ours_that_others_may_only_read_is_closed(tmp_path):
    path = tmp_path / "old"
    path.mkdir()
    os.chmod(path, 0o755)
    ensure_private_dir(path)
    assert _mode(path) == 0o700


@pytest.mark.parametrize("mode", [0o777, 0o770, 0o1777, 0o702, 0o720])
def test_a_dir_others_may_write_into_is_refused_with_the_fix(tmp_path, mode):
    path = tmp_path / "open"
    path.mkdir()
    os.chmod(path, mode)
    with pytest.raises(UnsafePathError, match=rf"has mode {mode & 0o7777:04o}.*rm -rf {path}"):
        ensure_private_dir(path)
    assert _mode(path) == mode        # refused, not repaired: its content may be planted


def test_a_symlink_or_a_file_in_place_of_the_dir_is_refused(tmp_path):
    target = tmp_path / "real"
    target.mkdir(mode=0o700)
    link = tmp_path / "link"
    link.symlink_to(target)
    with pytest.raises(UnsafePathError, match="symbolic link"):
        ensure_private_dir(link)
    plain = tmp_path / "plain"
    plain.write_text("x")
    with pytest.raises(UnsafePathError, match="not a directory"):
        ensure_private_dir(plain)


@ROOT_ONLY
def test_a_dir_of_another_user_is_refused(tmp_path):
    path = tmp_path / "theirs"
    path.mkdir(mode=0o700)
    os.chown(path, OTHER_UID, OTHER_UID)
    with pytest.raises(UnsafePathError, match=f"owned by uid {OTHER_UID}, not by us"):
        ensure_private_dir(path)


# ---------------------------------------------------------------- status files: FIFOs, symlinks

def _status_file(directory: Path, job: str, pid: int = 1) -> Path:
    return directory / f"{job}.cpu-1.{pid}.json"


@pytest.mark.timeout(20)
def test_a_planted_fifo_or_symlink_never_hangs_or_redirects_status(node_tmp, tmp_path):
    runtime = agent_status.runtime_dir()
    assert runtime == node_tmp / f"elastic-agent-{os.geteuid()}"
    good = _status_file(runtime, "3")
    agent_status.write_status(good, node_state("3", "cpu-1", "JOINED"))
    assert _mode(runtime) == 0o700 and _mode(good) == 0o600
    fifo = _status_file(runtime, "4")
    os.mkfifo(fifo)
    # A valid-looking record elsewhere: followed, it would show a fake agent.
    elsewhere = tmp_path / "fake.json"
    agent_status.write_status(elsewhere, node_state("5", "cpu-1", "JOINED"))
    link = _status_file(runtime, "5")
    link.symlink_to(elsewhere)
    views = {v.path.name: v for v in agent_status.collect()}       # returns: the FIFO is not waited on
    assert views[good.name].status is not None
    assert views[fifo.name].status is None and "not a regular file" in views[fifo.name].error
    assert views[link.name].status is None and "symbolic link" in views[link.name].error
    # The agent's next write replaces the planted link; the link's target is untouched.
    before = elsewhere.read_bytes()
    agent_status.write_status(link, node_state("5", "cpu-1", "LEFT"))
    assert not link.is_symlink() and elsewhere.read_bytes() == before
    # Pruning takes the FIFO away.
    assert agent_status.prune() == 1 and not os.path.lexists(fifo)


def test_status_refuses_a_runtime_dir_others_may_write_into(node_tmp):
    runtime = agent_status.runtime_dir()
    runtime.mkdir()
    os.chmod(runtime, 0o777)
    with pytest.raises(UnsafePathError, match="group or others may write"):
        agent_status.collect()
    with pytest.raises(UnsafePathError):
        agent_status.write_status(_status_file(runtime, "3"), node_state("3"))


# ---------------------------------------------------------------- two users on one node

def _second_user(node_tmp: str, conn) -> None:
    """In a forked child: become another user, then do what its agent does
    first on the node (no exec: the venv's interpreter lives under /root,
    which another user may not enter)."""
    try:
        os.setgroups([])
        os.setgid(OTHER_UID)
        os.setuid(OTHER_UID)
        local = _local_ray("bbbbbbbb-theirs", Path(node_tmp))
        local.prepare()
        temp = local._temp_dir("w")
        local._make_temp_dir(temp)
        agent_status.write_status(agent_status.status_path("7", "cpu-1", os.getpid()), node_state("7"))
        conn.send({"temp": temp, "runtime": str(agent_status.runtime_dir()),
                   "jobs": [v.status.job_id for v in agent_status.collect() if v.status]})
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        conn.send({"error": f"{type(exc).__name__}: {exc}"})
    finally:
        conn.close()


def _local_ray(session_id: str, log_dir: Path) -> LocalRay:
    return LocalRay(NodePlace("7", "cpu-1", "127.0.0.1", 0, session_id, log_dir), RayLauncher(),
                    SlurmWorkerAllocationConfig(), lambda *a, **k: None)


@ROOT_ONLY
@pytest.mark.timeout(60)
def test_two_users_on_one_node_each_get_their_own_dirs(node_tmp):
    # We (root) come first, as the first user on a node did under the old
    # shared /tmp/er, which then locked every later user out.
    ours = _local_ray("aaaaaaaa-ours", node_tmp)
    ours.prepare()
    our_temp = ours._temp_dir("w")
    ours._make_temp_dir(our_temp)
    agent_status.write_status(agent_status.status_path("3", "cpu-1", os.getpid()), node_state("3"))

    ctx = multiprocessing.get_context("fork")
    receive, send = ctx.Pipe(duplex=False)
    child = ctx.Process(target=_second_user, args=(str(node_tmp), send))
    child.start()
    assert receive.poll(50), "the second user's process did not answer"
    theirs = receive.recv()
    child.join(10)
    assert "error" not in theirs, theirs["error"]
    assert theirs["temp"].startswith(f"{node_tmp}/er-{OTHER_UID}/bbbbbbbb/")
    assert theirs["runtime"] == f"{node_tmp}/elastic-agent-{OTHER_UID}"
    assert theirs["jobs"] == ["7"]                                   # their status shows only theirs
    assert [v.status.job_id for v in agent_status.collect() if v.status] == ["3"]   # ours only ours
    for path in (Path(theirs["temp"]).parent.parent, Path(theirs["runtime"])):
        info = os.lstat(path)
        assert info.st_uid == OTHER_UID and stat.S_IMODE(info.st_mode) == 0o700
    for path in (Path(our_temp).parent.parent, agent_status.runtime_dir()):
        info = os.lstat(path)
        assert info.st_uid == 0 and stat.S_IMODE(info.st_mode) == 0o700


@ROOT_ONLY
def test_a_root_planted_by_another_user_stops_the_agent_with_a_clear_error(node_tmp):
    planted = node_tmp / f"er-{os.geteuid()}"
    planted.mkdir(mode=0o700)
    os.chown(planted, OTHER_UID, OTHER_UID)
    with pytest.raises(UnsafePathError, match=rf"{planted}: is owned by uid {OTHER_UID}"):
        _local_ray("cccccccc", node_tmp).prepare()


# ---------------------------------------------------------------- stale temp dirs

NOW = 1_800_000_000.0


def _entry(path: str, age: float, *, session: bool = False, owner: int = 0) -> TempDirEntry:
    return TempDirEntry(path, NOW - age, owner, is_session=session)


@pytest.mark.parametrize("entries, in_use, gone", [
    # an ended run: its node dirs and then its folder
    ([_entry("/r/s1", 900, session=True), _entry("/r/s1/5.0w1", 900), _entry("/r/s1/5.0h2", 900)], [],
     ["/r/s1/5.0w1", "/r/s1/5.0h2", "/r/s1"]),
    # a live Ray names its dir: the dir and its folder stay
    ([_entry("/r/s1", 900, session=True), _entry("/r/s1/5.0w1", 900), _entry("/r/s1/6.0w1", 900)],
     ["raylet --temp_dir=/r/s1/6.0w1/session_x"], ["/r/s1/5.0w1"]),
    # made a moment ago, Ray not started yet: stays
    ([_entry("/r/s1", 5, session=True), _entry("/r/s1/5.0w1", 5)], [], []),
    # another user's (only in the old shared root): never ours to remove
    ([_entry("/r/s1", 900, session=True, owner=1000), _entry("/r/s1/5.0w1", 900, owner=1000)], [], []),
    # an empty folder of an ended run
    ([_entry("/r/s2", 900, session=True)], [], ["/r/s2"]),
])
def test_which_temp_dirs_are_stale(entries, in_use, gone):
    assert stale_temp_dirs(entries, in_use, NOW, uid=0) == gone


@pytest.mark.timeout(60)
def test_the_sweep_removes_ended_runs_and_spares_live_and_fresh_ones(node_tmp):
    root = node_tmp / f"er-{os.geteuid()}"
    ended = root / "ended000" / "5.0w1"
    live = root / "live0000" / "6.0w1"
    fresh = root / "fresh000" / "7.0w1"
    for path in (ended, live, fresh):
        (path / "session_x" / "sockets").mkdir(parents=True)
    old = time.time() - 3600
    for path in (ended, ended.parent, live, live.parent):
        os.utime(path, (old, old))
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", f"--temp-dir={live}"])
    try:
        gone = sweep_temp_roots([root, node_tmp / "no-such-root"])
    finally:
        holder.kill()
        holder.wait()
    assert sorted(gone) == sorted([str(ended), str(ended.parent)])
    assert not ended.parent.exists() and live.exists() and fresh.exists()


def test_an_agent_removes_every_temp_dir_it_made_when_it_exits(node_tmp):
    local = _local_ray("dddddddd", node_tmp)
    local.prepare()
    made = [local._temp_dir(kind) for kind in ("w", "h", "w")]
    for path in made:
        local._make_temp_dir(path)
        Path(path, "session_x").mkdir()
    local.sweep()            # what the agent runs last, after its stops
    assert not any(os.path.exists(p) for p in made)
    assert not Path(local.temp_root()).exists()
    assert Path(local.temp_root()).parent.exists()      # the user's root stays (0700, empty)
