"""``elastic-ray session events``: on a real session directory, in process and as a real command."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from click.testing import CliRunner

from elastic_ray.cli.events_cmd import format_time, parse_since
from elastic_ray.cli.main import main
from elastic_ray.config.launcher import RayLauncher
from elastic_ray.protocol.disk import event_log, paths
from elastic_ray.protocol.disk.events import Event, EventKind, EventSource
from elastic_ray.protocol.disk.records import SessionInfo
from elastic_ray.protocol.disk.session_dir import SessionDir

NOW = 1_796_150_000.0     # 2026-12-01 18:33:20 UTC


def _session(tmp_path: Path) -> Path:
    info = SessionInfo(session_id=uuid.uuid4().hex, job_name="er-events", created_at=NOW - 3600,
                       scheduler={"kind": "slurm"}, head={"partition": "cpu", "time_limit": "10"},
                       launcher=RayLauncher().to_dict())
    return SessionDir.create(tmp_path / "s", info).path


def _add(path: Path, at: float, kind: EventKind, **fields) -> None:
    assert event_log.append(path, Event(at=at, kind=kind, by=EventSource.COORDINATOR, **fields))


@pytest.mark.parametrize("text, expected", [
    ("90s", NOW - 90), ("15m", NOW - 900), ("2h", NOW - 7200), ("1d", NOW - 86400), ("0.5h", NOW - 1800),
    ("2026-12-01T18:00:00", 1_796_148_000.0), ("2026-12-01T18:00:00Z", 1_796_148_000.0),
    ("2026-12-01T19:00:00+01:00", 1_796_148_000.0),
])
def test_since_takes_an_age_or_a_time(text, expected):
    assert parse_since(text, NOW) == pytest.approx(expected)


@pytest.mark.parametrize("text", ["yesterday", "15 minutes", "-5m", "5w", ""])
def test_a_bad_since_names_the_option(text):
    import click
    with pytest.raises(click.BadParameter) as err:
        parse_since(text, NOW)
    assert "--since" in str(err.value.param_hint)


def test_format_time_is_utc_to_the_millisecond():
    assert format_time(NOW + 0.0123) == "2026-12-01 18:33:20.012Z"


def test_events_prints_the_history_oldest_first_and_since_filters_it(tmp_path):
    path = _session(tmp_path)           # creating it wrote session_created
    _add(path, NOW - 60, EventKind.SUBMITTED, job="7", details={"role": "worker", "partition": "gpu"})
    _add(path, NOW - 30, EventKind.PENDING, job="7", reason="Resources")
    result = CliRunner().invoke(main, ["session", "events", str(path)])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert [line.split()[3] for line in lines] == ["session_created", "submitted", "pending"]
    assert lines[1].endswith("submitted job=7 role=worker partition=gpu")
    assert lines[2].startswith("2026-12-01 18:32:50.000Z  coordinator pending job=7 Resources")
    since = CliRunner().invoke(main, ["session", "events", "--since", "2026-12-01T18:32:30", str(path)])
    assert since.exit_code == 0 and [line.split()[3] for line in since.output.splitlines()] == ["pending"]


def test_events_json_is_one_document_and_counts_skipped_lines(tmp_path):
    path = _session(tmp_path)
    _add(path, NOW, EventKind.REMOVED, job="7", reason="drained and ended", details={"state": "COMPLETED"})
    with open(paths.events_file(path), "ab") as f:
        f.write(b'{"v": 1, "at": 1, "ki')       # a torn last line
    result = CliRunner().invoke(main, ["session", "events", "--json", str(path)])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert doc["command"] == "session events" and doc["skipped"] == {"damaged": 1}
    assert doc["events"][-1] == {"v": 1, "at": NOW, "kind": "removed", "by": "coordinator", "job": "7",
                                 "reason": "drained and ended", "details": {"state": "COMPLETED"}}


def test_events_on_a_directory_that_is_not_a_session_is_an_error_and_writes_nothing(tmp_path):
    (tmp_path / "empty").mkdir()
    result = CliRunner().invoke(main, ["session", "events", str(tmp_path / "empty")])
    assert result.exit_code != 0 and "session" in result.output.lower()
    assert list((tmp_path / "empty").iterdir()) == []
    bad = CliRunner().invoke(main, ["session", "events", "--since", "soon", str(tmp_path / "empty")])
    assert bad.exit_code == 2 and "--since" in bad.output


def test_follow_as_a_real_command_prints_appended_events_until_ctrl_c(tmp_path):
    path = _session(tmp_path)
    cli = Path(sys.executable).with_name("elastic-ray")
    # Started as from a terminal: a test runner in the background ignores SIGINT, and its children would too.
    proc = subprocess.Popen([sys.executable, "-m", "elastic_ray.clean_exec", str(cli), "session", "events",
                             "--follow", "--json", str(path)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        first = json.loads(proc.stdout.readline())
        assert first["kind"] == "session_created"
        for i in range(3):
            _add(path, time.time(), EventKind.STARTED, job=str(10 + i), node="n1")
        got = [json.loads(proc.stdout.readline()) for _ in range(3)]
        assert [g["job"] for g in got] == ["10", "11", "12"]
        os.kill(proc.pid, signal.SIGINT)
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        proc.stdout.close()
        proc.stderr.close()
