"""The coordinator for real on the local scheduler: real agents, real Ray.

The same code runs against Slurm in integration/test_coordinator_slurm.py;
here the scheduler is the local emulation so the scenario runs anywhere.
"""

from __future__ import annotations

import sys
import time

import pytest

from elastic_ray import SlurmAllocationEnded, SlurmRunAllocationConfig, SlurmWorkerAllocationConfig
from elastic_ray.coordinator.session import Session
from elastic_ray.config.launcher import RayLauncher
from elastic_ray.protocol.disk import event_log
from elastic_ray.protocol.disk.events import EventKind
from elastic_ray.protocol.disk.records import AgentState
from tests.helpers import committed_units as committed, stays, wait_until

pytestmark = [pytest.mark.ray, pytest.mark.timeout(300)]

# The payload shipped with the demo commits each unit to a file once Ray
# computed it; a relaunch skips what was committed.
PAYLOAD = [sys.executable, "-m", "elastic_ray.demo.payload"]
HEAD = SlurmRunAllocationConfig(partition="cpu", time_limit="30", mem="2G")


@pytest.fixture
def new_session(tmp_path, monkeypatch):
    """Sessions on the local scheduler, torn down (all jobs ended) afterwards."""
    monkeypatch.setenv("ELASTIC_AGENT_BACKOFF_BASE", "1")
    monkeypatch.setenv("ELASTIC_AGENT_POLL_INTERVAL", "0.5")
    made: list[Session] = []

    def make(**kwargs) -> Session:
        kwargs.setdefault("head", HEAD)
        kwargs.setdefault("launcher", RayLauncher(object_store_memory=100_000_000))
        kwargs.setdefault("supervise", False)
        made.append(Session.create(tmp_path / f"session{len(made)}", scheduler="local", **kwargs))
        return made[-1]

    yield make
    for s in made:
        s.teardown()
        wait_until(lambda: all(i.state.is_final for i in s.query().values()), timeout=60,
                   message="session jobs did not end after teardown")


@pytest.fixture
def session(new_session):
    return new_session(supervise=True)


@pytest.mark.slow
def test_failover_loop_commits_every_unit_exactly_once(session, tmp_path):
    """Full tier only. The seed's loop on the local scheduler. On every change the lab runs the same
    loop on real Slurm: the fault matrix's per-change scenarios (integration/test_faults_slurm.py:
    elector-killed, worker-network-cut, slurmctld-restart; each checks every unit committed once)
    and integration/test_dagster_slurm.py::test_head_cancelled_mid_asset_seed_loop."""
    session.wait_for_head(timeout=90)
    worker = session.add_worker_allocation(SlurmWorkerAllocationConfig(
        partition="gpu-a", num_nodes=1, cpus_per_task=2, mem="2G", time_limit="30"))
    session.wait_for_worker_allocation(worker, timeout=90)
    commits = tmp_path / "commits.txt"
    total = 30
    argv = PAYLOAD + [str(commits), str(total)]

    first_head = session.record().head_job
    run = session.run(argv)
    wait_until(lambda: len(committed(commits)) >= 5, timeout=90, message="driver made no progress")
    session.scheduler.cancel(first_head)
    t_lost = time.monotonic()
    with pytest.raises(SlurmAllocationEnded) as ended:
        run.wait(timeout=60)
    assert ended.value.allocation_state in ("CANCELLED", "COMPLETING", "REPLACED")

    head = session.replace_head(timeout=120)
    t_elected = time.monotonic()
    # The worker allocation hosts the head now: no new allocation was queued.
    assert head.job_id == worker.job_id
    assert first_head in session.record().predecessors
    wait_until(lambda: any(s.state is AgentState.JOINED and s.head_job == head.job_id
                           for s in session.node_states(worker.job_id).values()),
               timeout=90, message="the worker did not rejoin the new head")
    t_rejoined = time.monotonic()
    # The elected node's worker started its Ray only after the head its own
    # node hosts registered its raylet (else Ray's start sleeps 2 s, issue 26).
    lines = (session.dir.log_dir / f"worker-{worker.job_id}.out").read_text(errors="replace").splitlines()
    asked = next(i for i, line in enumerate(lines) if "event=request" in line and "kind=host_head" in line)
    gate = next(i for i, line in enumerate(lines)   # (not_registered: it waited its 3 s, then went ahead)
                if i > asked and ("event=hosted_head_registered" in line or "event=hosted_head_not_registered" in line))
    start = next(i for i, line in enumerate(lines) if i > asked and "event=ray_memory" in line
                 and "role=worker" in line and "hosted=False" in line)
    assert gate < start, lines[asked:start + 1]
    print(f"\nhead lost -> replace_head returned {t_elected - t_lost:.1f}s; "
          f"-> worker rejoined {t_rejoined - t_lost:.1f}s")

    result = session.run(argv, head=head).wait(timeout=180)
    assert result.returncode == 0
    units = committed(commits)
    assert sorted(units) == list(range(total)), "every unit committed exactly once"
    # The run's history tells the same story. The first driver's end and the
    # election race (the supervisor may elect before the driver is told), so
    # each is checked in its own order, and both come before the second run.
    events = event_log.read(session.dir.path).events
    K = EventKind
    payload = [(e.kind, e.job, e.reason) for e in events if e.kind in (K.PAYLOAD_STARTED, K.PAYLOAD_FINISHED)]
    assert payload == [(K.PAYLOAD_STARTED, first_head, None), (K.PAYLOAD_FINISHED, first_head, "SlurmAllocationEnded"),
                       (K.PAYLOAD_STARTED, head.job_id, None), (K.PAYLOAD_FINISHED, head.job_id, "ok")]
    election = [e for e in events if e.kind in (K.ELECTION_STARTED, K.ELECTION_WON, K.HEAD_MOVED)]
    assert [(e.kind, e.job) for e in election] == [(K.ELECTION_STARTED, None), (K.ELECTION_WON, head.job_id),
                                                   (K.HEAD_MOVED, head.job_id)]
    assert election[0].details["previous"] == first_head and election[2].details["previous"] == first_head
    assert election[2].details["hosted_on_worker"] is True
    second = next(i for i, e in enumerate(events) if e.kind is K.PAYLOAD_STARTED and e.job == head.job_id)
    assert events.index(election[2]) < second


def test_launch_against_a_replaced_head_raises_replaced(session):
    session.wait_for_head(timeout=90)
    head = session.replace_head(timeout=30)  # healthy: returned unchanged
    assert head.job_id == session.record().head_job
    session.dir.write_ray_head(str(int(head.job_id) + 1000))  # the session moved on
    with pytest.raises(SlurmAllocationEnded) as ended:
        session.run([sys.executable, "-c", "pass"], head=head)
    assert ended.value.allocation_state == "REPLACED"
    session.dir.write_ray_head(head.job_id)


REPLACE_HEAD = r'''
import json, sys, time
from elastic_ray.coordinator.session import Session
s = Session.open(sys.argv[1], supervise=False)
t0 = time.time()
head = s.replace_head(timeout=150)
print(json.dumps({"job": head.job_id, "address": head.address, "seconds": time.time() - t0}))
'''


@pytest.mark.slow
def test_sixteen_processes_replace_head_at_once_elect_once(new_session, tmp_path):
    """Full tier only. On every change the fault matrix's elector-killed scenario (lab) has an
    elector killed holding the claim, then three more processes and the payload loop racing for
    the election it left (one head, no second submission), and tests/test_election.py and
    tests/test_handover_rules.py decide the claim by table."""
    s = new_session()
    s.wait_for_head(timeout=90)
    worker = s.add_worker_allocation(SlurmWorkerAllocationConfig(
        partition="gpu-a", num_nodes=1, cpus_per_task=1, mem="1G", time_limit="30"))
    s.wait_for_worker_allocation(worker, timeout=90)
    old_head = s.record().head_job
    s.scheduler.cancel(old_head)
    script = tmp_path / "replace_head.py"
    script.write_text(REPLACE_HEAD)
    import json
    import subprocess
    procs = [subprocess.Popen([sys.executable, str(script), str(s.path)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(16)]
    answers = []
    for proc in procs:
        out, err = proc.communicate(timeout=200)
        assert proc.returncode == 0, err[-2000:]
        answers.append(json.loads(out.strip().splitlines()[-1]))
    assert len({(a["job"], a["address"]) for a in answers}) == 1, answers
    rec = s.record()
    assert rec.head_job == answers[0]["job"] == worker.job_id
    # One election: the old head is the only predecessor, and no new head job was submitted.
    assert rec.predecessors == (old_head,)
    assert set(s.query()) == {old_head, worker.job_id}
    print(f"\n16 x replace_head: {min(a['seconds'] for a in answers):.1f}-"
          f"{max(a['seconds'] for a in answers):.1f}s")


def test_supervisor_notices_head_loss_and_keeps_a_worker(new_session):
    worker_shape = SlurmWorkerAllocationConfig(partition="gpu-a", num_nodes=1, cpus_per_task=1, mem="1G",
                                               time_limit="30")
    s = new_session(supervise=True, supervise_interval=2.0, worker_allocation=worker_shape)
    s.wait_for_head(timeout=90)
    first = s.worker_allocations[0]
    s.wait_for_worker_allocation(first, timeout=90)
    # Keep a worker: the only worker allocation ends; the session submits another.
    s.scheduler.cancel(first.job_id)
    wait_until(lambda: [w.job_id for w in s.worker_allocations if w.job_id != first.job_id],
               timeout=30, message="no worker allocation was submitted again")
    second = next(w for w in s.worker_allocations if w.job_id != first.job_id)
    s.wait_for_worker_allocation(second, timeout=90)
    # Head loss with no caller: the supervisor notices from the heartbeat. Its periodic check (every
    # 2 s so far) would also see the cancel in the scheduler's answer and elect before the heartbeat
    # changes (seen: the election 0.9 s after the cancel, no head_lost); so the periodic check is put
    # 10 minutes away first (after the one already due), and only the heartbeat is left to notice.
    s.supervisor.interval = 600.0
    checks = s.supervisor.checks
    wait_until(lambda: s.supervisor.checks > checks, timeout=30, message="the supervisor's last periodic check")
    head = s.record().head_job
    wait_until(lambda: s.observe_head().alive, timeout=30, message="head heartbeat not seen")
    t0 = time.time()
    s.scheduler.cancel(head)
    # A cancelled head first drains (its heartbeat says so), then stops.
    signs = ("head_draining", "head_lost")
    wait_until(lambda: any(what in signs and at >= t0 for at, what in s.supervisor.noticed),
               timeout=30, message="the supervisor did not notice the lost head")
    noticed = next(at for at, what in s.supervisor.noticed if what in signs and at >= t0)
    wait_until(lambda: s.record().head_job != head and s.head is not None, timeout=120,
               message="the supervisor did not elect a new head")
    print(f"\nhead cancelled -> supervisor noticed {noticed - t0:.1f}s; new head {s.record().head_job}")


@pytest.mark.slow
def test_head_drain_hands_over_and_drivers_see_step_drained(new_session):
    """Full tier. On every change the same path runs through Dagster
    (``test_dagster_assets::test_head_drain_surfaces_as_step_drained_and_the_asset_relaunches``)
    and through the walltime lead
    (``test_handover_local::test_a_head_without_signal_is_drained_ahead_of_its_walltime``)."""
    from elastic_ray import AllocationFailed, SlurmStepDrained

    s = new_session()
    s.wait_for_head(timeout=90)
    worker = s.add_worker_allocation(SlurmWorkerAllocationConfig(
        partition="gpu-a", num_nodes=1, gpus_per_node=2, cpus_per_task=1, mem="1G", time_limit="30"))
    s.wait_for_worker_allocation(worker, timeout=90)

    # Waiting on an allocation that cannot start yet: TimeoutError naming the job.
    big = s.add_worker_allocation(SlurmWorkerAllocationConfig(
        partition="gpu-a", num_nodes=1, gpus_per_node=4, cpus_per_task=1, mem="1G", time_limit="30"))
    with pytest.raises(TimeoutError, match=f"worker allocation {big.job_id} not joined"):
        s.wait_for_worker_allocation(big, timeout=2)
    # ... and a clear error once it ended without joining.
    s.scheduler.cancel(big.job_id)
    with pytest.raises(AllocationFailed) as failed:
        s.wait_for_worker_allocation(big, timeout=30)
    assert failed.value.state == "CANCELLED" and failed.value.job_id == big.job_id

    # request_drain() on a healthy head: its drivers get SIGTERM, the next
    # head is elected, and the old head stays until the head has moved.
    old = s.replace_head(timeout=30)
    run = s.run([sys.executable, "-c", "import signal, sys, time\n"
                 "signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))\ntime.sleep(120)"])
    assert old.request_drain(drain_timeout=120) == 1
    with pytest.raises(SlurmStepDrained):
        run.wait(timeout=30)
    assert s.query([old.job_id])[old.job_id].state.value == "RUNNING", "the draining head stays"
    new = s.replace_head(timeout=120)
    assert new.job_id == worker.job_id != old.job_id
    wait_until(lambda: s.query([old.job_id])[old.job_id].state.is_final, timeout=60,
               message="the old head did not leave after the head moved")
    assert s.query([old.job_id])[old.job_id].state.value == "COMPLETED"


def test_without_workers_replace_head_submits_a_new_head_allocation(new_session):
    s = new_session(head=SlurmRunAllocationConfig(partition="cpu", time_limit="30", mem="1G"))
    s.wait_for_head(timeout=90)
    old = s.replace_head(timeout=30)
    s.scheduler.cancel(old.job_id)
    wait_until(lambda: s.query([old.job_id])[old.job_id].state.is_final, timeout=30,
               message="the old head did not end")
    new = s.replace_head(timeout=120)
    assert new.job_id != old.job_id and new.address != old.address
    rec = s.record()
    assert rec.head_job == new.job_id and old.job_id in rec.predecessors and rec.successor is None
    # The new head keeps serving: it must not mistake the old pointer for a move.
    stays(lambda: (h := s.head) is not None and h.job_id == new.job_id, 3, 0.3, f"head {new.job_id} staying healthy",
          show=s.observe_head)
    assert s.replace_head(timeout=10).job_id == new.job_id
