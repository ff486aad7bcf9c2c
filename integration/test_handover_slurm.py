"""The seed's hand-over timing on the real Slurm lab: real sbatch/squeue/srun,
real walltimes and pre-walltime signals, real agents and Ray.

* A head without ``signal_before_timeout`` is drained
  ``ELASTIC_AGENT_HEAD_DRAIN_LEAD`` seconds before its walltime (300 by
  default; shortened here, since Slurm's limits are whole minutes): its
  running payload driver gets SIGTERM and raises SlurmStepDrained, the
  supervisor elects the worker allocation, and the old head ends COMPLETED
  after the head moved, before Slurm's time limit could end it.
* A head with a pre-walltime signal is not moved at that lead, only when its
  signal arrives. Slurm sends ``--signal=TERM@N`` between N and N+30 s before
  the limit (its 30 s timer), so the lead is set well before that window.

The same scenarios run on the local scheduler in tests/test_handover_local.py.

Full tier only (``slow``): each waits two or three minutes for a real
walltime. On every change, tests/test_handover_local.py runs both scenarios
with the local scheduler's walltimes and signals, and
integration/test_agent_slurm.py's ``scancel --signal`` drain checks the same
drain path against real Slurm.
"""

from __future__ import annotations

import sys
import time
import uuid
from pathlib import Path

import pytest

from elastic_ray import Session, SlurmRunAllocationConfig, SlurmStepDrained, SlurmWorkerAllocationConfig
from elastic_ray.config.launcher import RayLauncher
from integration.slurm_helpers import end_session
from tests.helpers import stays
from tests.test_handover_local import assert_handed_over, drained_at

pytestmark = [pytest.mark.slurm, pytest.mark.ray, pytest.mark.slow, pytest.mark.timeout(600)]

REPO = Path(__file__).resolve().parents[1]
WORKER = SlurmWorkerAllocationConfig(partition="gpu-a", num_nodes=1, cpus_per_task=1, mem="1G", time_limit="30")
DRIVER = [sys.executable, "-c", "import signal, sys, time\n"
          "signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))\ntime.sleep(900)"]
# Slurm's timer: a warning for TERM@N comes up to this much earlier than N.
SLURM_TICK = 30.0


@pytest.fixture
def make_session(slurm_lab, monkeypatch):
    monkeypatch.setenv("ELASTIC_AGENT_POLL_INTERVAL", "0.5")
    monkeypatch.setenv("ELASTIC_AGENT_BACKOFF_BASE", "1")
    base = REPO / ".lab" / "test-work" / "handover"
    base.mkdir(parents=True, exist_ok=True)
    made: list[Session] = []

    def make(head: SlurmRunAllocationConfig, lead: float) -> Session:
        monkeypatch.setenv("ELASTIC_AGENT_HEAD_DRAIN_LEAD", str(int(lead)))  # exported to every node by sbatch
        session = Session.create(base / uuid.uuid4().hex[:8], scheduler="slurm", head=head,
                                 worker_allocation=WORKER, supervise=True, supervise_interval=2.0,
                                 launcher=RayLauncher(object_store_memory=100_000_000))
        made.append(session)
        return session

    yield make
    for session in made:
        end_session(session)


def head_and_worker_up(s: Session) -> tuple[str, str, float]:
    s.wait_for_head(timeout=180)
    worker = s.worker_allocations[0]
    s.wait_for_worker_allocation(worker, timeout=180)
    head = s.record().head_job
    end = s.job_info(head).end_time
    assert end is not None, "squeue gave the head no end time"
    return head, worker.job_id, end


def agent_log(s: Session, job: str) -> str:
    return "".join(p.read_text(errors="replace") for p in s.dir.log_dir.glob(f"agent-{job}-*.log"))


def test_lab_head_without_signal_is_drained_ahead_of_its_walltime(make_session):
    lead = 60.0
    s = make_session(SlurmRunAllocationConfig(partition="cpu", time_limit="2", mem="1G", cpus_per_task=1), lead)
    head, worker, end = head_and_worker_up(s)
    assert time.time() < end - lead, "the lab was too slow to start the head before its drain"
    run = s.run(DRIVER)
    with pytest.raises(SlurmStepDrained):
        run.wait(timeout=end - time.time() + 60)
    at = drained_at(s, head)
    assert at is not None, "the head never went DRAINING"
    # squeue's end time has whole seconds; the agent looks twice a second.
    print(f"\nhead {head} drained {end - at:.1f}s before its walltime (lead {lead:g}s)")
    assert end - lead - 2.0 <= at <= end - lead + 10.0, (end - at, lead)
    assert "event=walltime_drain" in agent_log(s, head), "the head's own agent started the drain"
    assert_handed_over(s, head, worker)
    # It left on its own, well before Slurm's time limit.
    assert time.time() < end


def test_lab_head_with_signal_is_not_moved_before_its_signal(make_session):
    lead, warning = 120.0, 50.0
    s = make_session(SlurmRunAllocationConfig(partition="cpu", time_limit="3", mem="1G", cpus_per_task=1,
                                              signal_before_timeout=f"TERM@{int(warning)}"), lead)
    head, worker, end = head_and_worker_up(s)
    assert time.time() < end - lead, "the lab was too slow to start the head before the lead"
    run = s.run(DRIVER)
    # Past the lead and up to Slurm's earliest warning: the head stays, not draining.
    stays(lambda: s.head_pointer() == head and drained_at(s, head) is None,
          seconds=(end - warning - SLURM_TICK - 2.0) - time.time(), interval=1.0,
          message=f"head {head} staying put until its signal",
          show=lambda: (s.head_pointer(), drained_at(s, head)))
    with pytest.raises(SlurmStepDrained):
        run.wait(timeout=end - time.time() + 60)
    at = drained_at(s, head)
    assert at is not None, "the head never went DRAINING"
    print(f"\nhead {head} drained {end - at:.1f}s before its walltime (signal TERM@{warning:g}, lead {lead:g}s)")
    assert end - warning - SLURM_TICK - 2.0 <= at, (end - at,)
    assert "event=signal_drain" in agent_log(s, head) and "event=walltime_drain" not in agent_log(s, head)
    assert_handed_over(s, head, worker)
