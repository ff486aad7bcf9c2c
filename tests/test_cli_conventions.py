"""CLI conventions (issue 12): --json with a schema on every command, errors as
JSON too, $ELASTIC_RAY_SESSION, status --check and --watch, render, create,
and the agent's node-file refresh that keeps a steady JOINED node from reading stale."""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner
from rich.console import Console

import elastic_ray.cli.session as cli_session
from elastic_ray.agent.head.publishing import NodeFile
from elastic_ray.cli import main
from elastic_ray.cli.output import SCHEMA
from elastic_ray.cli.status_model import (
    CHECK_HEAD_LOST,
    CHECK_HEAD_STARTING,
    CHECK_HEALTHY,
    CHECK_WORKER_FAILED,
    build_status,
    health,
)
from elastic_ray.cli.status_view import render_status
from elastic_ray.config.launcher import RayLauncher
from elastic_ray.config.session_file import SESSION_ENV
from elastic_ray.protocol.disk.records import AllocationRecord, SessionInfo
from elastic_ray.protocol.disk.session_dir import SessionDir
from elastic_ray.scheduler.base import JobInfo, JobState
from tests.helpers import node_state
from tests.test_cli import _run, sleepy  # noqa: F401  (sleepy is a fixture)

pytestmark = pytest.mark.timeout(120)

HEAD_TOML = '[head]\npartition = "cpu"\ntime_limit = "10"\nmem = "256M"\ncpus_per_task = 1\n'


def _doc(result, command: str) -> dict:
    doc = json.loads(result.stdout)          # stdout holds one JSON object and nothing else
    assert doc["schema"] == SCHEMA and doc["command"] == command
    return doc


# =============================================================== pure: --check

def _status(heartbeat: str, head_state: str = "RUNNING", failures=()) -> dict:
    return {"head": {"job_id": "1", "heartbeat": heartbeat},
            "jobs": [{"job_id": "1", "state": head_state}], "failures": list(failures)}


@pytest.mark.parametrize("status, code", [
    (_status("live"), CHECK_HEALTHY),
    (_status("live", failures=[{"job_id": "7", "state": "NODE_FAIL", "replaced_by": "9"}]), CHECK_HEALTHY),
    (_status("live", failures=[{"job_id": "7", "state": "NODE_FAIL", "replaced_by": None}]), CHECK_WORKER_FAILED),
    (_status("silent"), CHECK_HEAD_LOST),
    (_status("job ended", "FAILED"), CHECK_HEAD_LOST),
    (_status("unknown"), CHECK_HEAD_LOST),
    (_status("no head"), CHECK_HEAD_LOST),
    (_status("silent", failures=[{"job_id": "7", "state": "FAILED", "replaced_by": None}]), CHECK_HEAD_LOST),
    (_status("not ready", "PENDING"), CHECK_HEAD_STARTING),
    (_status("not ready", "COMPLETED"), CHECK_HEAD_LOST),
])
def test_check_codes(status, code):
    got, reasons = health(status)
    assert got == code
    assert bool(reasons) == (code != CHECK_HEALTHY)


def test_the_check_codes_are_distinct_from_the_cli_errors():
    assert len({CHECK_HEALTHY, CHECK_HEAD_LOST, CHECK_WORKER_FAILED, CHECK_HEAD_STARTING, 1, 2}) == 6


# =============================================================== pure: a long pending reason

def test_a_long_pending_reason_is_shown_whole_in_a_narrow_table():
    reason = "ReqNodeNotAvail,_UnavailableNodes:gpu-a40-[001-064],gpu-a100-[001-032]"
    info = SessionInfo(session_id="s" * 32, job_name="er-x", created_at=0.0, scheduler={"kind": "slurm"},
                       head={}, launcher={})
    jobs = {"5": JobInfo("5", "er-x", JobState.PENDING, reason=reason, partition="gpu")}
    status = build_status(path="/s", info=info, record=AllocationRecord(head_job="5"), jobs=jobs, nodes={},
                          pointer="5", endpoint=None, observation=None, now=100.0)
    assert status["jobs"][0]["reason"] == reason            # squeue's reason, in the JSON too
    console = Console(width=100, record=True, force_terminal=False)
    console.print(render_status(status))
    text = console.export_text()
    assert "…" not in text
    # The reason folds in the last column: from "reason: " on, the lines hold nothing else.
    tail = text[text.index("reason: ") + len("reason: "):]
    assert "".join(line.strip() for line in tail.splitlines()).startswith(reason)


# =============================================================== the node file stays fresh

def test_a_steady_joined_agent_is_not_stale_past_the_threshold_and_is_once_it_stops(tmp_path):
    """The agent's real NodeFile, with the refresh and the status's threshold made
    short: a JOINED node whose state never changes, watched for longer than
    the threshold, reads fresh; once the refreshes stop it reads stale."""
    info = SessionInfo(session_id="a" * 32, job_name="er-stale", created_at=time.time(),
                       scheduler={"kind": "local"}, head={}, launcher=RayLauncher().to_dict())
    directory = SessionDir.create(tmp_path / "session", info)
    events = []
    node_file = NodeFile(directory, lambda event, **f: events.append(event), refresh=0.1, slack=0.0)
    state = node_state("12", "cpu-1", "JOINED", node_id="n" * 56, updated_at=time.time())
    jobs = {"12": JobInfo("12", "er-stale", JobState.RUNNING, nodes=("cpu-1",))}

    def stale() -> bool:
        nodes = {"12": directory.read_node_states("12")}
        status = build_status(path=directory.path, info=info, record=AllocationRecord(), jobs=jobs, nodes=nodes,
                              pointer=None, endpoint=None, observation=None, now=time.time(), stale_after=0.4)
        (row,) = status["jobs"]
        return row["nodes"][0]["agent_stale"]

    assert node_file.publish(state, time.time(), changed=True)
    end = time.time() + 1.2                       # three thresholds of steady state
    while time.time() < end:
        node_file.publish(replace(state, updated_at=time.time()), time.time(), changed=False)
        assert not stale()
        time.sleep(0.05)
    time.sleep(0.5)                               # the agent stops refreshing (hung)
    assert stale()
    assert events == []


def test_a_refresh_is_not_written_before_it_is_due(tmp_path, monkeypatch):
    writes = []

    class Dir:
        def write_node_state(self, state, *, durable=True):
            writes.append(durable)

    node_file = NodeFile(Dir(), lambda *a, **k: None, refresh=10.0, slack=2.0)
    state = node_state()
    node_file.publish(state, 100.0, changed=True)
    node_file.publish(state, 105.0, changed=False)       # not due: nothing written
    node_file.publish(state, 108.5, changed=False)       # due within the slack: a refresh, not fsynced
    node_file.publish(state, 109.0, changed=True)        # a change: written at once, fsynced
    assert writes == [True, False, True]


# =============================================================== commands with --json

def test_status_json_has_the_schema_and_check_gives_its_code(sleepy):  # noqa: F811
    path = str(sleepy["dir"].path)
    doc = _doc(_run(sleepy, "status", path, "--json"), "session status")
    assert doc["head"]["heartbeat"] == "not ready" and "check" not in doc
    result = _run(sleepy, "status", path, "--json", "--check")
    assert result.exit_code == CHECK_HEAD_STARTING
    assert _doc(result, "session status")["check"]["code"] == CHECK_HEAD_STARTING
    table = _run(sleepy, "status", path, "--check")
    assert table.exit_code == CHECK_HEAD_STARTING and "check: head job" in table.stderr


def test_session_env_is_the_default_directory(sleepy, monkeypatch):  # noqa: F811
    monkeypatch.setenv(SESSION_ENV, str(sleepy["dir"].path))
    doc = _doc(_run(sleepy, "status", "--json"), "session status")
    assert doc["session"]["path"] == str(sleepy["dir"].path)
    result = _run(sleepy, "remove-worker", sleepy["worker"], "--drain-timeout", "5", "--json")
    assert result.exit_code == 0, result.output
    assert _doc(result, "session remove-worker") == {
        "schema": SCHEMA, "command": "session remove-worker", "job_id": sleepy["worker"], "state": "CANCELLED",
        "waited": True}
    repair = _doc(_run(sleepy, "repair", "--json"), "session repair")
    assert repair["damaged"] is False and repair["restored"] is False
    teardown = _run(sleepy, "teardown", "--json", "--timeout", "60")
    assert teardown.exit_code == 0, teardown.output
    doc = _doc(teardown, "session teardown")
    assert doc["cancelled"] == [sleepy["head"]] and doc["active"] == []
    status = _run(sleepy, "status", "--check")
    assert status.exit_code == CHECK_HEAD_LOST


@pytest.mark.parametrize("command", [["status"], ["add-worker"], ["remove-worker", "12"], ["replace-head"],
                                     ["teardown"], ["repair"]])
def test_without_dir_or_env_every_command_says_so(command, monkeypatch):
    monkeypatch.delenv(SESSION_ENV, raising=False)
    result = CliRunner().invoke(main, ["session", *command])
    assert result.exit_code == 2
    assert "DIR: no session directory given; pass DIR or set ELASTIC_RAY_SESSION" in result.output


@pytest.mark.parametrize("args, command, code, kind", [
    (["session", "status", "{dir}"], "session status", 1, "failure"),
    (["session", "add-worker", "{dir}", "--nodes", "two"], "session add-worker", 2, "usage"),
    (["session", "add-worker", "{dir}", "--no-wait"], "session add-worker", 1, "failure"),
    (["session", "remove-worker", "{dir}", "12"], "session remove-worker", 1, "failure"),
    (["session", "replace-head", "{dir}", "--timeout", "1"], "session replace-head", 1, "failure"),
    (["session", "teardown", "{dir}"], "session teardown", 1, "failure"),
    (["session", "repair", "{dir}"], "session repair", 1, "failure"),
    (["session", "create", "--config", "{dir}/missing.toml"], "session create", 2, "usage"),
    (["render", "--config", "{dir}/missing.toml"], "render", 2, "usage"),
])
def test_errors_with_json_are_a_json_object_on_stdout_and_keep_their_exit_code(tmp_path, args, command, code,
                                                                                 kind):
    result = CliRunner().invoke(main, [a.replace("{dir}", str(tmp_path)) for a in args] + ["--json"])
    assert result.exit_code == code, result.output
    doc = _doc(result, command)
    assert doc["error"]["type"] == kind and doc["error"]["exit_code"] == code and doc["error"]["message"]
    assert "Error:" in result.stderr


def test_status_watch_redraws_from_the_shared_answer_until_ctrl_c(sleepy, monkeypatch):  # noqa: F811
    ticks = []

    def sleep(seconds):
        ticks.append(seconds)
        if len(ticks) == 3:
            raise KeyboardInterrupt

    monkeypatch.setattr(cli_session, "_watch_sleep", sleep)
    before = sleepy["scheduler"].calls["query"]
    result = _run(sleepy, "status", str(sleepy["dir"].path), "--watch", "0.5")
    assert result.exit_code == 0, result.output
    assert ticks == [0.5, 0.5, 0.5]
    assert sleepy["scheduler"].calls["query"] - before == 1     # three views, one scheduler query
    assert sleepy["head"] in result.stdout
    refused = _run(sleepy, "status", str(sleepy["dir"].path), "--watch", "--json")
    assert refused.exit_code == 2 and "--watch: not with --json" in refused.output


# =============================================================== render and create

def test_render_prints_the_scripts_and_creates_nothing(tmp_path):
    config = tmp_path / "s.toml"
    config.write_text('job_name = "er-render"\n' + HEAD_TOML +
                      '[worker_allocation]\nnum_nodes = 2\n[[workers]]\npartition = "gpu"\nresubmit_on_failure = 1\n')
    target = tmp_path / "session"
    result = CliRunner().invoke(main, ["render", "--config", str(config), "--dir", str(target)])
    assert result.exit_code == 0, result.output
    assert not target.exists()
    out = result.stdout
    assert out.count("#!/bin/bash") == 3
    assert "# ===== head allocation, from [head] =====" in out
    assert "# ===== worker allocation, from [workers[0]] (resubmit_on_failure = 1) =====" in out
    assert "#SBATCH --partition=gpu" in out and "#SBATCH --nodes=2" in out
    doc = _doc(CliRunner().invoke(main, ["render", "--config", str(config), "--dir", str(target), "--json"]),
               "render")
    assert [(j["role"], j["source"]) for j in doc["jobs"]] == [
        ("head", "head"), ("worker", "worker_allocation"), ("worker", "workers[0]")]
    assert not target.exists()


def test_render_of_a_bad_file_names_the_key_and_exits_2(tmp_path):
    config = tmp_path / "s.toml"
    config.write_text(HEAD_TOML + "[launcher]\nport_strategy = 'nope'\n")
    result = CliRunner().invoke(main, ["render", "--config", str(config), "--dir", str(tmp_path / "d")])
    assert result.exit_code == 2
    assert f"{config}: launcher.port_strategy: must be one of random, hash_jobid, fixed" in result.output


def test_create_from_a_file_on_the_local_scheduler(tmp_path, monkeypatch):
    """Real agents are submitted; Ray is replaced by `false` (the simulation
    hook), so nothing heavy starts, and the teardown under test ends them."""
    from elastic_ray.scheduler.local import LocalScheduler

    monkeypatch.setenv("ELASTIC_RAY_RAY_EXECUTABLE", "false")
    monkeypatch.setenv("ELASTIC_AGENT_RUNTIME_DIR", str(tmp_path / "agent-runtime"))
    scheduler = LocalScheduler(tmp_path / "local-scheduler")
    config = tmp_path / "s.toml"
    config.write_text('path = "session"\n' + HEAD_TOML + '[[workers]]\npartition = "cpu"\nnum_nodes = 1\n'
                      'time_limit = "5"\nmem = "256M"\n')
    runner = CliRunner()
    result = runner.invoke(main, ["session", "create", "--config", str(config), "--json"],
                           obj={"scheduler": scheduler}, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    doc = _doc(result, "session create")
    path = Path(doc["path"])
    try:
        assert path == tmp_path / "session" and (path / "session.json").exists()
        assert doc["head_job"] and len(doc["workers"]) == 1 and doc["head_address"] is None
        again = runner.invoke(main, ["session", "create", "--config", str(config)], obj={"scheduler": scheduler})
        assert again.exit_code == 1            # the directory holds a session already: refused, one line
    finally:
        down = runner.invoke(main, ["session", "teardown", str(path), "--json", "--timeout", "60"],
                             obj={"scheduler": scheduler})
    assert down.exit_code == 0, down.output
    cancelled = set(_doc(down, "session teardown")["cancelled"])
    # The worker waits for a head, so it is still running: cancelled. The head's agent fails at once here
    # (Ray is `false`): its job is cancelled, or it had ended by itself before the teardown came (CI's load).
    assert set(doc["workers"]) <= cancelled <= {doc["head_job"], *doc["workers"]}
    if doc["head_job"] not in cancelled:
        head = scheduler.query("", [doc["head_job"]])[doc["head_job"]]
        assert head.state.value == "FAILED", head
