"""The Slurm backend acts for one user and finds submissions by their marker.

Unit level, with scripted command answers: the argv of every command that
selects jobs carries ``--user``; squeue's and scontrol's answers give the
owner and the comment; the marker reaches the batch script as the last
``#SBATCH`` line; a multi-id scancel that names ended jobs is not an
error; and a submission whose sbatch printed extra lines (or timed out) is
adopted through its marker by the session's job layer.
"""

from __future__ import annotations

import logging
import re
import time
import uuid
from pathlib import Path

import pytest

from elastic_ray.config import SlurmRunAllocationConfig, SlurmWorkerAllocationConfig
from elastic_ray.config.launcher import RayLauncher
from elastic_ray.coordinator.allocations.jobs import SessionJobs
from elastic_ray.errors import SchedulerError
from elastic_ray.protocol.disk.records import SessionInfo, WorkerRecord
from elastic_ray.protocol.disk.session_dir import SessionDir as Dir
from elastic_ray.scheduler.base import JobSpec, current_user
from elastic_ray.scheduler.render import render_batch_script
from elastic_ray.scheduler.slurm_parse import (
    SQUEUE_FORMAT,
    check_user,
    only_gone_errors,
    parse_scontrol_job,
    parse_squeue_line,
    scancel_ids_argv,
    scancel_name_argv,
    squeue_argv,
)
from test_slurm_parsing import ScriptedSlurm, squeue_answer, squeue_line

GONE = "scancel: error: Kill job error on job id {}: Invalid job id specified"


# ----------------------------------------------------------------- argv

def test_every_selecting_command_names_the_user():
    assert squeue_argv("er-x", "alice") == ["squeue", "--name=er-x", "--user=alice", "--states=all", "--noheader",
                                            f"--format={SQUEUE_FORMAT}"]
    assert scancel_ids_argv(["5", "7"], "alice") == ["scancel", "--user=alice", "5", "7"]
    assert scancel_name_argv("er-x", "1000") == ["scancel", "--name=er-x", "--user=1000"]


@pytest.mark.parametrize("user", ["", "-u", "--user=root", "a b", "a,b", ".hidden", "x" * 70, None, 1000, "a\nb"])
def test_a_user_that_could_be_misread_never_reaches_a_command(user):
    with pytest.raises(ValueError, match="user"):
        check_user(user)
    with pytest.raises(ValueError, match="user"):
        squeue_argv("er-x", user)


@pytest.mark.parametrize("user", ["alice", "bob.smith", "svc_ray-01", "1000", "host$", "a@realm"])
def test_ordinary_user_names_pass(user):
    assert check_user(user) == user


def test_the_scheduler_defaults_to_this_process_user_and_can_act_for_another():
    assert ScriptedSlurm({}).user == current_user()
    slurm = ScriptedSlurm({"squeue": lambda argv: ("", "", 0), "scancel": lambda argv: ("", "", 0)})
    slurm.query("er-x", user="bob")
    slurm.cancel_jobs(["5"], user="bob")
    slurm.cancel_by_name("er-x", user="bob")
    assert [a[:3] for a in slurm.argvs] == [["squeue", "--name=er-x", "--user=bob"], ["scancel", "--user=bob", "5"],
                                            ["scancel", "--name=er-x", "--user=bob"]]


# ----------------------------------------------------------------- cancel_jobs

def test_cancel_jobs_is_one_scancel_and_ended_ids_are_not_an_error():
    slurm = ScriptedSlurm({"scancel": lambda argv: ("", GONE.format(argv[-1]) + "\n", 1)})
    slurm.cancel_jobs(["5", "6", "5"])
    assert slurm.argvs == [["scancel", f"--user={slurm.user}", "5", "6"]]


def test_cancel_jobs_raises_on_any_other_error():
    slurm = ScriptedSlurm({"scancel": lambda argv: ("", GONE.format("5") + "\nscancel: error: Access/permission "
                                                        "denied\n", 1)})
    with pytest.raises(SchedulerError, match="permission"):
        slurm.cancel_jobs(["5", "6"])


def test_cancel_jobs_chunks_long_lists():
    slurm = ScriptedSlurm({"scancel": lambda argv: ("", "", 0)})
    slurm.CANCEL_CHUNK = 3
    slurm.cancel_jobs([str(i) for i in range(1, 8)])
    assert [a[2:] for a in slurm.argvs] == [["1", "2", "3"], ["4", "5", "6"], ["7"]]


def test_cancel_jobs_refuses_a_bad_id_before_any_command():
    slurm = ScriptedSlurm({})
    with pytest.raises(ValueError):
        slurm.cancel_jobs(["5", "--user=other"])
    assert slurm.argvs == []


def test_only_gone_errors():
    assert only_gone_errors(GONE.format(5) + "\n" + GONE.format(6), ["Invalid job id specified"])
    assert not only_gone_errors("", ["Invalid job id specified"])
    assert not only_gone_errors(GONE.format(5) + "\nboom", ["Invalid job id specified"])


# ----------------------------------------------------------------- owner and comment in the answers

def test_squeue_reports_owner_and_comment():
    info = parse_squeue_line(squeue_line(user="alice", comment="elastic-ray:s:t"))
    assert (info.user, info.comment) == ("alice", "elastic-ray:s:t")
    assert parse_squeue_line(squeue_line(comment="(null)")).comment == ""


def test_scontrol_reports_owner_and_comment():
    line = ("JobId=7 JobName=er-x UserId=alice(1000) GroupId=alice(1000) JobState=RUNNING "
            "Comment=elastic-ray:s:t Partition=cpu NodeList=cpu-1")
    info = parse_scontrol_job(line, "7", time.time())
    assert (info.user, info.comment) == ("alice", "elastic-ray:s:t")


def test_the_marker_is_the_last_directive_so_it_wins_over_a_users_comment(tmp_path):
    alloc = SlurmRunAllocationConfig(partition="cpu", extra_sbatch_directives=("--comment=mine",))
    spec = JobSpec(job_name="er-x", role="worker", allocation=alloc, node_argv=("true",), workdir=tmp_path,
                   output="o-%j.out", comment="elastic-ray:s:t")
    directives = [line for line in render_batch_script(spec).splitlines() if line.startswith("#SBATCH")]
    assert directives[-1] == "#SBATCH --comment=elastic-ray:s:t"
    plain = JobSpec(job_name="er-x", role="worker", allocation=SlurmRunAllocationConfig(partition="cpu"),
                    node_argv=("true",), workdir=tmp_path, output="o-%j.out")
    assert "--comment" not in render_batch_script(plain)


# ----------------------------------------------------------------- adoption through the marker, scripted Slurm

def _session(tmp_path: Path, slurm: ScriptedSlurm) -> SessionJobs:
    info = SessionInfo(session_id=uuid.uuid4().hex, job_name="er-x", created_at=time.time(),
                       scheduler={"kind": "slurm"}, head={"partition": "cpu"}, launcher=RayLauncher().to_dict(),
                       user=slurm.user)
    return SessionJobs(Dir.create(tmp_path / "s", info), slurm, info)


def _marker_of(argv: list[str]) -> str:
    match = re.search(r"^#SBATCH --comment=(\S+)$", Path(argv[-1]).read_text(), re.M)
    assert match, "the batch script carries the marker"
    return match.group(1)


@pytest.mark.parametrize("sbatch_answer", [
    ("sbatch: warning: something odd\n4242\n", "", 0),  # extra lines: unreadable answer
    ("", "sbatch: error: Batch job submission failed: Socket timed out on send/recv operation", 1),
])
def test_a_queued_but_unreadable_submission_is_adopted_by_its_marker(tmp_path, sbatch_answer):
    seen: dict[str, str] = {}

    def sbatch(argv):
        seen["marker"] = _marker_of(argv)
        return sbatch_answer

    def squeue(argv):
        assert f"--user={slurm.user}" in argv
        lines = [squeue_line(job_id="4000", comment="elastic-ray:someone-else:t"),
                 squeue_line(job_id="4242", state="PENDING", nodes="", reason="Priority", comment=seen["marker"])]
        return "\n".join(lines) + "\n", "", 0

    slurm = ScriptedSlurm({"sbatch": sbatch, "squeue": squeue})
    jobs = _session(tmp_path, slurm)
    config = SlurmWorkerAllocationConfig(partition="cpu")
    spec = JobSpec(job_name="er-x", role="worker", allocation=config, node_argv=("true",),
                   workdir=jobs.dir.path, output="w-%j.out")
    job = jobs.submit(spec, config, lambda r, j: r.with_worker(WorkerRecord(job_id=j, config={}, submitted_at=0.0)))
    assert job == "4242"
    rec = jobs.dir.read_allocation()
    assert set(rec.workers) == {"4242"} and not rec.intents
    assert slurm.argvs[0][:2] == ["sbatch", "--parsable"]


def test_a_failed_submission_that_queued_nothing_is_recorded_as_failed(tmp_path):
    slurm = ScriptedSlurm({"sbatch": lambda argv: ("", "sbatch: error: Socket timed out", 1),
                           "squeue": lambda argv: ("", "", 0)})
    jobs = _session(tmp_path, slurm)
    config = SlurmWorkerAllocationConfig(partition="cpu")
    spec = JobSpec(job_name="er-x", role="worker", allocation=config, node_argv=("true",),
                   workdir=jobs.dir.path, output="w-%j.out")
    with pytest.raises(SchedulerError, match="timed out"):
        jobs.submit(spec, config, lambda r, j: r)
    (intent,) = jobs.dir.read_allocation().intents.values()
    assert intent.failed_at is not None and "timed out" in (intent.error or "")
    assert intent.config == config.to_dict() and intent.role == "worker"


# ----------------------------------------------------------------- a scheduler that does not answer

def test_a_watcher_reads_an_unreachable_scheduler_as_unknown_and_says_so_once(tmp_path, caplog):
    down = ("", "slurm_load_jobs error: Unable to contact slurm controller (connect failure)\n", 1)
    slurm = ScriptedSlurm({"squeue": lambda argv: down})
    jobs = _session(tmp_path, slurm)
    with caplog.at_level(logging.WARNING, logger="elastic_ray.coordinator"):
        assert jobs.known("7") is None
        assert jobs.known("7") is None
    events = [r.getMessage() for r in caplog.records if "scheduler_unreachable" in r.getMessage()]
    assert len(events) == 1 and "Unable to contact slurm controller" in events[0]
    # The strict path still raises: `session status` must not pretend to know.
    with pytest.raises(SchedulerError, match="Unable to contact"):
        jobs.listing(["7"])
    # Once slurmctld answers again, the watcher sees the job.
    slurm.answers["squeue"] = squeue_answer(squeue_line(job_id="7", state="RUNNING"))
    info = jobs.known("7")
    assert info is not None and info.state.value == "RUNNING"
