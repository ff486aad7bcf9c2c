"""Sessions cannot touch each other, on the real Slurm lab.

The same scenarios as tests/test_session_isolation.py, with real sbatch,
squeue and scancel: two sessions given one job name (tearing one down leaves
the other running, the CLI neither cancels nor waits for the other's jobs);
a submission whose sbatch answer was lost is adopted by its ``--comment``
marker, and one queued after its failure is cancelled at the next poll. The
jobs run ``sleep`` (no Ray), so this checks the Slurm side only.

The lab runs every job as root, so a second *user* is checked through the
``--user`` filter in tests/test_scheduler_contract.py (another user's view
of our jobs) rather than with a second account here.
"""

from __future__ import annotations

import importlib.util
import time
import uuid
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from elastic_ray.cli.main import main
from elastic_ray.config import SlurmRunAllocationConfig, SlurmWorkerAllocationConfig
from elastic_ray.config.launcher import RayLauncher
from elastic_ray.coordinator.session import Session
from elastic_ray.errors import SchedulerError
from elastic_ray.protocol.disk.records import SessionInfo, WorkerRecord
from elastic_ray.protocol.disk.session_dir import SessionDir
from elastic_ray.scheduler.base import JobSpec, JobState
from elastic_ray.scheduler.slurm import SlurmScheduler

_spec = importlib.util.spec_from_file_location(
    "elastic_ray_tests_helpers", Path(__file__).resolve().parent.parent / "tests" / "helpers.py")
_helpers = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_helpers)
wait_until, stays = _helpers.wait_until, _helpers.stays

pytestmark = pytest.mark.slurm

TIMEOUT = 90.0
WORKER = SlurmWorkerAllocationConfig(partition="cpu", num_nodes=1, time_limit="5")
HEAD = SlurmRunAllocationConfig(partition="cpu", num_nodes=1, time_limit="5")


@pytest.fixture
def scheduler(slurm_lab) -> SlurmScheduler:
    return SlurmScheduler(slurm_conf=slurm_lab.conf, timeout=30.0)


@pytest.fixture
def job_name(scheduler):
    name = f"er-iso-{uuid.uuid4().hex[:8]}"
    try:
        yield name
    finally:
        scheduler.cancel_by_name(name)  # the test's own name and user: nothing else


def sleep_spec(session: Session, role: str = "worker") -> JobSpec:
    return JobSpec(job_name=session.job_name, role=role, allocation=HEAD if role == "head" else WORKER,
                   node_argv=("sleep", "300"), workdir=session.path,
                   output=str(session.dir.log_dir / f"{role}-%j.out"))


def add_worker(session: Session) -> str:
    return session.jobs.submit(sleep_spec(session), WORKER, lambda r, job: r.with_worker(
        WorkerRecord(job_id=job, config=WORKER.to_dict(), submitted_at=time.time())))


def make_session(root: Path, scheduler: SlurmScheduler, job_name: str, label: str) -> Session:
    info = SessionInfo(session_id=uuid.uuid4().hex, job_name=job_name, created_at=time.time(),
                       scheduler={"kind": "slurm"}, head=HEAD.to_dict(), launcher=RayLauncher().to_dict(),
                       user=scheduler.user)
    session = Session(SessionDir.create(root / label, info), scheduler, supervise=False)
    session.jobs.submit(sleep_spec(session, "head"), HEAD, lambda r, job: replace(r, head_job=job))
    add_worker(session)
    return session


def running(scheduler: SlurmScheduler, name: str, ids) -> bool:
    jobs = scheduler.query(name, ids)
    return all(jobs[j].state is JobState.RUNNING for j in ids)


def ended(scheduler: SlurmScheduler, name: str, ids) -> bool:
    jobs = scheduler.query(name, ids)
    return all(jobs[j].state.is_final for j in ids)


def test_tearing_down_one_of_two_same_named_sessions_leaves_the_other_running(slurm_lab, scheduler, job_name):
    root = slurm_lab.shared_dir(f"isolation/{job_name}")
    first, second = make_session(root, scheduler, job_name, "a"), make_session(root, scheduler, job_name, "b")
    a_ids = sorted(first.record().recorded_jobs, key=int)
    b_ids = sorted(second.record().recorded_jobs, key=int)
    wait_until(lambda: running(scheduler, job_name, a_ids + b_ids), TIMEOUT, 1.0, "all four jobs running")
    assert sorted(first.query(), key=int) == a_ids and sorted(second.query(), key=int) == b_ids

    result = CliRunner().invoke(main, ["session", "teardown", str(first.path), "--timeout", "60"],
                                obj={"scheduler": scheduler}, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert ended(scheduler, job_name, a_ids)
    stays(lambda: running(scheduler, job_name, b_ids), 5.0, 1.0, "the other session's jobs keep running")
    assert sorted(second.teardown(), key=int) == b_ids


class _LostAnswer(SlurmScheduler):
    """sbatch queues the job, but its answer is lost (as on a timeout)."""

    def submit(self, spec):
        super().submit(spec)
        raise SchedulerError("sbatch did not finish within 30 s", argv=("sbatch",))


class _QueuedLate(SlurmScheduler):
    """sbatch fails; the test queues the kept spec afterwards (a late controller)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.kept: list[JobSpec] = []

    def submit(self, spec):
        self.kept.append(spec)
        raise SchedulerError("sbatch did not finish within 30 s", argv=("sbatch",))


def test_lost_sbatch_answers_are_adopted_or_cancelled_never_left(slurm_lab, scheduler, job_name):
    root = slurm_lab.shared_dir(f"isolation/{job_name}")
    session = make_session(root, scheduler, job_name, "s")
    session.jobs.scheduler = _LostAnswer(slurm_conf=slurm_lab.conf, timeout=30.0)
    adopted = add_worker(session)
    assert adopted in session.record().workers and not session.record().intents

    late = _QueuedLate(slurm_conf=slurm_lab.conf, timeout=30.0)
    session.jobs.scheduler = late
    with pytest.raises(SchedulerError):
        add_worker(session)
    session.jobs.scheduler = scheduler
    stray = scheduler.submit(late.kept[-1])
    assert stray not in session.query()
    wait_until(lambda: ended(scheduler, job_name, [stray]), TIMEOUT, 1.0, "the stray to be cancelled")
    assert scheduler.query(job_name, [stray])[stray].state is JobState.CANCELLED
    assert scheduler.query(job_name, [adopted])[adopted].state.is_active  # the adopted one is kept
    session.teardown()
