"""The session's detached supervisor (the SSH mode's head watch that outlives its callers).

The end rule is pure and tested by table; the process is tested for real on
the local scheduler: one per session, stopped by every teardown (the CLI's
too) before the jobs are cancelled, never signalled on another host, and
ending by itself when no client came back.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from elastic_ray import SlurmRunAllocationConfig
from elastic_ray.config.launcher import RayLauncher
from elastic_ray.coordinator import detached
from elastic_ray.coordinator.session import Session
from tests.helpers import wait_until
from tests.remote_helpers import process_alive as alive

DAY = 24 * 3600.0


@pytest.mark.parametrize("now, last_call, idle, expected", [
    (1000.0, 999.0, 0, None),
    (1000.0, 1000.0 - DAY, 0, None),             # exactly at the limit: still supervised
    (1000.0, 1000.0 - DAY - 1, 0, "abandoned"),
    (1000.0, 999.0, detached.IDLE_CHECKS - 1, None),
    (1000.0, 999.0, detached.IDLE_CHECKS, "all_jobs_ended"),
    (1000.0, 1000.0 - 2 * DAY, detached.IDLE_CHECKS, "abandoned"),  # both: abandonment is named
])
def test_why_supervision_ends(now, last_call, idle, expected):
    assert detached.why_end(now, last_call, DAY, idle) == expected


def test_a_session_without_a_detached_supervisor_is_left_alone(tmp_path):
    assert detached.running_pid(tmp_path) is None
    assert detached.stop_supervisor(tmp_path) is None
    assert not (tmp_path / "remote").exists(), "nothing written for a session that never had one"


@pytest.fixture
def session(tmp_path, monkeypatch):
    monkeypatch.setenv("ELASTIC_RAY_DETACHED_IDLE_INTERVAL", "1")   # inherited by the supervisor
    s = Session.create(tmp_path / "s", scheduler="local", supervise=False,
                       head=SlurmRunAllocationConfig(partition="cpu", time_limit="10", mem="1G"),
                       launcher=RayLauncher(object_store_memory=100_000_000))
    yield s
    pid = detached.running_pid(s.path)
    if pid and pid > 0 and alive(pid):
        os.kill(pid, 15)
        wait_until(lambda: not alive(pid), timeout=60, message="supervisor stopped")
    s.teardown()
    wait_until(lambda: all(i.state.is_final for i in s.query().values()), timeout=60, message="jobs ended")


@pytest.mark.ray
@pytest.mark.timeout(180)
def test_one_per_session_and_the_cli_teardown_stops_it_before_cancelling(session):
    session.wait_for_head(timeout=90)
    pid = detached.ensure_supervisor(session.path)
    wait_until(lambda: detached.running_pid(session.path) == pid, timeout=30, message="supervisor up")
    assert detached.ensure_supervisor(session.path) == pid, "a second start finds the first"
    host = (session.path / "remote" / "supervisor.pid").read_text().split()[1]
    assert host == os.uname().nodename
    head = session.record().head_job
    done = subprocess.run([sys.executable, "-m", "elastic_ray.cli", "session", "teardown", str(session.path)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert detached.running_pid(session.path) is None, "the teardown waited for the supervisor to let go"
    wait_until(lambda: not alive(pid), timeout=15, message="the supervisor process exited")
    wait_until(lambda: all(i.state.is_final for i in session.query().values()), timeout=60, message="jobs ended")
    time.sleep(3)
    rec = session.record()
    assert rec.head_job == head and not rec.successor, "nobody elected behind the teardown's back"
    log = (session.path / "logs" / "detached-supervisor.log").read_text()
    assert "why=stopped" in log


@pytest.mark.ray
@pytest.mark.timeout(180)
def test_a_supervisor_on_another_host_is_asked_by_marker_not_signalled(session):
    pid = detached.ensure_supervisor(session.path)
    wait_until(lambda: detached.running_pid(session.path) == pid, timeout=30, message="supervisor up")
    (session.path / "remote" / "supervisor.pid").write_text(f"{pid} some-other-login-node\n")
    assert detached.running_pid(session.path) == -1
    t0 = time.monotonic()
    assert detached.stop_supervisor(session.path, wait=30) == -1
    assert detached.running_pid(session.path) is None, "it saw the stop marker and let go by itself"
    assert time.monotonic() - t0 <= detached.CHECK_INTERVAL + 5
    wait_until(lambda: not alive(pid), timeout=15, message="the supervisor process exited")


@pytest.mark.ray
@pytest.mark.timeout(180)
def test_an_abandoned_session_is_not_supervised_forever(session):
    pid = detached.ensure_supervisor(session.path, abandon_after=2.0)
    wait_until(lambda: not alive(pid), timeout=60, message="supervision ended with no client calling")
    log = (session.path / "logs" / "detached-supervisor.log").read_text()
    assert "why=abandoned" in log
    assert any(not i.state.is_final for i in session.query().values()), \
        "the jobs are left to their walltime, as when a local caller's process ends"
