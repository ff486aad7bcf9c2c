"""``--log-format json``: the pure line format from tables, then both front ends for real.

The agent runs for real on a session directory with the simulation hooks'
stand-in ``ray`` and GCS probe (bench/standin/; no Ray), until its head is
published; it is then stopped by its PID (SIGTERM, SIGKILL if it lingers)
and every line it wrote to stderr must be a JSON object. ``elastic-ray``
runs ``session status --json`` on a session whose ``ray_head`` is damaged,
which logs one warning and exits 0.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest

from elastic_ray.config.launcher import RayLauncher
from elastic_ray.log_format import JsonFormatter, formatter, json_line, message_fields, utc_time
from elastic_ray.protocol.disk.records import SessionInfo
from elastic_ray.protocol.disk.session_dir import SessionDir
from tests.helpers import wait_until

pytestmark = pytest.mark.timeout(90)

ROOT = Path(__file__).resolve().parent.parent
STANDIN = ROOT / "bench" / "standin"
BASE = {"time", "level", "logger", "message"}


# ----------------------------------------------------------------- pure

@pytest.mark.parametrize("message, fields", [
    ("event=head_published job=5 node=cpu-1 role=head state=JOINED address=10.0.0.1:6379",
     {"event": "head_published", "job": "5", "node": "cpu-1", "role": "head", "state": "JOINED",
      "address": "10.0.0.1:6379"}),
    ("event=state_changed job=5 reason='draining: SIGTERM (job RUNNING)'",
     {"event": "state_changed", "job": "5", "reason": "draining: SIGTERM (job RUNNING)"}),
    ('event=x error="it\'s gone"', {"event": "x", "error": "it's gone"}),
    ("event=x path=/a/b#c", {"event": "x", "path": "/a/b#c"}),            # '#' is no comment
    ("event=x empty= k=a=b", {"event": "x", "empty": "", "k": "a=b"}),
    ("submitted worker allocation 7 (2 node(s))", {}),                    # prose: no fields
    ("event=x reason='unbalanced job=7", {"event": "x"}),                 # damage: only what came before
    ("=x 1k=y ok.dotted=z", {"ok.dotted": "z"}),
])
def test_message_fields(message, fields):
    assert message_fields(message) == fields


def test_utc_time_is_iso_with_milliseconds_and_z():
    assert utc_time(0.0) == "1970-01-01T00:00:00.000Z"
    assert utc_time(1764618639.5) == "2025-12-01T19:50:39.500Z"


@pytest.mark.parametrize("fields, message, expected", [
    (None, "event=a job=5", {"event": "a", "job": "5"}),
    # Structured fields keep their JSON types and win over the message's words.
    ({"event": "a", "job": "5", "pid": 12, "ok": True, "gone": None}, "event=a job=5 pid=12",
     {"event": "a", "job": "5", "pid": 12, "ok": True, "gone": None}),
    # A field never replaces a base key.
    ({"message": "m", "level": "x", "event": "a"}, "text", {"message_": "m", "level_": "x", "event": "a"}),
    ({"path": Path("/p"), "deadline": 1.5}, "text", {"path": "/p", "deadline": 1.5}),   # not JSON: as str
])
def test_json_line(fields, message, expected):
    line = json_line(created=0.0, level="INFO", logger="elastic_ray.agent", message=message, fields=fields)
    assert "\n" not in line
    doc = json.loads(line)
    assert {k: doc[k] for k in BASE} == {"time": "1970-01-01T00:00:00.000Z", "level": "INFO",
                                         "logger": "elastic_ray.agent", "message": message}
    assert {k: v for k, v in doc.items() if k not in BASE} == expected


def test_the_formatter_takes_fields_from_extra_and_keeps_a_traceback_on_one_line():
    log = logging.getLogger("test.log_format")
    record = log.makeRecord(log.name, logging.WARNING, __file__, 1, "event=%s job=%s", ("a", "7"), None,
                            extra={"fields": {"event": "a", "job": "7", "n": 3}})
    assert json.loads(JsonFormatter().format(record))["n"] == 3
    try:
        raise RuntimeError("boom\nsecond line")
    except RuntimeError:
        record = log.makeRecord(log.name, logging.ERROR, __file__, 1, "event=b", (), sys.exc_info())
    line = JsonFormatter().format(record)
    assert "\n" not in line and "RuntimeError: boom" in json.loads(line)["exception"]


def test_formatter_names_the_formats():
    assert isinstance(formatter("json"), JsonFormatter)
    assert formatter("text")._fmt == "%(asctime)s %(levelname)s %(message)s"
    with pytest.raises(ValueError, match="log format 'xml': must be one of text, json"):
        formatter("xml")


# ----------------------------------------------------------------- for real

def _session(tmp_path: Path) -> SessionDir:
    info = SessionInfo(session_id=uuid.uuid4().hex, job_name=f"er-log-{uuid.uuid4().hex[:6]}",
                       created_at=time.time(), head={"partition": "cpu", "time_limit": "10"},
                       scheduler={"kind": "local", "state_dir": str(tmp_path / "local-scheduler")},
                       launcher=RayLauncher().to_dict())
    return SessionDir.create(tmp_path / "session", info)


def _json_lines(text: str) -> list[dict]:
    lines = [line for line in text.splitlines() if line.strip()]
    assert lines, "nothing on stderr"
    docs = []
    for line in lines:
        doc = json.loads(line)          # fails the test, showing the line, when one is not JSON
        assert isinstance(doc, dict) and BASE <= doc.keys(), line
        docs.append(doc)
    return docs


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM the agent by its PID (it stops its own Ray node); SIGKILL it and
    what it left in its process tree if it has not ended within 30 s."""
    if proc.poll() is None:
        children = psutil.Process(proc.pid).children(recursive=True)
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        for child in children:
            try:
                child.kill()
            except psutil.NoSuchProcess:
                pass


def test_the_agent_writes_only_json_lines_to_stderr(tmp_path):
    session = _session(tmp_path)
    env = dict(os.environ, ELASTIC_RAY_RAY_EXECUTABLE=str(STANDIN / "ray"),
               ELASTIC_RAY_GCS_PROBE=f"{sys.executable} {STANDIN / 'gcs_probe.py'}",
               ELASTIC_AGENT_RUNTIME_DIR=str(tmp_path / "runtime"), ELASTIC_AGENT_SLURMD_CHECK="0",
               ELASTIC_AGENT_LOG_FORMAT="json")     # the knob; the option is given below as well
    stderr = tmp_path / "agent.err"
    with open(stderr, "wb") as err:
        proc = subprocess.Popen([sys.executable, "-m", "elastic_ray.agent", "run", "--session", str(session.path),
                                 "--job", "5", "--role", "head", "--node", "n-1", "--node-ip", "127.0.0.2",
                                 "--log-format", "json"], env=env, stdout=subprocess.DEVNULL, stderr=err)
    try:
        wait_until(lambda: session.read_head_endpoint("5"), 60, 0.2, "the head's endpoint")
    finally:
        _stop(proc)
    docs = _json_lines(stderr.read_text())
    events = {d.get("event"): d for d in docs}
    started = events["agent_started"]
    assert (started["job"], started["node"], started["role"]) == ("5", "n-1", "head")
    assert isinstance(started["pid"], int)                          # structured: a number, not "1234"
    assert events["head_published"]["address"].startswith("127.0.0.2:")
    assert events["head_published"]["dashboard"] == "off"
    assert docs[0]["message"].startswith("elastic-agent ")           # the banner is a record too
    # The log file in the session directory gets the same lines.
    log_file = session.log_dir / "agent-5-n-1.log"
    assert all(json.loads(line) for line in log_file.read_text().splitlines())


def test_the_agent_refuses_an_unknown_log_format_by_its_knob(tmp_path):
    session = _session(tmp_path)
    out = subprocess.run([sys.executable, "-m", "elastic_ray.agent", "run", "--session", str(session.path),
                          "--job", "5", "--role", "head"], env=dict(os.environ, ELASTIC_AGENT_LOG_FORMAT="xml"),
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "--log-format" in out.stderr and "'xml' is not one of" in out.stderr


@pytest.mark.parametrize("how", ["option", "knob"])
def test_elastic_ray_writes_its_log_lines_as_json(tmp_path, how):
    session = _session(tmp_path)
    (session.path / "ray_head").write_text("not-a-job\n")          # read as "unknown", with one warning
    argv = [sys.executable, "-m", "elastic_ray.cli", *(["--log-format", "json"] if how == "option" else []),
            "session", "status", "--json", str(session.path)]
    env = dict(os.environ, **({"ELASTIC_RAY_LOG_FORMAT": "json"} if how == "knob" else {}))
    env.pop("ELASTIC_RAY_SESSION", None)
    out = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["head"]["job_id"] is None        # stdout: the result, untouched
    (warning,) = _json_lines(out.stderr)
    assert warning["level"] == "WARNING" and warning["event"] == "ray_head_invalid"
    assert warning["content"] == "not-a-job" and warning["logger"] == "elastic_ray.protocol.disk.session_dir"
