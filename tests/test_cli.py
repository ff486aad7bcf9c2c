"""The `elastic-ray` CLI: pure parts exhaustively, commands for real on the local scheduler.

The command tests use a real session directory and a real LocalScheduler
whose "allocations" run `sleep` instead of the agent (the session's records
point at them like at any job), so they exercise the real query, cancel and
record paths in seconds, without Ray. Only ``add-worker`` submits a real
agent job; it never gets a head (the head is a `sleep`), so it starts no Ray
and is cancelled by the teardown under test.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from dataclasses import replace
from pathlib import Path

import click
import pytest
from click.testing import CliRunner
from rich.console import Console

from elastic_ray.cli import main
from elastic_ray.cli.options import (
    FIELD_OPTIONS,
    OptionError,
    option_for_field,
    parse_ray_resource,
    parse_ray_resources,
    worker_config,
)
from elastic_ray.cli.dashboard_model import TURN_ON
from elastic_ray.cli.session import one_line
from elastic_ray.cli.status_model import build_status, node_shown_state
from elastic_ray.cli.status_view import format_duration, render_status
from elastic_ray.config import SlurmRunAllocationConfig, SlurmWorkerAllocationConfig, resolve_head_config
from elastic_ray.coordinator.head.headwatch import HeadObservation
from elastic_ray.config.launcher import RayLauncher
from elastic_ray.protocol.disk.records import (
    AllocationEnding,
    AllocationRecord,
    ElectionClaim,
    HostedHead,
    HostedHeadState,
    HeadEndpoint,
    SessionInfo,
    WorkerRecord,
)
from elastic_ray.protocol.disk.session_dir import SessionDir
from elastic_ray.scheduler.base import JobInfo, JobSpec, JobState
from elastic_ray.scheduler.local import LocalScheduler
from tests.helpers import node_state, wait_until

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parent.parent


# =============================================================== pure: options -> config

def test_every_worker_config_field_has_an_option():
    from dataclasses import fields

    assert set(FIELD_OPTIONS) == {f.name for f in fields(SlurmWorkerAllocationConfig)}


def test_options_map_to_the_config():
    config = worker_config({
        "partition": "gpu-a", "num_nodes": 2, "gpus_per_node": 4, "cpus_per_task": 8, "mem": "64g",
        "mem_per_cpu": None, "time_limit": "2:00:00", "signal_before_timeout": "SIGUSR1@300",
        "ray_resources": {"accelerator:a40": 1.0}, "ray_start_args": ("--num-cpus=6",),
        "rejoin_timeout": 120.0, "extra_sbatch_directives": (), "qos": None,
    })
    assert config == SlurmWorkerAllocationConfig(
        partition="gpu-a", num_nodes=2, gpus_per_node=4, cpus_per_task=8, mem="64G", time_limit="2:00:00",
        signal_before_timeout="USR1@300", ray_resources={"accelerator:a40": 1.0},
        ray_start_args=("--num-cpus=6",), rejoin_timeout=120.0)


def test_options_not_given_stay_unset_for_inheritance():
    config = worker_config({"partition": None, "num_nodes": None, "ray_resources": {}, "ray_start_args": (),
                            "rejoin_timeout": None})
    assert config == SlurmWorkerAllocationConfig()
    assert config.partition is None and config.num_nodes is None and config.rejoin_timeout == 600.0


@pytest.mark.parametrize("options, option, words", [
    ({"time_limit": "1:75"}, "--time", "below 60"),
    ({"time_limit": "soon"}, "--time", "not a Slurm time"),
    ({"num_nodes": 0}, "--nodes", "at least 1"),
    ({"mem": "lots"}, "--mem", "memory size"),
    ({"mem": "4G", "mem_per_cpu": "1G"}, "--mem-per-cpu", "exclusive"),
    ({"signal_before_timeout": "KILL@60"}, "--signal", "KILL"),
    ({"partition": "a b"}, "--partition", "partition name"),
    ({"ray_resources": {"CPU": 2.0}}, "--ray-resource", "set by the agent"),
    ({"ray_start_args": ("--port=1",)}, "--ray-start-arg", "set by the agent"),
    ({"ray_start_args": ("num-cpus=3",)}, "--ray-start-arg", "--option"),
    ({"extra_sbatch_directives": ("--time=5",)}, "--sbatch-arg", "manages"),
    ({"rejoin_timeout": 0.0}, "--rejoin-timeout", "above zero"),
    ({"time_limit": "10", "time_min": "20"}, "--time-min", "exceed"),
])
def test_a_bad_value_is_reported_against_its_option(options, option, words):
    with pytest.raises(OptionError) as error:
        worker_config(options)
    assert error.value.option == option
    assert error.value.message.startswith(f"{option}: ")
    assert words in error.value.message
    assert error.value.exit_code == 2


def test_option_for_field_strips_indexes():
    assert option_for_field("ray_resources['a40']") == "--ray-resource"
    assert option_for_field("ray_start_args[2]") == "--ray-start-arg"
    assert option_for_field("time_limit") == "--time"
    assert option_for_field("something_else") == "something_else"


@pytest.mark.parametrize("text, expected", [
    ("a40=1", ("a40", 1.0)),
    ("accelerator:a40=0.5", ("accelerator:a40", 0.5)),
    (" big_mem = 2 ", ("big_mem", 2.0)),
    ("x=0", ("x", 0.0)),
])
def test_ray_resource_parses(text, expected):
    assert parse_ray_resource(text) == expected


@pytest.mark.parametrize("text, words", [
    ("a40", "NAME=AMOUNT"),
    ("=1", "NAME=AMOUNT"),
    ("a40=", "not a number"),
    ("a40=one", "not a number"),
    ("a40=-1", "not negative"),
    ("a40=inf", "finite"),
    ("a40=nan", "finite"),
])
def test_ray_resource_bad_forms_are_refused(text, words):
    with pytest.raises(ValueError, match=words):
        parse_ray_resource(text)


def test_ray_resource_given_twice_is_refused():
    assert parse_ray_resources(["a=1", "b=2"]) == {"a": 1.0, "b": 2.0}
    with pytest.raises(ValueError, match="twice"):
        parse_ray_resources(["a=1", "a=2"])


def test_one_line_turns_a_log_tail_into_its_path():
    exc = RuntimeError("worker allocation 7 ended FAILED with 0/1 nodes joined; "
                       "last lines of /s/logs/worker-7.out:\nTraceback...\nBoom")
    assert one_line(exc) == "worker allocation 7 ended FAILED with 0/1 nodes joined; see /s/logs/worker-7.out"
    assert one_line(TimeoutError()) == "TimeoutError"


@pytest.mark.parametrize("seconds, text", [(None, "-"), (0, "0s"), (59.6, "1m00s"), (75, "1m15s"),
                                           (4000, "1h06m"), (90000, "1d01h")])
def test_format_duration(seconds, text):
    assert format_duration(seconds) == text


# =============================================================== pure: status model and rendering

NOW = 1_700_000_000.0


def _info() -> SessionInfo:
    return SessionInfo(session_id="s" * 32, job_name="er-test", created_at=NOW - 600,
                       scheduler={"kind": "slurm"}, head={"partition": "cpu"})


def _fabricated():
    record = AllocationRecord(
        generation=9, head_job="20", predecessors=("10",),
        workers={
            "21": WorkerRecord(job_id="21", config={"partition": "gpu-a", "num_nodes": 2}, submitted_at=NOW - 300),
            "22": WorkerRecord(job_id="22", config={"partition": "gpu-b"}, submitted_at=NOW - 200,
                               state="draining", drain_requested_at=NOW - 10, drain_deadline=NOW + 50),
            "23": WorkerRecord(job_id="23", config={"partition": "cpu"}, submitted_at=NOW - 100, state="removed"),
            "24": WorkerRecord(job_id="24", config={"partition": "cpu"}, submitted_at=NOW - 50),
        })
    jobs = {
        "10": JobInfo("10", "er-test", JobState.CANCELLED, partition="cpu"),
        "20": JobInfo("20", "er-test", JobState.RUNNING, partition="cpu", nodes=("cpu-1",), time_left=3600),
        "21": JobInfo("21", "er-test", JobState.RUNNING, partition="gpu-a", nodes=("gpua-1", "gpua-2"),
                      time_left=75),
        "22": JobInfo("22", "er-test", JobState.RUNNING, partition="gpu-b", nodes=("gpub-1",), time_left=500),
        "23": JobInfo("23", "", JobState.ENDED_UNKNOWN, reason="no record of this job"),
        "24": JobInfo("24", "er-test", JobState.PENDING, partition="cpu", reason="Resources"),
        "30": JobInfo("30", "er-test", JobState.RUNNING, partition="cpu", nodes=("cpu-2",)),
    }
    nodes = {
        "20": {"cpu-1": node_state("20", "cpu-1", "JOINED", node_id="h" * 56, updated_at=NOW - 1)},
        "21": {"gpua-1": node_state("21", "gpua-1", "JOINED", node_id="a" * 56, updated_at=NOW - 2),
               "gpua-2": node_state("21", "gpua-2", "RESTART_BACKOFF", node_id=None, updated_at=NOW - 90)},
        "22": {"gpub-1": node_state("22", "gpub-1", "DRAINING", node_id="b" * 56, updated_at=NOW - 1)},
        "23": {"cpu-2": node_state("23", "cpu-2", "LEFT", node_id="c" * 56, exited=True, updated_at=NOW - 900)},
    }
    endpoint = HeadEndpoint(job_id="20", host="cpu-1", address="10.0.0.1:6379", ray_version="2.60.0",
                            started_at=NOW - 500, ports={"heartbeat": 7000})
    observation = HeadObservation(job="20", address="10.0.0.1:6379", alive=True, draining=False,
                                  last_beat_age=0.3)
    return record, jobs, nodes, endpoint, observation


def _status(**overrides):
    record, jobs, nodes, endpoint, observation = _fabricated()
    kwargs = dict(path="/s", info=_info(), record=record, jobs=jobs, nodes=nodes, pointer="20",
                  endpoint=endpoint, observation=observation, now=NOW)
    kwargs.update(overrides)
    return build_status(**kwargs)


def _text(status, width: int = 200) -> str:
    console = Console(width=width, record=True, file=open("/dev/null", "w"))
    console.print(render_status(status))
    return console.export_text()


def test_status_model_lists_every_job_with_role_state_nodes_and_drain():
    status = _status()
    rows = {r["job_id"]: r for r in status["jobs"]}
    assert [r["job_id"] for r in status["jobs"]] == ["20", "10", "21", "22", "23", "24", "30"]
    assert {j: r["role"] for j, r in rows.items()} == {
        "20": "head", "10": "head (replaced)", "21": "worker", "22": "worker", "23": "worker", "24": "worker",
        "30": "unrecorded"}
    assert {j: r["state"] for j, r in rows.items()} == {
        "20": "RUNNING", "10": "CANCELLED", "21": "RUNNING", "22": "RUNNING", "23": "ENDED_UNKNOWN",
        "24": "PENDING", "30": "RUNNING"}
    assert rows["21"]["nodes"] == [
        {"node": "gpua-1", "ray_node_id": "a" * 56, "node_state": "JOINED", "node_state_reason": "",
         "agent_state": "JOINED", "agent_exited": False, "agent_stale": False, "agent_updated_age": 2.0,
         "oom_kills": None, "hosted_head": None},
        {"node": "gpua-2", "ray_node_id": None, "node_state": "RESTART_BACKOFF", "node_state_reason": "",
         "agent_state": "RESTART_BACKOFF", "agent_exited": False, "agent_stale": True, "agent_updated_age": 90.0,
         "oom_kills": None, "hosted_head": None}]
    # A node only the agent knows of (the job is gone from the scheduler) still shows.
    assert rows["23"]["nodes"][0]["node"] == "cpu-2" and rows["23"]["nodes"][0]["agent_exited"]
    assert rows["23"]["partition"] == "cpu"  # from the record when the scheduler forgot
    assert rows["21"]["time_left"] == 75 and rows["23"]["time_left"] is None
    assert rows["22"]["drain"] == {"state": "draining", "requested_at": NOW - 10, "deadline": NOW + 50}
    assert rows["20"]["drain"] is None
    assert status["head"] == {"job_id": "20", "recorded_job_id": "20", "address": "10.0.0.1:6379",
                              "dashboard": None, "dashboard_note": f"the dashboard is off: {TURN_ON}",
                              "heartbeat": "live", "last_beat_age": 0.3, "draining": False}
    assert status["active_jobs"] == 5
    json.loads(json.dumps(status))  # JSON-ready as it is


def test_status_shows_the_dashboard_or_how_to_turn_it_on():
    _, _, _, endpoint, _ = _fabricated()
    status = _status(endpoint=replace(endpoint, dashboard="10.0.0.1:30002"))
    assert status["head"]["dashboard"] == "10.0.0.1:30002"
    assert "dashboard: 10.0.0.1:30002 (a tunnel to it: elastic-ray session dashboard)" in _text(status)
    assert "dashboard: the dashboard is off: set include_dashboard=True" in _text(_status())
    assert "dashboard:" not in _text(_status(pointer=None, endpoint=None))   # no head: nothing to say about it


def test_status_table_shows_what_the_model_holds():
    text = _text(_status())
    assert "session er-test" in text
    assert "head: job 20 at 10.0.0.1:6379, heartbeat live" in text
    for needle in ("head (replaced)", "CANCELLED", "ENDED_UNKNOWN", "PENDING (Resources)", "aaaaaaaaaaaa",
                   "RESTART_BACKOFF (stale 1m30s)", "LEFT (exited)", "draining, deadline in 50s", "removed",
                   "1m15s", "1h00m", "unrecorded"):
        assert needle in text, needle
    assert "a" * 13 not in text  # node ids are shortened in the table, whole in JSON


@pytest.mark.parametrize("change, heartbeat", [
    (dict(observation=HeadObservation("20", "10.0.0.1:6379", False, False, 5.0)), "silent"),
    (dict(endpoint=None, observation=None), "not ready"),
    (dict(observation=None), "unknown"),
    (dict(pointer=None, endpoint=None, observation=None), "no head"),
])
def test_status_heartbeat_states(change, heartbeat):
    assert _status(**change)["head"]["heartbeat"] == heartbeat


def test_a_drain_deadline_is_shown_only_while_the_job_is_active():
    record, jobs, *_ = _fabricated()
    record = record.with_worker(replace(record.workers["22"], state="removed"))
    text = _text(_status(record=record))
    assert "removed, deadline in 50s" in text
    ended = dict(jobs, **{"22": replace(jobs["22"], state=JobState.COMPLETED, time_left=None)})
    text = _text(_status(record=record, jobs=ended))
    assert "deadline" not in text and "removed" in text


def test_status_of_a_session_whose_jobs_all_ended():
    record, jobs, nodes, endpoint, _ = _fabricated()
    ended = {j: replace(i, state=JobState.ENDED_UNKNOWN if j == "23" else JobState.COMPLETED, time_left=None)
             for j, i in jobs.items()}
    status = _status(jobs=ended, observation=None)
    assert status["head"]["heartbeat"] == "job ended"
    assert status["active_jobs"] == 0
    text = _text(status)
    assert "heartbeat job ended" in text and "ENDED_UNKNOWN" in text
    assert "stale" not in text  # an old agent report of an ended job is no news


def test_status_shows_a_worker_hosted_head_an_election_and_a_successor():
    record, jobs, nodes, endpoint, observation = _fabricated()
    record = replace(record, head_job="21", predecessors=("10", "20"), successor="25",
                     election=ElectionClaim("host:1:abc", NOW - 5, NOW + 115))
    status = _status(record=record, pointer="21", observation=None, endpoint=None)
    roles = {r["job_id"]: r["role"] for r in status["jobs"]}
    assert roles["21"] == "worker+head" and roles["20"] == "head (replaced)"
    assert roles["25"] == "head (successor)"
    # The default layout: the head was a worker allocation, and the head moved on; it still computes.
    moved = replace(record, head_job="22", predecessors=("10", "20", "21"))
    roles = {r["job_id"]: r["role"] for r in _status(record=moved, pointer="22", observation=None,
                                                     endpoint=None)["jobs"]}
    assert roles["21"] == "worker (was head)" and roles["22"] == "worker+head" and roles["23"] == "worker"
    assert {r["job_id"]: r["state"] for r in status["jobs"]}["25"] == "UNKNOWN"  # not asked about
    assert status["election"]["live"] and status["successor"] == "25"
    assert "election by host:1:abc in progress" in _text(status)


@pytest.mark.parametrize("job_state, reason, shown, why", [
    (JobState.RUNNING, "", "JOINED", ""),
    (JobState.PENDING, "BeginTime", "GONE", "job PENDING (requeued)"),
    (JobState.COMPLETING, "", "ENDING", "job COMPLETING"),
    (JobState.SUSPENDED, "", "SUSPENDED", "job SUSPENDED"),
    (JobState.COMPLETED, "", "ENDED", "job COMPLETED"),
    (JobState.CANCELLED, "", "ENDED", "job CANCELLED"),
    (JobState.FAILED, "NonZeroExitCode", "ENDED", "job FAILED"),
    (JobState.TIMEOUT, "TimeLimit", "ENDED", "job TIMEOUT"),
    (JobState.NODE_FAIL, "NodeDown", "ENDED", "job NODE_FAIL"),
    (JobState.PREEMPTED, "", "ENDED", "job PREEMPTED"),
    (JobState.OUT_OF_MEMORY, "", "ENDED", "job OUT_OF_MEMORY"),
    (JobState.BOOT_FAIL, "", "ENDED", "job BOOT_FAIL"),
    (JobState.DEADLINE, "", "ENDED", "job DEADLINE"),
    (JobState.ENDED_UNKNOWN, "", "GONE", "job no longer known to the scheduler"),
    (None, "", "GONE", "job not reported by the scheduler"),
])
def test_a_node_shows_its_agents_state_only_while_its_job_runs(job_state, reason, shown, why):
    job = None if job_state is None else JobInfo("5", "er-test", job_state, reason=reason)
    assert node_shown_state("JOINED", job) == (shown, why)
    # A node without an agent record stays unknown; an agent that recorded its exit said its last word.
    assert node_shown_state(None, job) == (None, "")
    assert node_shown_state("LEFT", job, exited=True) == ("LEFT", "")


@pytest.mark.parametrize("state", [s for s in JobState if s is not JobState.RUNNING])
def test_no_node_of_a_job_that_is_not_running_is_shown_joined(state):
    record, jobs, nodes, *_ = _fabricated()
    jobs = dict(jobs, **{"21": replace(jobs["21"], state=state, time_left=None)})
    status = _status(jobs=jobs)
    (row,) = [r for r in status["jobs"] if r["job_id"] == "21"]
    assert all(n["node_state"] in ("ENDED", "GONE", "ENDING", "SUSPENDED") for n in row["nodes"])
    assert row["nodes"][0]["agent_state"] == "JOINED"  # the agent's last word is kept in the model
    text = _text(status)
    assert f"({row['nodes'][0]['node_state_reason']}; last JOINED)" in text


def test_the_lab_case_a_failed_worker_and_a_replaced_head_never_read_joined():
    """Issue 10: `FAILED ... JOINED` for a failed worker and for a replaced head."""
    record, jobs, nodes, endpoint, observation = _fabricated()
    record = record.with_worker(replace(record.workers["21"], ended=AllocationEnding(
        "FAILED", NOW - 30, "NonZeroExitCode", ("gpua-1", "gpua-2")), resubmit_on_failure=1, replaced_by="25"))
    record = record.with_worker(WorkerRecord(job_id="25", config={"partition": "gpu-a"}, submitted_at=NOW - 20,
                                             replaces="21"))
    jobs = dict(jobs, **{"21": replace(jobs["21"], state=JobState.FAILED, reason="NonZeroExitCode", time_left=None),
                         "10": replace(jobs["10"], state=JobState.FAILED, nodes=("cpu-9",)),
                         "25": JobInfo("25", "er-test", JobState.PENDING, partition="gpu-a", reason="Priority")})
    nodes = dict(nodes, **{"10": {"cpu-9": node_state("10", "cpu-9", "JOINED", role="head", updated_at=NOW - 200)}})
    status = _status(record=record, jobs=jobs, nodes=nodes)
    rows = {r["job_id"]: r for r in status["jobs"]}
    assert [n["node_state"] for n in rows["21"]["nodes"]] == ["ENDED", "ENDED"]
    assert [n["node_state"] for n in rows["10"]["nodes"]] == ["ENDED"]
    assert rows["21"]["failure"] == {"ended": {"state": "FAILED", "reason": "NonZeroExitCode", "noticed_at": NOW - 30,
                                               "nodes": ["gpua-1", "gpua-2"]},
                                     "resubmit_left": 1, "replaces": None, "replaced_by": "25"}
    assert rows["25"]["failure"]["replaces"] == "21" and rows["22"]["failure"] is None
    assert [f["job_id"] for f in status["failures"]] == ["21"]
    text = _text(status)
    assert "1 worker allocation(s) ended without being asked: 21 FAILED (resubmitted as 25)" in text
    assert "FAILED (NonZeroExitCode)" in text and "ENDED (job FAILED; last JOINED)" in text
    assert "ended FAILED unasked (NonZeroExitCode); resubmitted as 25" in _text(status, width=400)
    assert "replaces 21" in text
    for line in text.splitlines():
        if line.lstrip().startswith(("head (replaced)   10", "worker            21")):
            assert "JOINED" in line and " JOINED " not in line and "last JOINED" in line


def test_a_replaced_head_whose_job_still_runs_is_not_shown_joined():
    record, jobs, nodes, *_ = _fabricated()
    jobs = dict(jobs, **{"10": replace(jobs["10"], state=JobState.RUNNING, nodes=("cpu-9",))})
    nodes = dict(nodes, **{"10": {"cpu-9": node_state("10", "cpu-9", "JOINED", role="head", updated_at=NOW - 1)}})
    (row,) = [r for r in _status(jobs=jobs, nodes=nodes)["jobs"] if r["job_id"] == "10"]
    assert (row["nodes"][0]["node_state"], row["nodes"][0]["node_state_reason"]) == (
        "REPLACED", "no longer the run's head")


# =============================================================== commands, for real on the local scheduler

def _sleep_spec(directory: SessionDir, job_name: str, role: str, allocation) -> JobSpec:
    return JobSpec(job_name=job_name, role=role, allocation=allocation, node_argv=("sleep", "300"),
                   workdir=directory.path, output=str(directory.log_dir / f"{role}-%j.out"))


@pytest.fixture
def sleepy(tmp_path, monkeypatch):
    """A session directory whose head and one worker are real local jobs running `sleep`."""
    monkeypatch.setenv("ELASTIC_AGENT_RUNTIME_DIR", str(tmp_path / "agent-runtime"))
    scheduler = LocalScheduler(tmp_path / "local-scheduler")
    job_name = f"er-cli-{uuid.uuid4().hex[:8]}"
    head = resolve_head_config(SlurmRunAllocationConfig(partition="cpu", time_limit="10", mem="256M",
                                                        cpus_per_task=1))
    info = SessionInfo(session_id=uuid.uuid4().hex, job_name=job_name, created_at=time.time(),
                       scheduler={"kind": "local", "state_dir": str(scheduler.state_dir)}, head=head.to_dict(),
                       launcher=RayLauncher().to_dict())
    directory = SessionDir.create(tmp_path / "session", info)
    worker = SlurmWorkerAllocationConfig(partition="cpu", num_nodes=1, cpus_per_task=1, mem="256M",
                                         time_limit="10")
    try:
        head_job = scheduler.submit(_sleep_spec(directory, job_name, "head", head))
        directory.update_allocation(lambda r: replace(r, head_job=head_job))
        directory.write_ray_head(head_job)
        worker_job = scheduler.submit(_sleep_spec(directory, job_name, "worker", worker))
        directory.update_allocation(lambda r: r.with_worker(
            WorkerRecord(job_id=worker_job, config=worker.to_dict(), submitted_at=time.time())))
        wait_until(lambda: all(i.state is JobState.RUNNING
                               for i in scheduler.query(job_name, [head_job, worker_job]).values()),
                   timeout=30, message="the sleep jobs to run")
        yield {"dir": directory, "scheduler": scheduler, "job_name": job_name, "head": head_job,
               "worker": worker_job}
    finally:
        scheduler.cancel_by_name(job_name)
        wait_until(lambda: not any(i.state.is_active for i in scheduler.query(job_name).values()),
                   timeout=60, message="the session's jobs to end in the finalizer")


def _run(sleepy, *args: str):
    runner = CliRunner()
    return runner.invoke(main, ["session", *args], obj={"scheduler": sleepy["scheduler"]},
                         catch_exceptions=False)


def test_status_shows_every_job_from_one_query(sleepy):
    scheduler = sleepy["scheduler"]
    before = scheduler.calls["query"]
    result = _run(sleepy, "status", str(sleepy["dir"].path))
    assert result.exit_code == 0, result.output
    assert scheduler.calls["query"] - before == 1
    out = result.stdout
    assert sleepy["job_name"] in out
    assert f"head: job {sleepy['head']} (no address published), heartbeat not ready" in out
    lines = {line.split()[1]: line for line in out.splitlines() if line.split()[:1] in (["head"], ["worker"])}
    assert "RUNNING" in lines[sleepy["head"]] and "cpu-" in lines[sleepy["head"]]
    assert "RUNNING" in lines[sleepy["worker"]]
    # the session's intent "submitted" is no note: Slurm's state already says it
    assert "submitted" not in lines[sleepy["worker"]]


def test_status_json_parses(sleepy):
    before = sleepy["scheduler"].calls["query"]
    result = _run(sleepy, "status", str(sleepy["dir"].path), "--json")
    assert result.exit_code == 0, result.output
    assert sleepy["scheduler"].calls["query"] - before == 1
    status = json.loads(result.stdout)
    assert {r["job_id"]: (r["role"], r["state"]) for r in status["jobs"]} == {
        sleepy["head"]: ("head", "RUNNING"), sleepy["worker"]: ("worker", "RUNNING")}
    assert status["head"]["job_id"] == sleepy["head"] and status["head"]["heartbeat"] == "not ready"
    assert status["active_jobs"] == 2


def test_status_again_within_max_age_takes_the_shared_answer_and_says_its_age(sleepy):
    scheduler, path = sleepy["scheduler"], str(sleepy["dir"].path)
    before = scheduler.calls["query"]
    first = _run(sleepy, "status", path, "--json")
    again = _run(sleepy, "status", path, "--json", "--max-age", "3600")
    assert scheduler.calls["query"] - before == 1          # the second shell asked nobody
    assert json.loads(again.stdout)["jobs"] == json.loads(first.stdout)["jobs"]
    assert 0 <= json.loads(again.stdout)["scheduler_answer_age"] < 3600
    table = _run(sleepy, "status", path, "--max-age", "0")
    assert scheduler.calls["query"] - before == 2          # --max-age 0 asks
    assert "scheduler answer: 0." in table.output


def test_status_reads_published_node_states_and_a_damaged_one_is_unknown(sleepy):
    directory, scheduler = sleepy["dir"], sleepy["scheduler"]
    jobs = scheduler.query(sleepy["job_name"], [sleepy["head"], sleepy["worker"]])
    worker_node, head_node = jobs[sleepy["worker"]].nodes[0], jobs[sleepy["head"]].nodes[0]
    directory.write_node_state(node_state(sleepy["worker"], worker_node, "JOINED", node_id="w" * 56,
                                          updated_at=time.time()))
    (directory.job_dir(sleepy["head"]) / "nodes").mkdir(parents=True)
    (directory.job_dir(sleepy["head"]) / "nodes" / f"{head_node}.json").write_text('{"state": "JOINED"}')
    result = _run(sleepy, "status", str(directory.path), "--json")
    assert result.exit_code == 0, result.output
    rows = {r["job_id"]: r["nodes"] for r in json.loads(result.stdout)["jobs"]}
    (worker,) = rows[sleepy["worker"]]
    assert (worker["node"], worker["agent_state"], worker["ray_node_id"]) == (worker_node, "JOINED", "w" * 56)
    (head,) = rows[sleepy["head"]]
    assert (head["node"], head["agent_state"], head["ray_node_id"]) == (head_node, None, None)


def test_status_without_a_scheduler_handed_in_opens_the_sessions_own(sleepy):
    # As a user runs it: the CLI builds the scheduler from session.json.
    result = CliRunner().invoke(main, ["session", "status", "--json", str(sleepy["dir"].path)])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert {r["state"] for r in doc["jobs"]} == {"RUNNING"}
    # What the run held so far rides along, as `session usage --json` gives it.
    usage = json.loads(CliRunner().invoke(main, ["session", "usage", "--json", str(sleepy["dir"].path)]).stdout)
    assert set(doc["usage"]) == {"allocations", "total"} and [a["job"] for a in doc["usage"]["allocations"]] == [
        a["job"] for a in usage["allocations"]]


def test_a_non_session_directory_is_one_line_and_exit_1(tmp_path):
    for path in (tmp_path, tmp_path / "missing"):
        result = CliRunner().invoke(main, ["session", "status", str(path)])
        assert result.exit_code == 1
        assert result.output.strip().splitlines() == [f"Error: {path} is not a session directory (no session.json)"]


def test_a_non_session_directory_from_the_installed_script_has_no_traceback(tmp_path):
    script = ROOT / ".venv" / "bin" / "elastic-ray"
    argv = [str(script)] if script.exists() else [sys.executable, "-m", "elastic_ray.cli"]
    done = subprocess.run([*argv, "session", "teardown", str(tmp_path)], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 1
    assert done.stdout == "" and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines() == [f"Error: {tmp_path} is not a session directory (no session.json)"]


def test_add_worker_with_a_bad_time_is_a_usage_error_naming_the_option(sleepy):
    submits = sleepy["scheduler"].calls["submit"]
    result = _run(sleepy, "add-worker", str(sleepy["dir"].path), "--partition", "cpu", "--time", "1:75")
    assert result.exit_code == 2
    assert "Error: --time: '1:75': seconds must be below 60" in result.output
    assert sleepy["scheduler"].calls["submit"] == submits


@pytest.mark.parametrize("args, words", [
    (["--ray-resource", "a40"], "Invalid value for '--ray-resource': 'a40' is not NAME=AMOUNT"),
    (["--ray-resource", "CPU=2"], "--ray-resource: 'CPU': is set by the agent"),
    (["--mem", "1G", "--mem-per-cpu", "1G"], "--mem-per-cpu: --mem and --mem-per-cpu are exclusive"),
    (["--nodes", "two"], "Invalid value for '--nodes'"),
    (["--timeout", "0"], "Invalid value for '--timeout'"),
    (["--resubmit-on-failure", "-1"], "Invalid value for '--resubmit-on-failure'"),
    (["--resubmit-on-failure", "x"], "Invalid value for '--resubmit-on-failure'"),
])
def test_add_worker_bad_options_exit_2(tmp_path, args, words):
    result = CliRunner().invoke(main, ["session", "add-worker", str(tmp_path), *args])
    assert result.exit_code == 2, result.output
    assert words in result.output


def test_ray_start_args_that_look_like_options_are_taken_as_values(tmp_path):
    # Parsing comes before the session is opened, so a non-session dir shows the options were accepted.
    result = CliRunner().invoke(main, ["session", "add-worker", str(tmp_path), "--ray-start-arg", "--num-cpus=4",
                                       "--ray-start-arg=--object-store-memory=1000000"])
    assert result.exit_code == 1 and "not a session directory" in result.output


def test_add_worker_no_wait_submits_and_teardown_leaves_nothing_active(sleepy):
    path = str(sleepy["dir"].path)
    scheduler = sleepy["scheduler"]
    result = _run(sleepy, "add-worker", path, "--partition", "cpu", "--nodes", "1", "--cpus-per-task", "1",
                  "--mem", "256M", "--time", "5", "--ray-resource", "accelerator:test=1", "--no-wait",
                  "--resubmit-on-failure", "2")
    assert result.exit_code == 0, result.output
    job = result.stdout.strip()
    assert job.isdigit() and job not in (sleepy["head"], sleepy["worker"])
    assert f"submitted worker allocation {job}" in result.stderr
    worker = sleepy["dir"].read_allocation().workers[job]
    assert worker.config["ray_resources"] == {"accelerator:test": 1.0}
    assert worker.resubmit_on_failure == 2
    assert worker.config["time_limit"] == "5"

    result = _run(sleepy, "teardown", path, "--timeout", "60")
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == "cancelled 3 job(s); none of the session's 3 job(s) is active"
    jobs = scheduler.query(sleepy["job_name"])
    assert set(jobs) == {sleepy["head"], sleepy["worker"], job}
    assert not any(i.state.is_active for i in jobs.values())

    # The status of a session whose jobs all ended: states from the query, no heartbeat wait.
    result = _run(sleepy, "status", path, "--json")
    assert result.exit_code == 0, result.output
    status = json.loads(result.stdout)
    assert status["active_jobs"] == 0 and status["head"]["heartbeat"] == "job ended"
    assert {r["state"] for r in status["jobs"]} <= {"CANCELLED", "COMPLETED"}


def test_status_shows_ended_unknown_for_a_job_the_scheduler_never_knew(sleepy):
    sleepy["dir"].update_allocation(lambda r: r.with_worker(
        WorkerRecord(job_id="999999", config={"partition": "cpu"}, submitted_at=time.time())))
    result = _run(sleepy, "status", str(sleepy["dir"].path))
    assert result.exit_code == 0, result.output
    line = next(line for line in result.stdout.splitlines() if "999999" in line and line.lstrip().startswith("worker"))
    assert "ENDED_UNKNOWN" in line and "cpu" in line
    # Its job ended while the session still wanted it: the status's query recorded it as a failure.
    assert "1 worker allocation(s) ended without being asked: 999999 ENDED_UNKNOWN" in result.stdout
    assert sleepy["dir"].read_allocation().workers["999999"].ended.state == "ENDED_UNKNOWN"


def test_remove_worker_cancels_an_allocation_without_agents_and_prints_its_state(sleepy):
    result = _run(sleepy, "remove-worker", str(sleepy["dir"].path), sleepy["worker"], "--drain-timeout", "5")
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == "CANCELLED"
    assert sleepy["dir"].read_allocation().workers[sleepy["worker"]].state == "removed"
    assert sleepy["scheduler"].query(sleepy["job_name"])[sleepy["head"]].state is JobState.RUNNING


@pytest.mark.parametrize("job, words", [("abc", "'abc' is not a job id"),
                                        ("999999", "job 999999 is not a worker allocation of this session")])
def test_remove_worker_refuses_a_job_that_is_not_a_worker(sleepy, job, words):
    result = _run(sleepy, "remove-worker", str(sleepy["dir"].path), job)
    assert result.exit_code == 2
    assert f"Invalid value for JOB: {words}" in result.output


def test_remove_worker_of_the_head_is_refused(sleepy):
    result = _run(sleepy, "remove-worker", str(sleepy["dir"].path), sleepy["head"])
    assert result.exit_code == 2 and "not a worker allocation" in result.output


def test_replace_head_on_a_non_session_directory_fails_in_one_line(tmp_path):
    result = CliRunner().invoke(main, ["session", "replace-head", str(tmp_path), "--timeout", "1"])
    assert result.exit_code == 1
    assert len(result.output.strip().splitlines()) == 1


def test_demo_command_is_still_there():
    result = CliRunner().invoke(main, ["demo", "--help"])
    assert result.exit_code == 0 and "--scheduler" in result.output


def test_session_group_lists_its_commands():
    result = CliRunner().invoke(main, ["session", "--help"])
    assert result.exit_code == 0
    for command in ("status", "add-worker", "remove-worker", "replace-head", "teardown"):
        assert command in result.output


def test_an_unexpected_option_error_reports_the_option(tmp_path):
    # click's own usage errors keep exit 2 through the failure wrapper.
    result = CliRunner().invoke(main, ["session", "status", str(tmp_path), "--bogus"])
    assert result.exit_code == 2 and "--bogus" in result.output
    assert isinstance(OptionError("--x", "y"), click.UsageError)


def test_status_notes_a_standby_head_and_a_failed_hosted_head():
    record, jobs, nodes, endpoint, observation = _fabricated()
    nodes = dict(nodes)
    nodes["21"] = dict(nodes["21"], **{"gpua-1": replace(
        nodes["21"]["gpua-1"], hosted_head=HostedHead(HostedHeadState.STANDBY, NOW - 3, address="10.0.0.5:6380",
                                                      worker_pid=4242))})
    nodes["22"] = {"gpub-1": replace(nodes["22"]["gpub-1"], hosted_head=HostedHead(HostedHeadState.FAILED, NOW - 3,
                                                                                     reason="it stopped", failures=3))}
    status = _status(nodes=nodes)
    rows = {r["job_id"]: r for r in status["jobs"]}
    assert [n["hosted_head"] for n in rows["21"]["nodes"]] == ["STANDBY", None]
    failed = rows["22"]["nodes"][0]
    # Three failures in a row: the keeper waits 120 s after the last one before it tries a standby there.
    assert (failed["hosted_head"], failed["hosted_head_failures"], failed["hosted_head_reason"],
            failed["hosted_head_retry_at"]) == ("FAILED", 3, "it stopped", NOW - 3 + 120)
    assert "hosted_head_failures" not in rows["21"]["nodes"][0]
    flat = " ".join(_text(status).split())    # the notes cell wraps
    assert "standby head (with its worker)" in flat
    assert rows["21"]["nodes"][0]["hosted_head_worker_pid"] == 4242
    assert "hosted head FAILED 3x in a row (it stopped); a standby's next try in 1m57s" in flat, flat
    assert "standby head" not in _text(_status())
