"""One contract, two backends: what every Scheduler must do, identically.

Each test runs against the embedded local scheduler and against the real
Slurm lab (``-m slurm``; the ``slurm_lab`` fixture starts or reuses it). The
test bodies do not know which backend they talk to: the ``backend`` fixture
gives them a scheduler, a working directory every node sees (never /tmp,
which is private per lab node) and a way to make job names that it cancels
at teardown.
"""

from __future__ import annotations

import shutil
import signal
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest

from elastic_ray.config import SlurmRunAllocationConfig as Alloc
from elastic_ray.errors import SchedulerError
from elastic_ray.scheduler.base import JobInfo, JobSpec, JobState, Scheduler
from helpers import marker_events, stays, wait_until, write_marker_script

# Generous enough for Slurm (start within ~1 s, a scheduling pass every few
# seconds); the local backend needs a fraction of it.
TIMEOUT = 45.0
# An id no lab will reach (Slurm's default MaxJobId is 67043328).
UNKNOWN_ID = "66000001"


@dataclass
class Backend:
    kind: str
    scheduler: Scheduler
    workdir: Path
    #: how many calls of the underlying system ``query`` has made so far
    query_calls: Callable[[], int]
    #: True where each node has its own hostname (Slurm lab); the local
    #: backend's nodes share the machine's hostname and differ by SLURMD_NODENAME
    distinct_hostnames: bool
    names: list[str] = field(default_factory=list)

    def name(self) -> str:
        """A fresh job name, cancelled (with everything of that name) at teardown."""
        name = f"ct-{uuid.uuid4().hex[:10]}"
        self.names.append(name)
        return name

    def spec(self, name: str, argv: tuple[str, ...], **alloc) -> JobSpec:
        return JobSpec(job_name=name, role="worker", allocation=Alloc(**alloc), node_argv=argv,
                       workdir=self.workdir, output=f"{name}-%j.out")

    def output(self, name: str, job_id: str) -> Path:
        return self.workdir / f"{name}-{job_id}.out"

    def info(self, name: str, job_id: str) -> JobInfo:
        return self.scheduler.query(name, [job_id])[job_id]

    def wait_state(self, name: str, job_id: str, *states: JobState, timeout: float = TIMEOUT) -> JobInfo:
        wanted = set(states)
        return wait_until(lambda: (info := self.info(name, job_id)).state in wanted and info, timeout,
                          interval=0.1, message=f"job {job_id} in {sorted(s.value for s in wanted)}")


def _local_backend(tmp_path: Path) -> tuple[Backend, Callable[[], None]]:
    from elastic_ray.scheduler.local import LocalCluster, LocalScheduler
    from elastic_ray.scheduler.local.procs import send, send_group
    from elastic_ray.scheduler.local.record import JobRecord

    scheduler = LocalScheduler(tmp_path / "state", LocalCluster.default(kill_wait=2.0))
    workdir = tmp_path / "work"
    workdir.mkdir()

    def kill_leftovers() -> None:
        # By recorded pid + start time, never by name.
        records, _ = scheduler.store.scan()
        record: JobRecord
        for record in records.values():
            for proc in record.node_procs:
                send_group(proc, signal.SIGKILL)
            if record.supervisor is not None:
                send(record.supervisor, signal.SIGKILL)

    backend = Backend("local", scheduler, workdir, lambda: scheduler.calls["query"], distinct_hostnames=False)
    return backend, kill_leftovers


def _slurm_backend(lab) -> tuple[Backend, Callable[[], None]]:  # noqa: ANN001 - integration's SlurmLab
    from elastic_ray.scheduler.slurm import SlurmScheduler

    scheduler = SlurmScheduler(slurm_conf=lab.conf)
    workdir = lab.shared_dir(f"contract-{uuid.uuid4().hex[:8]}")
    backend = Backend("slurm", scheduler, workdir, lambda: scheduler.calls["squeue"], distinct_hostnames=True)
    return backend, lambda: shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture(params=["local", pytest.param("slurm", marks=pytest.mark.slurm)])
def backend(request, tmp_path) -> Iterator[Backend]:
    if request.param == "local":
        made, cleanup = _local_backend(tmp_path)
    else:
        made, cleanup = _slurm_backend(request.getfixturevalue("slurm_lab"))
    try:
        yield made
    finally:
        try:
            for name in made.names:
                made.scheduler.cancel_by_name(name)
            if made.kind == "slurm":
                # Wait until the cancelled jobs are gone before deleting their directory.
                for name in made.names:
                    wait_until(lambda: all(i.state.is_final for i in made.scheduler.query(name).values()),
                               TIMEOUT, 0.5, f"jobs named {name} ended")
        finally:
            cleanup()


@pytest.fixture
def script(backend) -> Path:
    return write_marker_script(backend.workdir)


def _ready(marker: Path, count: int = 1) -> Callable[[], bool]:
    return lambda: len([e for e in marker_events(marker) if e[0] == "ready"]) >= count


# --------------------------------------------------------------------------


def test_submit_runs_to_completed_with_output(backend, script):
    name = backend.name()
    marker, release = backend.workdir / "m", backend.workdir / "release"
    job = backend.scheduler.submit(backend.spec(name, (sys.executable, str(script), str(marker),
                                                       "--exit-when", str(release))))
    first = backend.info(name, job)
    assert first.state in (JobState.PENDING, JobState.RUNNING), first
    assert first.name == name and first.job_id == job
    running = backend.wait_state(name, job, JobState.RUNNING)
    assert running.nodes and running.start_time is not None
    wait_until(_ready(marker), TIMEOUT, 0.1, "node command started")
    release.touch()
    done = backend.wait_state(name, job, JobState.COMPLETED)
    assert done.state.is_final and done.time_left is None
    output = wait_until(lambda: "says hello" in (t := backend.output(name, job).read_text()) and t,
                        TIMEOUT, 0.1, "the node command's output in the job's output file")
    assert "node 0 on " in output


def test_two_node_job_runs_once_per_node(backend, script):
    name = backend.name()
    marker, release = backend.workdir / "m", backend.workdir / "release"
    release.touch()  # each node notes "ready", then exits at once
    job = backend.scheduler.submit(backend.spec(name, (sys.executable, str(script), str(marker),
                                                       "--exit-when", str(release)), num_nodes=2))
    info = backend.wait_state(name, job, JobState.COMPLETED)
    ready = [e for e in marker_events(marker) if e[0] == "ready"]
    assert len(ready) == 2, ready
    assert sorted(e[1] for e in ready) == ["0", "1"]
    node_names = {e[2] for e in ready}
    assert len(node_names) == 2 and node_names == set(info.nodes)
    if backend.distinct_hostnames:
        assert {e[3] for e in ready} == node_names


def test_cancel_running_job(backend, script):
    name = backend.name()
    marker = backend.workdir / "m"
    job = backend.scheduler.submit(backend.spec(name, (sys.executable, str(script), str(marker))))
    backend.wait_state(name, job, JobState.RUNNING)
    wait_until(_ready(marker), TIMEOUT, 0.1, "node command started")
    backend.scheduler.cancel(job)
    info = backend.wait_state(name, job, JobState.CANCELLED)
    assert info.state.is_final
    assert "term" in [e[0] for e in marker_events(marker)]
    backend.scheduler.cancel(job)  # cancelling an ended job is not an error


def test_cancel_pending_job(backend):
    name = backend.name()
    # gpub-1 has 2 GPUs: the first job takes both, the second must wait.
    hog = backend.scheduler.submit(backend.spec(name, ("sleep", "300"), partition="gpu-b", gpus_per_node=2))
    backend.wait_state(name, hog, JobState.RUNNING)
    waiting = backend.scheduler.submit(backend.spec(name, ("true",), partition="gpu-b", gpus_per_node=2))
    assert backend.info(name, waiting).state is JobState.PENDING
    backend.scheduler.cancel(waiting)
    info = backend.wait_state(name, waiting, JobState.CANCELLED)
    # It never got nodes. (Its start_time is not compared: Slurm sets a
    # never-started job's StartTime to its EndTime; the local backend leaves it None.)
    assert info.nodes == ()
    assert backend.info(name, hog).state is JobState.RUNNING
    backend.scheduler.cancel(hog)
    backend.wait_state(name, hog, JobState.CANCELLED)


def test_signal_reaches_the_node_command(backend, script):
    name = backend.name()
    marker = backend.workdir / "m"
    job = backend.scheduler.submit(backend.spec(name, (sys.executable, str(script), str(marker))))
    wait_until(_ready(marker), TIMEOUT, 0.1, "node command ready")
    backend.scheduler.signal(job, "USR1")
    wait_until(lambda: "usr1" in [e[0] for e in marker_events(marker)], TIMEOUT, 0.1, "USR1 marker")
    assert backend.info(name, job).state is JobState.RUNNING  # a signal is not a cancel
    backend.scheduler.cancel(job)
    backend.wait_state(name, job, JobState.CANCELLED)


def test_query_reports_all_jobs_of_a_name_in_one_call(backend):
    name, other = backend.name(), backend.name()
    jobs = [backend.scheduler.submit(backend.spec(name, ("sleep", "300"))) for _ in range(3)]
    stranger = backend.scheduler.submit(backend.spec(other, ("sleep", "300")))
    wait_until(lambda: all(i.state is JobState.RUNNING for i in backend.scheduler.query(name).values()),
               TIMEOUT, 0.2, "three jobs running")
    before = backend.query_calls()
    result = backend.scheduler.query(name)
    assert backend.query_calls() - before == 1
    assert sorted(result) == sorted(jobs)
    assert stranger not in result
    assert all(i.name == name and i.state is JobState.RUNNING for i in result.values())
    # Asking for an id of another name adds it to the answer.
    assert set(backend.scheduler.query(name, [stranger])) == set(jobs) | {stranger}
    backend.scheduler.cancel_by_name(name)
    wait_until(lambda: all(i.state is JobState.CANCELLED for i in backend.scheduler.query(name).values()),
               TIMEOUT, 0.2, "all three cancelled by name")
    assert backend.info(other, stranger).state is JobState.RUNNING  # another name is left alone


# A user that exists on the lab and on this machine and never submits here.
OTHER_USER = "nobody"


def test_queries_and_cancels_act_for_one_user_only(backend):
    """squeue/scancel ``--user``: to another user, our same-named jobs are not
    theirs, so by name they are neither listed nor cancelled; by id, a cancel
    filtered to another user skips them; the owner and the comment are reported."""
    name = backend.name()
    jobs = [backend.scheduler.submit(replace(backend.spec(name, ("sleep", "300")), comment=f"elastic-ray:ct:{i}"))
            for i in range(2)]
    wait_until(lambda: all(i.state is JobState.RUNNING for i in backend.scheduler.query(name, jobs).values()),
               TIMEOUT, 0.2, "both jobs running")
    mine = backend.scheduler.query(name)
    assert sorted(mine) == sorted(jobs)
    assert {(i.user, i.comment) for i in mine.values()} == {(backend.scheduler.user, f"elastic-ray:ct:{i}")
                                                          for i in range(2)}
    assert backend.scheduler.query(name, user=OTHER_USER) == {}
    backend.scheduler.cancel_by_name(name, user=OTHER_USER)
    backend.scheduler.cancel_jobs(jobs, user=OTHER_USER)
    stays(lambda: all(i.state is JobState.RUNNING for i in backend.scheduler.query(name, jobs).values()), 3.0,
          message="jobs of another user's name and ids are left running")
    backend.scheduler.cancel_jobs([jobs[0], UNKNOWN_ID])  # an unknown id among them is not an error
    backend.wait_state(name, jobs[0], JobState.CANCELLED)
    assert backend.info(name, jobs[1]).state is JobState.RUNNING


def test_unknown_id_is_ended_unknown(backend):
    name = backend.name()
    result = backend.scheduler.query(name, [UNKNOWN_ID])
    assert set(result) == {UNKNOWN_ID}
    assert result[UNKNOWN_ID].state is JobState.ENDED_UNKNOWN
    backend.scheduler.cancel(UNKNOWN_ID)  # not an error either


def test_time_left_starts_near_the_limit_and_decreases(backend):
    name = backend.name()
    job = backend.scheduler.submit(backend.spec(name, ("sleep", "300"), time_limit="2"))
    first = backend.wait_state(name, job, JobState.RUNNING)
    assert first.time_left is not None and 100 <= first.time_left <= 120, first
    assert first.end_time is not None and first.start_time is not None
    assert abs((first.end_time - first.start_time) - 120) <= 2
    wait_until(lambda: backend.info(name, job).time_left < first.time_left, 10, 0.2, "time_left to decrease")
    backend.scheduler.cancel(job)
    backend.wait_state(name, job, JobState.CANCELLED)


def test_test_only_refuses_an_impossible_request(backend):
    name = backend.name()
    impossible = backend.spec(name, ("true",), partition="gpu-b", gpus_per_node=4)  # gpub-1 has 2
    with pytest.raises(SchedulerError):
        backend.scheduler.test_only(impossible)
    possible = backend.spec(name, ("true",), partition="gpu-a", gpus_per_node=1)
    assert backend.scheduler.test_only(possible) < time.time() + 3600
