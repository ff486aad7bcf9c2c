"""SlurmScheduler against the real multi-node lab: real sbatch, squeue,
scancel, scontrol and srun, on nodes with their own hostnames and GPUs.

Every test uses its own job name and cancels everything of that name when it
ends (the ``job_name`` fixture), so a failure leaves nothing queued for the
next test. Job output goes to the lab's shared directory: /tmp is private to
each lab node, exactly as on a real cluster.
"""

from __future__ import annotations

import importlib.util
import time
import uuid
from pathlib import Path

import pytest

from elastic_ray.config import SlurmWorkerAllocationConfig as Worker
from elastic_ray.errors import SchedulerError
from elastic_ray.scheduler.base import JobInfo, JobSpec, JobState
from elastic_ray.scheduler.slurm import SlurmScheduler

# tests/helpers.py, loaded by path: a plain `import helpers` could pick up
# another directory's module of the same name.
_spec = importlib.util.spec_from_file_location(
    "elastic_ray_tests_helpers", Path(__file__).resolve().parent.parent / "tests" / "helpers.py")
_helpers = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_helpers)
wait_until = _helpers.wait_until

pytestmark = pytest.mark.slurm

FINAL_TIMEOUT = 60.0  # s: sbatch -> RUNNING is about 1 s on the lab; jobs here run seconds


@pytest.fixture
def scheduler(slurm_lab) -> SlurmScheduler:
    return SlurmScheduler(slurm_conf=slurm_lab.conf, timeout=30.0)


@pytest.fixture
def job_name(scheduler):
    name = f"er-test-{uuid.uuid4().hex[:8]}"
    try:
        yield name
    finally:
        scheduler.cancel_by_name(name)


@pytest.fixture
def workdir(slurm_lab, job_name) -> Path:
    return slurm_lab.shared_dir(f"slurm-scheduler/{job_name}")


def make_spec(job_name: str, workdir: Path, node_argv: tuple[str, ...], **allocation) -> JobSpec:
    allocation.setdefault("time_limit", "5")
    return JobSpec(job_name=job_name, role="worker", allocation=Worker(**allocation), node_argv=node_argv,
                   workdir=workdir, output=str(workdir / "job-%j.out"))


def wait_for_final(scheduler: SlurmScheduler, job_name: str, job_id: str,
                   timeout: float = FINAL_TIMEOUT) -> JobInfo:
    def final() -> JobInfo | None:
        info = scheduler.query(job_name, [job_id])[job_id]
        return info if info.state.is_final else None
    return wait_until(final, timeout, 0.5, f"job {job_id} to end")


def output_of(workdir: Path, job_id: str) -> str:
    path = workdir / f"job-{job_id}.out"
    return path.read_text() if path.exists() else ""


# ----------------------------------------------------------------- a) a GPU worker allocation

REPORT = 'printf "host=%s cpus=%s gpus=%s\\n" "$(hostname)" "$SLURM_CPUS_ON_NODE" "${CUDA_VISIBLE_DEVICES-unset}"'


def test_gpu_worker_runs_on_a_gpu_node_with_its_cpus_and_gpus(scheduler, job_name, workdir):
    spec = make_spec(job_name, workdir, ("/bin/sh", "-c", REPORT), partition="gpu-a", gpus_per_node=2,
                     cpus_per_task=2)
    job_id = scheduler.submit(spec)
    info = wait_for_final(scheduler, job_name, job_id)

    assert info.state is JobState.COMPLETED, (info, output_of(workdir, job_id))
    assert info.partition == "gpu-a" and info.nodes and info.nodes[0].startswith("gpua-")
    assert info.name == job_name and info.end_time is not None and info.time_left is None
    line = next(line for line in output_of(workdir, job_id).splitlines() if line.startswith("host="))
    fields = dict(item.split("=", 1) for item in line.split())
    assert fields["host"] in info.nodes
    assert fields["cpus"] == "2"
    assert len(fields["gpus"].split(",")) == 2, line
    # The script is kept next to the run for the user to read.
    assert len(list(workdir.glob(f"{job_name}-worker-*.sbatch"))) == 1


def test_two_node_allocation_runs_the_node_command_once_per_node(scheduler, job_name, workdir):
    spec = make_spec(job_name, workdir, ("/bin/sh", "-c", REPORT), partition="cpu", num_nodes=2)
    job_id = scheduler.submit(spec)
    info = wait_for_final(scheduler, job_name, job_id)
    assert info.state is JobState.COMPLETED, (info, output_of(workdir, job_id))
    hosts = sorted(line.split()[0][len("host="):] for line in output_of(workdir, job_id).splitlines()
                   if line.startswith("host="))
    assert hosts == sorted(info.nodes) and len(hosts) == 2


def test_signal_reaches_the_node_command(scheduler, job_name, workdir):
    # The step-level signal is what the pre-walltime warning uses too.
    command = 'trap "echo got-usr1; exit 0" USR1; echo ready; while :; do sleep 0.2; done'
    job_id = scheduler.submit(make_spec(job_name, workdir, ("/bin/bash", "-c", command), partition="cpu"))
    wait_until(lambda: "ready" in output_of(workdir, job_id), FINAL_TIMEOUT, 0.3, "the node command to start")
    scheduler.signal(job_id, "USR1")
    info = wait_for_final(scheduler, job_name, job_id)
    assert "got-usr1" in output_of(workdir, job_id)
    assert info.state is JobState.COMPLETED


def test_pre_walltime_signal_reaches_the_node_command(scheduler, job_name, workdir):
    # signal_before_timeout renders `#SBATCH --signal=USR1@55` (no B:), which
    # Slurm delivers to the job's steps: the node command, run by srun, must
    # get it. slurmctld checks limits every 30 s and sends the warning when
    # now + 55 + 30 >= end, so with a 1-minute limit it comes at the first
    # check after the start: within about 30 s, long before the limit.
    command = 'trap "echo got-usr1; exit 0" USR1; echo ready; while :; do sleep 0.2; done'
    job_id = scheduler.submit(make_spec(job_name, workdir, ("/bin/bash", "-c", command), partition="cpu",
                                        time_limit="1", signal_before_timeout="USR1@55"))
    info = wait_for_final(scheduler, job_name, job_id, timeout=75.0)
    assert "got-usr1" in output_of(workdir, job_id), output_of(workdir, job_id)
    assert info.state is JobState.COMPLETED, info


# ----------------------------------------------------------------- b) pending, then cancelled

def test_pending_allocation_that_is_cancelled_ends_cancelled(scheduler, job_name, workdir):
    spec = make_spec(job_name, workdir, ("/bin/true",), partition="cpu",
                     extra_sbatch_directives=["--begin=now+1hour"])
    job_id = scheduler.submit(spec)
    pending = scheduler.query(job_name, [job_id])[job_id]
    assert pending.state is JobState.PENDING and pending.reason == "BeginTime"
    assert pending.nodes == () and pending.start_time is None and pending.submit_time is not None

    scheduler.cancel(job_id)
    info = wait_for_final(scheduler, job_name, job_id)
    assert info.state is JobState.CANCELLED
    scheduler.cancel(job_id)  # cancelling an ended job is not an error


# ----------------------------------------------------------------- c) test-only

def test_test_only_predicts_a_start_and_refuses_the_impossible(scheduler, job_name, workdir):
    before = time.time()
    start = scheduler.test_only(make_spec(job_name, workdir, ("/bin/true",), partition="gpu-b",
                                          gpus_per_node=1, time_limit="1"))
    # An idle (or nearly idle) partition: the predicted start is about now.
    assert isinstance(start, float) and before - 5 <= start <= before + 600

    with pytest.raises(SchedulerError) as info:
        scheduler.test_only(make_spec(job_name, workdir, ("/bin/true",), partition="gpu-b", gpus_per_node=8))
    assert "Requested node configuration is not available" in str(info.value)
    assert info.value.returncode != 0 and info.value.argv[:2] == ("sbatch", "--test-only")
    # Nothing was submitted under this name.
    assert scheduler.query(job_name) == {}


# ----------------------------------------------------------------- d) one squeue call for 20 allocations

def test_one_query_reports_twenty_allocations_with_one_squeue_call(scheduler, job_name, workdir):
    spec = make_spec(job_name, workdir, ("/bin/sleep", "120"), partition="cpu", time_limit="3")
    job_ids = [scheduler.submit(spec) for _ in range(20)]
    # Let the scheduler start some of them, so the one query sees both states.
    wait_until(lambda: any(i.state is JobState.RUNNING for i in scheduler.query(job_name).values()),
               FINAL_TIMEOUT, 0.3, "some of the 20 allocations to start")

    squeue_before = scheduler.calls["squeue"]
    calls_before = sum(scheduler.calls.values())
    jobs = scheduler.query(job_name, job_ids)
    assert scheduler.calls["squeue"] - squeue_before == 1
    assert sum(scheduler.calls.values()) - calls_before == 1, dict(scheduler.calls)
    assert set(job_ids) <= set(jobs)
    assert all(jobs[j].state in (JobState.PENDING, JobState.RUNNING) for j in job_ids), \
        {j: jobs[j].raw_state for j in job_ids}
    running = [jobs[j] for j in job_ids if jobs[j].state is JobState.RUNNING]
    assert running and all(info.nodes and info.time_left is not None and 0 < info.time_left <= 180
                           for info in running)

    scheduler.cancel_by_name(job_name)
    wait_until(lambda: all(info.state.is_final for info in scheduler.query(job_name, job_ids).values()),
               FINAL_TIMEOUT, 0.5, "every allocation to end after cancel_by_name")
    assert {info.state for info in scheduler.query(job_name, job_ids).values()} == {JobState.CANCELLED}


# ----------------------------------------------------------------- e) records that are gone

def test_a_job_nobody_knows_is_ended_unknown_not_an_error(scheduler, job_name):
    jobs = scheduler.query(job_name, ["999999"])
    assert jobs["999999"].state is JobState.ENDED_UNKNOWN
    assert scheduler.end_time("999999") is None
    scheduler.cancel("999999")  # nor is cancelling it


def test_a_listed_id_of_another_name_is_resolved_through_scontrol(scheduler, job_name, workdir):
    job_id = scheduler.submit(make_spec(job_name, workdir, ("/bin/true",), partition="cpu"))
    wait_for_final(scheduler, job_name, job_id)
    scontrol_before = scheduler.calls["scontrol"]
    other = f"{job_name}-other"
    info = scheduler.query(other, [job_id])[job_id]
    assert info.state is JobState.COMPLETED and info.name == job_name
    assert scheduler.calls["scontrol"] - scontrol_before == 1
    assert scheduler.end_time(job_id) == info.end_time
