"""ProcWatch: the idle agent's one-read check that its raylet still runs."""

from __future__ import annotations

import subprocess
import sys

import pytest

from elastic_ray.agent.node.proc_watch import ProcWatch, stat_fields


def _fake_stat(root, pid: int, comm: str, state: str, start: int) -> None:
    rest = " ".join(["0"] * 18)
    (root / str(pid)).mkdir(exist_ok=True)
    (root / str(pid) / "stat").write_text(f"{pid} ({comm}) {state} {rest} {start} 0 0\n")


def test_a_running_child_is_alive_then_its_zombie_and_its_reaped_pid_are_not():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        watch = ProcWatch.find(child.pid)
        assert watch is not None and watch.pid == child.pid and watch.alive()
        child.kill()
        # Not reaped yet: a zombie, which no longer runs.
        for _ in range(200):
            fields = stat_fields(child.pid)
            if fields is None or fields[0] == b"Z":
                break
            subprocess.run(["sleep", "0.01"], check=True)
        assert not watch.alive()
    finally:
        child.kill()
        child.wait()
    assert not watch.alive()
    assert ProcWatch.find(child.pid) is None


def test_no_pid_or_no_process_finds_nothing(tmp_path):
    assert ProcWatch.find(None) is None
    assert ProcWatch.find(0) is None
    assert ProcWatch.find(4242, proc_root=str(tmp_path)) is None


def test_a_reused_pid_is_not_the_watched_process(tmp_path):
    _fake_stat(tmp_path, 4242, "raylet", "S", 1000)
    watch = ProcWatch.find(4242, proc_root=str(tmp_path))
    assert watch is not None and watch.alive()
    _fake_stat(tmp_path, 4242, "raylet", "S", 2000)   # the PID now names another process
    assert not watch.alive()


@pytest.mark.parametrize("comm", ["ray::IDLE", "a b", "x) (y", "((", ")", ""])
def test_the_command_name_never_shifts_the_fields(tmp_path, comm):
    _fake_stat(tmp_path, 7, comm, "R", 555)
    fields = stat_fields(7, proc_root=str(tmp_path))
    assert fields is not None and fields[0] == b"R" and fields[19] == b"555"
    assert ProcWatch.find(7, proc_root=str(tmp_path)).alive()


@pytest.mark.parametrize("state", ["Z", "X", "x"])
def test_an_ended_state_is_not_alive_and_not_found(tmp_path, state):
    _fake_stat(tmp_path, 9, "raylet", "S", 10)
    watch = ProcWatch.find(9, proc_root=str(tmp_path))
    _fake_stat(tmp_path, 9, "raylet", state, 10)
    assert not watch.alive()
    assert ProcWatch.find(9, proc_root=str(tmp_path)) is None


@pytest.mark.parametrize("content", ["", "1 (x", "1 (x) S 1 2", "garbage"])
def test_a_short_or_damaged_stat_file_reads_as_no_process(tmp_path, content):
    (tmp_path / "3").mkdir()
    (tmp_path / "3" / "stat").write_text(content)
    assert stat_fields(3, proc_root=str(tmp_path)) is None
    assert ProcWatch.find(3, proc_root=str(tmp_path)) is None
