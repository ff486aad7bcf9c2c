"""A wait on a queued job says why it is queued: Slurm's pending reason
(squeue's %r; the local scheduler gives Resources/Priority) in the progress
lines and the timeout errors of wait_for_head, wait_for_worker_allocation
(the CLI's add-worker --wait) and the head assessment behind ready_head and
replace_head."""

from __future__ import annotations

import pytest

from elastic_ray.config import SlurmRunAllocationConfig, SlurmWorkerAllocationConfig
from elastic_ray.coordinator.head import election
from elastic_ray.coordinator.session import Session
from elastic_ray.protocol.disk.records import AllocationRecord
from elastic_ray.scheduler.base import JobInfo, JobState, Scheduler, state_text

HEAD = SlurmRunAllocationConfig(partition="cpu", time_limit="60")


@pytest.mark.parametrize("info, text", [
    (None, "?"),
    (JobInfo("7", "er-x", JobState.PENDING, reason="Priority"), "PENDING (Priority)"),
    (JobInfo("7", "er-x", JobState.PENDING, reason="QOSMaxJobsPerUserLimit"), "PENDING (QOSMaxJobsPerUserLimit)"),
    (JobInfo("7", "er-x", JobState.PENDING, reason="None"), "PENDING"),    # squeue's word for no reason yet
    (JobInfo("7", "er-x", JobState.PENDING, reason=""), "PENDING"),
    (JobInfo("7", "er-x", JobState.RUNNING, reason="None"), "RUNNING"),
    (JobInfo("7", "er-x", JobState.RUNNING, reason="Prolog"), "RUNNING"),  # a reason is shown only while queued
])
def test_state_text(info, text):
    assert state_text(info) == text


def test_a_queued_head_is_assessed_with_its_reason():
    record = AllocationRecord(head_job="7")
    jobs = {"7": JobInfo("7", "er-x", JobState.PENDING, reason="ReqNodeNotAvail, Reserved for maintenance")}
    assessment = election.assess_head(record, jobs, head_alive=False, now=0.0)
    assert assessment.condition is election.HeadCondition.QUEUED
    assert assessment.why == "head job 7 is still PENDING (ReqNodeNotAvail, Reserved for maintenance)"


class _QueuedScheduler(Scheduler):
    """Accepts submissions and keeps every job PENDING for ``reason``."""

    kind = "local"

    def __init__(self, state_dir, reason: str):
        self.state_dir = state_dir
        self.reason = reason
        self.jobs: list[str] = []

    def submit(self, spec):
        self.jobs.append(str(100 + len(self.jobs)))
        return self.jobs[-1]

    def query(self, job_name, job_ids=(), *, user=None):
        return {job: JobInfo(job, job_name, JobState.PENDING, reason=self.reason) for job in self.jobs}

    def cancel(self, job_id):
        pass

    def cancel_by_name(self, job_name, *, user=None):
        pass

    def signal(self, job_id, signal_name, *, batch=False):
        pass

    def test_only(self, spec):
        return 0.0


@pytest.fixture
def queued(tmp_path):
    session = Session.create(tmp_path / "s", head=HEAD, scheduler=_QueuedScheduler(tmp_path / "state", "Priority"),
                             supervise=False)
    yield session
    session.close()


def test_wait_for_head_shows_the_pending_reason(queued):
    seen: list[str] = []
    with pytest.raises(TimeoutError) as caught:
        queued.wait_for_head(timeout=1.0, progress=seen.append)
    head = queued.record().head_job
    assert f"head {head}: PENDING (Priority)" in seen
    assert f"no ready head within 1s (head {head}: PENDING (Priority))" in str(caught.value)


def test_wait_for_worker_allocation_shows_the_pending_reason(queued):
    queued.scheduler.reason = "QOSMaxJobsPerUserLimit"
    worker = queued.add_worker_allocation(SlurmWorkerAllocationConfig(partition="gpu-a", time_limit="30"))
    seen: list[str] = []
    with pytest.raises(TimeoutError) as caught:
        queued.wait_for_worker_allocation(worker, timeout=1.0, progress=seen.append)
    line = f"job {worker.job_id}: PENDING (QOSMaxJobsPerUserLimit), 0/1 nodes joined"
    assert seen == [line]
    assert f"not joined within 1s ({line})" in str(caught.value)
