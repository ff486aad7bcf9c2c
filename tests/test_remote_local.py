"""The SSH mode end to end on the local scheduler: a real sshd, real agents, real Ray.

The client side uses only SSH (the ``RemoteSession``); the test itself looks
at the cluster side directly (files, PIDs) to check what the client cannot.
The same scenarios on Slurm, with a head failover, are in
integration/test_remote_slurm.py.
"""

from __future__ import annotations

import io
import os
import time
from pathlib import Path

import pytest

from elastic_ray import SlurmRunAllocationConfig, SlurmStepDrained, SlurmWorkerAllocationConfig
from elastic_ray.config.launcher import RayLauncher
from elastic_ray.coordinator.drivers import PayloadFailed
from elastic_ray.coordinator.handles import Head, WorkerAllocation
from elastic_ray.coordinator.session import Session
from elastic_ray.remote import RemoteSession
from elastic_ray.coordinator.detached import running_pid
from tests.helpers import committed_units, wait_until
from tests.remote_helpers import REMOTE_PYTHON, process_alive as alive, target_of

pytestmark = [pytest.mark.ray, pytest.mark.timeout(300)]

HEAD = SlurmRunAllocationConfig(partition="cpu", time_limit="30", mem="2G")
WORKER = SlurmWorkerAllocationConfig(partition="gpu-a", num_nodes=1, cpus_per_task=2, mem="2G", time_limit="30")


@pytest.fixture
def remote(sshd, tmp_path):
    """A session created over SSH; torn down from inside afterwards, supervisor stopped by PID."""
    made: list[RemoteSession] = []

    def make(**kwargs) -> RemoteSession:
        kwargs.setdefault("head", HEAD)
        # No warm standby: these tests are about the SSH front end, not failover.
        kwargs.setdefault("launcher", RayLauncher(object_store_memory=100_000_000, standby_head=False))
        s = RemoteSession.create(str(tmp_path / f"s{len(made)}"), ssh=target_of(sshd), remote_python=REMOTE_PYTHON,
                                 scheduler="local", **kwargs)
        made.append(s)
        return s

    yield make
    for s in made:
        inside = Session.open(s.path, supervise=False)
        pid = running_pid(s.path)
        if pid and pid > 0 and alive(pid):
            os.kill(pid, 15)
            wait_until(lambda: not alive(pid), timeout=60, message="the supervisor stopped")
        inside.teardown()
        wait_until(lambda: all(i.state.is_final for i in inside.query().values()), timeout=60,
                   message=f"session jobs did not end after teardown: {inside.query()}")
        s.close()


def test_a_session_over_ssh_works_like_a_local_one(remote, tmp_path):
    s = remote()
    assert alive(s.supervisor_pid), "the cluster-side supervisor runs from create on"
    with pytest.raises(TimeoutError):   # the cluster side's timeout, as the same type
        s.wait_for_head(timeout=0.01)
    progress: list[str] = []
    address = s.wait_for_head(timeout=120, progress=progress.append)
    worker = s.add_worker_allocation(WORKER)
    assert isinstance(worker, WorkerAllocation)
    nodes = s.wait_for_worker_allocation(worker, timeout=120)
    assert len(nodes) == 1
    assert [w.job_id for w in s.worker_allocations] == [worker.job_id]
    assert worker.config.partition == "gpu-a"   # the handle reads the record over SSH
    head = s.head
    assert isinstance(head, Head) and head.address == address

    # The payload's output streams back, stdout and stderr apart.
    out, err = io.StringIO(), io.StringIO()
    commits = tmp_path / "commits.txt"
    result = s.run([REMOTE_PYTHON, "-m", "elastic_ray.demo.payload", str(commits), "6"],
                   stdout=out, stderr=err).wait(timeout=180)
    assert result.returncode == 0 and result.head_job == head.job_id
    assert "payload: 0 units already committed, 6 to go" in out.getvalue()
    assert sorted(committed_units(commits)) == list(range(6))

    with pytest.raises(PayloadFailed) as failed:
        s.run([REMOTE_PYTHON, "-c", "import sys; print('bad', file=sys.stderr); sys.exit(3)"],
              stdout=out, stderr=err).wait(timeout=60)
    assert failed.value.returncode == 3 and "bad" in err.getvalue()

    # A reconnecting client sees the same state.
    again = RemoteSession.open(s.path, ssh=s.conn.target, remote_python=REMOTE_PYTHON)
    assert again.head == head and again.supervisor_pid == s.supervisor_pid
    again.close()

    assert s.remove_worker_allocation(worker, drain_timeout=30) in ("COMPLETED", "CANCELLED")
    cancelled = s.teardown()
    assert head.job_id in cancelled
    wait_until(lambda: not alive(s.supervisor_pid), timeout=30, message="supervisor ended after teardown")


def test_a_killed_client_stops_its_payload_and_the_session_goes_on(remote):
    s = remote()
    s.wait_for_head(timeout=120)
    out = io.StringIO()
    run = s.run([REMOTE_PYTHON, "-c", "import time; print('started', flush=True); time.sleep(120)"], stdout=out)
    wait_until(lambda: "started" in out.getvalue(), timeout=60, message="payload output")
    driver = run.driver_pid
    assert alive(driver)
    run.call.proc.kill()   # the client process's ssh goes away without a word
    t0 = time.monotonic()
    wait_until(lambda: not alive(driver), timeout=30, message="driver stopped after its client vanished")
    print(f"\nclient killed -> driver stopped on the cluster side in {time.monotonic() - t0:.1f}s")
    assert alive(s.supervisor_pid), "the session's supervisor does not depend on any client"
    assert s.head is not None


@pytest.mark.slow
def test_a_head_drained_over_ssh_raises_step_drained_and_hands_over(remote):
    """Full tier only: the drain path again, through the SSH front end. On every change
    tests/test_dagster_assets.py::test_head_drain_surfaces_as_step_drained_and_the_asset_relaunches runs
    the drain and hand-over with real agents and Ray, tests/test_remote_wire.py brings SlurmStepDrained
    back whole over the wire, and integration/test_remote_slurm.py runs the seed's loop over SSH on
    the lab."""
    s = remote()
    s.wait_for_head(timeout=120)
    worker = s.add_worker_allocation(WORKER)
    s.wait_for_worker_allocation(worker, timeout=120)
    head = s.head
    out = io.StringIO()
    run = s.run([REMOTE_PYTHON, "-c", "import time; print('started', flush=True); time.sleep(120)"], stdout=out)
    wait_until(lambda: "started" in out.getvalue(), timeout=60, message="payload output")
    assert head.request_drain(drain_timeout=60) >= 1   # the Head handle drains over SSH
    with pytest.raises(SlurmStepDrained) as drained:
        run.wait(timeout=120)
    assert drained.value.job_id == head.job_id and drained.value.allocation_state == "DRAINING"
    new = s.replace_head(timeout=120)
    assert new.job_id == worker.job_id, "the running worker allocation took over"


def test_a_policy_set_over_ssh_is_run_by_the_detached_supervisor(remote):
    from elastic_ray import ConfigError
    from elastic_ray.autoscale import AutoscalePolicy, Pool
    from elastic_ray.coordinator.head.election import claimant_process
    from elastic_ray.coordinator.scaling import store
    from elastic_ray.protocol.disk import event_log
    from elastic_ray.protocol.disk.events import EventKind

    s = remote()
    s.wait_for_head(timeout=120)
    with pytest.raises(ConfigError) as refused:        # checked on this side: no call, nothing stored
        s.autoscale({"pools": [{"config": {"partition": "cpu"}, "max_allocations": 0}]})
    assert refused.value.field == "pools[0].max_allocations" and store.read_policy(Path(s.path)) is None
    s.autoscale(AutoscalePolicy(pools=[Pool(WORKER)], min_allocations=1, demand_delay=0.5))

    def submitted():
        return [e for e in event_log.read(s.path).events
                if e.kind is EventKind.SCALER_DECISION and e.details.get("action") == "submit"]
    floor = wait_until(submitted, timeout=60, message="the detached supervisor did not keep min_allocations")
    assert "below min_allocations=1" in floor[0].reason and floor[0].job in s.record().workers
    lease = s.record().autoscaler
    assert lease is not None and claimant_process(lease.claimant)[1] == s.supervisor_pid
    s.autoscale(None)
    assert store.read_policy(Path(s.path)).policy is None
    wait_until(lambda: s.record().autoscaler is None, timeout=30, message="the lease was not given back")
