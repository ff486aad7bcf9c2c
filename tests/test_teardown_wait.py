"""``Session.teardown(wait=True)``: it returns once the scheduler has let go of
every job of the session, COMPLETING included; without ``wait`` it returns
right after the cancel.

Real LocalScheduler jobs whose node process takes ``LINGER`` seconds to exit
after SIGTERM (as an agent that drains and stops Ray does), so each cancelled
job stays COMPLETING that long. No Ray: the scheduler's states are what is
tested. The real-Slurm side is ``integration/test_session_slurm.py``.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import replace

import pytest

from elastic_ray.config import SlurmRunAllocationConfig, SlurmWorkerAllocationConfig, resolve_head_config
from elastic_ray.config.launcher import RayLauncher
from elastic_ray.coordinator.session import Session
from elastic_ray.errors import ConfigError, TeardownIncomplete
from elastic_ray.protocol.disk.records import SessionInfo, WorkerRecord
from elastic_ray.protocol.disk.session_dir import SessionDir
from elastic_ray.scheduler.base import JobSpec, JobState
from elastic_ray.scheduler.local import LocalScheduler

from helpers import wait_until

LINGER = 3.0  # s a node process takes to exit after SIGTERM
NODE = ("bash", "-c", f"trap 'sleep {LINGER:g}; exit 0' TERM; sleep 300 & wait $!; wait $!")


@pytest.fixture
def lingering(tmp_path, monkeypatch):
    """A session directory with a head and a worker job whose nodes linger after SIGTERM."""
    monkeypatch.setenv("ELASTIC_AGENT_RUNTIME_DIR", str(tmp_path / "agent-runtime"))
    scheduler = LocalScheduler(tmp_path / "local-scheduler")
    job_name = f"er-td-{uuid.uuid4().hex[:8]}"
    head = resolve_head_config(SlurmRunAllocationConfig(partition="cpu", time_limit="10", mem="256M",
                                                        cpus_per_task=1))
    info = SessionInfo(session_id=uuid.uuid4().hex, job_name=job_name, created_at=time.time(),
                       scheduler={"kind": "local", "state_dir": str(scheduler.state_dir)}, head=head.to_dict(),
                       launcher=RayLauncher().to_dict())
    directory = SessionDir.create(tmp_path / "session", info)
    worker = SlurmWorkerAllocationConfig(partition="cpu", num_nodes=1, cpus_per_task=1, mem="256M", time_limit="10")

    def spec(role: str, allocation) -> JobSpec:
        return JobSpec(job_name=job_name, role=role, allocation=allocation, node_argv=NODE,
                       workdir=directory.path, output=str(directory.log_dir / f"{role}-%j.out"))

    try:
        head_job = scheduler.submit(spec("head", head))
        directory.update_allocation(lambda r: replace(r, head_job=head_job))
        directory.write_ray_head(head_job)
        worker_job = scheduler.submit(spec("worker", worker))
        directory.update_allocation(lambda r: r.with_worker(
            WorkerRecord(job_id=worker_job, config=worker.to_dict(), submitted_at=time.time())))
        wait_until(lambda: all(i.state is JobState.RUNNING
                               for i in scheduler.query(job_name, [head_job, worker_job]).values()),
                   timeout=30, message="the jobs to run")
        # the trap is set once bash runs its `sleep`: give it that moment
        wait_until(lambda: all((directory.log_dir / f"{r}-{j}.out").exists()
                               for r, j in (("head", head_job), ("worker", worker_job))),
                   timeout=10, message="the jobs' output files")
        time.sleep(0.5)
        yield {"dir": directory, "scheduler": scheduler, "jobs": {head_job, worker_job}, "job_name": job_name}
    finally:
        scheduler.cancel_by_name(job_name)
        wait_until(lambda: not any(i.state.is_active for i in scheduler.query(job_name).values()),
                   timeout=60, message="the session's jobs to end in the finalizer")


def _states(s) -> dict[str, JobState]:
    return {job: info.state for job, info in s["scheduler"].query(s["job_name"], sorted(s["jobs"])).items()}


def test_teardown_without_wait_returns_while_the_jobs_are_still_active(lingering):
    session = Session.open(lingering["dir"].path, lingering["scheduler"], supervise=False)
    t0 = time.monotonic()
    assert set(session.teardown()) == lingering["jobs"]
    took = time.monotonic() - t0
    states = _states(lingering)
    assert took < LINGER, f"teardown without wait took {took:.1f}s"
    # the cancel is asked for, but the nodes are still there: RUNNING (the request not
    # yet acted on) or COMPLETING
    assert any(state.is_active for state in states.values()), states


def test_teardown_with_wait_returns_once_no_job_is_active(lingering):
    session = Session.open(lingering["dir"].path, lingering["scheduler"], supervise=False)
    news: list[str] = []
    t0 = time.monotonic()
    assert set(session.teardown(wait=True, timeout=60, progress=news.append)) == lingering["jobs"]
    took = time.monotonic() - t0
    states = _states(lingering)
    assert not any(state.is_active for state in states.values()), states
    assert set(states.values()) <= {JobState.CANCELLED, JobState.COMPLETED}
    assert took >= LINGER - 0.5, f"returned after {took:.1f}s, before the nodes could have exited"
    assert news and news[0].startswith("waiting for 2 job(s) to end: "), news


def test_teardown_wait_that_runs_out_names_the_jobs_still_active(lingering):
    session = Session.open(lingering["dir"].path, lingering["scheduler"], supervise=False)
    with pytest.raises(TeardownIncomplete) as caught:
        session.teardown(wait=True, timeout=0.5)
    assert set(caught.value.cancelled) == lingering["jobs"]   # the cancel itself went through
    (error,) = caught.value.errors
    assert "still active 0.5s after the cancel" in error
    assert all(job in error for job in lingering["jobs"])


@pytest.mark.parametrize("kw, field", [({"wait": "yes"}, "wait"), ({"wait": True, "timeout": 0}, "timeout"),
                                       ({"wait": True, "timeout": "60"}, "timeout"),
                                       ({"wait": True, "timeout": float("nan")}, "timeout")])
def test_bad_wait_arguments_are_refused_before_anything_is_cancelled(lingering, kw, field):
    session = Session.open(lingering["dir"].path, lingering["scheduler"], supervise=False)
    with pytest.raises(ConfigError, match=f"^{field}=.*: must be") as caught:
        session.teardown(**kw)
    assert caught.value.field == field
    assert set(_states(lingering).values()) == {JobState.RUNNING}
