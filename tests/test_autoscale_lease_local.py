"""One autoscaler per session, for real: processes holding the Session, one lease.

No Ray and no jobs: the lease is taken before anything is read of the run, so a
session directory of the local scheduler with a policy set is enough. A real
subprocess opens the session with supervision (as a run's supervisor does) and
takes the lease; this process, supervising too, must not take it while that one
lives, and must take it over at once when that process is killed by its PID
(a dead holder on this host is seen gone; on another host the lease runs out
within ``LEASE_PERIOD``, which ``tests/test_autoscale_lease.py`` checks by table).
Closing a Session gives the lease back.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid

import pytest

from elastic_ray import SlurmRunAllocationConfig, SlurmWorkerAllocationConfig
from elastic_ray.autoscale import AutoscalePolicy, Pool
from elastic_ray.config.launcher import RayLauncher
from elastic_ray.coordinator.head.election import claimant_process
from elastic_ray.coordinator.session import Session
from elastic_ray.protocol.disk import event_log
from elastic_ray.protocol.disk.events import EventKind
from elastic_ray.protocol.disk.records import SessionInfo
from elastic_ray.protocol.disk.session_dir import SessionDir
from tests.helpers import stays, wait_until

pytestmark = [pytest.mark.timeout(120)]

HOLDER = r'''
import sys, time
from elastic_ray.coordinator.session import Session
s = Session.open(sys.argv[1], supervise=True)
print("open", flush=True)
time.sleep(600)
'''


def _holder_pid(directory: SessionDir) -> int | None:
    lease = directory.read_allocation().autoscaler
    who = None if lease is None or not lease.is_live(time.time()) else claimant_process(lease.claimant)
    return None if who is None else who[1]


@pytest.fixture
def session_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("ELASTIC_RAY_AUTOSCALE_INTERVAL", "0.3")
    info = SessionInfo(session_id=uuid.uuid4().hex, job_name=f"er-lease-{uuid.uuid4().hex[:6]}",
                       created_at=time.time(), scheduler={"kind": "local", "state_dir": str(tmp_path / "sched")},
                       head=SlurmRunAllocationConfig(partition="cpu").to_dict(), ray_head_only=False,
                       launcher=RayLauncher().to_dict())
    directory = SessionDir.create(tmp_path / "s", info)
    Session.open(directory.path, supervise=False).autoscale(AutoscalePolicy(
        pools=[Pool(SlurmWorkerAllocationConfig(partition="cpu", num_nodes=1))]))
    return directory


def _lease_events(session_dir):
    return [e for e in event_log.read(session_dir.path).events if e.kind is EventKind.AUTOSCALE_LEASE]


def test_a_killed_holder_s_lease_is_taken_over_by_another_supervising_process(session_dir, tmp_path):
    env = {**os.environ, "ELASTIC_RAY_AUTOSCALE_INTERVAL": "0.3"}
    with (tmp_path / "holder.err").open("w") as err:
        holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(session_dir.path)], stdout=subprocess.PIPE,
                                  stderr=err, env=env, text=True)
    ours = None
    try:
        assert holder.stdout.readline().strip() == "open"
        wait_until(lambda: _holder_pid(session_dir) == holder.pid, timeout=30, message="the subprocess took no lease")
        ours = Session.open(session_dir.path, supervise=True)
        stays(lambda: _holder_pid(session_dir) == holder.pid, 2.0, message="a live holder keeps its lease")

        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(timeout=10)
        t_killed = time.monotonic()
        wait_until(lambda: _holder_pid(session_dir) == os.getpid(), timeout=60,
                   message="the lease was not taken over")
        took = time.monotonic() - t_killed
        wait_until(lambda: len(_lease_events(session_dir)) >= 2, timeout=5, message="no event for the take-over")
        leases = _lease_events(session_dir)
        assert [e.reason for e in leases] == ["taken", "taken over"], leases
        assert claimant_process(str(leases[1].details["previous"]))[1] == holder.pid
        print(f"\nholder killed -> lease taken over in {took:.1f} s")

        ours.close()   # a closing holder gives the lease back at once
        ours = None
        assert _holder_pid(session_dir) is None
        assert [e.reason for e in event_log.read(session_dir.path).events
                if e.kind is EventKind.AUTOSCALE_LEASE][-1] == "released"
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait(timeout=10)
        if ours is not None:
            ours.close()


def test_a_lease_held_on_another_host_is_waited_out_then_taken(session_dir):
    # A holder on another host cannot be seen dead from here: its lease is waited out. Written as that
    # holder would (a short expiry stands in for the 45 s period, which the table test covers).
    from dataclasses import replace
    from elastic_ray.protocol.disk.records import ElectionClaim
    elsewhere = "some-other-host:4242:abcd1234"
    expires = time.time() + 3.0
    session_dir.update_allocation(lambda r: replace(r, autoscaler=ElectionClaim(elsewhere, time.time(), expires)))
    ours = Session.open(session_dir.path, supervise=True)
    try:
        stays(lambda: session_dir.read_allocation().autoscaler.claimant == elsewhere, max(0.5, expires - time.time() - 0.5),
              message="the other host's live lease keeps")
        wait_until(lambda: _holder_pid(session_dir) == os.getpid(), timeout=10, message="the lapsed lease was not taken")
        assert time.time() >= expires
        # The lease is committed to the allocation record first and its event appended right after.
        wait_until(lambda: _lease_events(session_dir), timeout=5, message="no lease event after the take-over")
        leases = _lease_events(session_dir)
        assert (leases[-1].reason, leases[-1].details["previous"]) == ("taken over", elsewhere)
    finally:
        ours.close()
