"""The usage metadata of a ``compute.run`` materialization, in both modes.

The keys and their rounding by table (one function serves both modes); the
cluster mode on a session directory written here; the SSH mode against the
real test sshd and the real cluster-side server (no Ray: the session is an
event log written here), an older cluster side included.
"""

from __future__ import annotations

import importlib.util
import os
import textwrap

import pytest
from dagster import MetadataValue

from elastic_ray.dagster.usage_meta import fetch_command, figures_metadata, remote_usage_metadata, usage_metadata
from elastic_ray.history.summary import UsageSummary
from elastic_ray.protocol.disk import paths
from elastic_ray.protocol.disk.records import SessionInfo
from elastic_ray.remote import RemoteSession, SshConnection
from tests.history_events import scenario, write_session
from tests.remote_helpers import REMOTE_PYTHON, target_of

pytestmark = pytest.mark.timeout(120)

HAS_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None   # the cluster side is this venv too


@pytest.mark.parametrize("summary, expected", [
    (UsageSummary(0.0, 0.0, None, 0),
     {"elastic_ray/node_hours": 0.0, "elastic_ray/gpu_hours_held": 0.0, "elastic_ray/head_moves": 0}),
    (UsageSummary(1.234567, 8.0, 2.0, 2),
     {"elastic_ray/node_hours": 1.2346, "elastic_ray/gpu_hours_held": 8.0, "elastic_ray/head_moves": 2,
      "elastic_ray/gpu_hours_idle": 2.0, "elastic_ray/gpu_idle_share": 0.25}),
    (UsageSummary(0.5, 0.0, 0.0, 1),        # idle measured, nothing held: no share (no division by 0)
     {"elastic_ray/node_hours": 0.5, "elastic_ray/gpu_hours_held": 0.0, "elastic_ray/head_moves": 1,
      "elastic_ray/gpu_hours_idle": 0.0}),
    (UsageSummary(0.00004, 3.33333333, 1.11111111, 0, "/s/timeline.html"),   # the timeline is each mode's own
     {"elastic_ray/node_hours": 0.0, "elastic_ray/gpu_hours_held": 3.3333, "elastic_ray/head_moves": 0,
      "elastic_ray/gpu_hours_idle": 1.1111, "elastic_ray/gpu_idle_share": 0.3333}),
])
def test_the_figures_as_metadata(summary, expected):
    assert figures_metadata(summary) == expected


@pytest.mark.parametrize("user, port, expected", [
    (None, None, "scp login:/s/timeline.html ."),
    ("ada", None, "scp ada@login:/s/timeline.html ."),
    ("ada", 2222, "scp -P 2222 ada@login:/s/timeline.html ."),
])
def test_the_fetch_command(user, port, expected):
    assert fetch_command("login", user, port, "/s/timeline.html") == expected


def test_the_cluster_mode_reads_the_log_and_draws_the_page(tmp_path):
    session = write_session(tmp_path, scenario())
    meta = usage_metadata(session)
    assert meta["elastic_ray/head_moves"] == 1 and meta["elastic_ray/node_hours"] > 0
    timeline = meta["elastic_ray/timeline"]
    if HAS_MATPLOTLIB:
        assert timeline == MetadataValue.path(str(session / "timeline.html"))
    else:
        assert timeline == MetadataValue.text(f"elastic-ray session timeline {session} --output run.html")


def test_an_unreadable_log_costs_the_figures_and_names_the_session(tmp_path):
    session = write_session(tmp_path, [])
    events = paths.events_file(session)
    events.unlink(missing_ok=True)
    events.mkdir()      # a log that is a directory: an OSError on reading it
    meta = usage_metadata(session)
    assert list(meta) == ["elastic_ray/usage_error"]
    assert meta["elastic_ray/usage_error"].startswith(f"reading the event log of {session}: "), meta


@pytest.fixture
def conn(sshd):
    c = SshConnection(target_of(sshd))
    yield c
    c.close()


def over_ssh(conn, path, python=REMOTE_PYTHON) -> RemoteSession:
    """A client for ``path`` without a create (the session here is only an event log)."""
    info = SessionInfo(session_id="s-1", job_name="er-demo", created_at=0.0, scheduler={"kind": "local"}, head={})
    return RemoteSession(conn, str(path), python, {"info": info.to_dict()})


def test_the_ssh_mode_computes_the_figures_on_the_cluster_side(conn, tmp_path):
    session = write_session(tmp_path, scenario())
    # The story's nodes 101 are still in the run: their hours grow with the clock, so the
    # cluster side's figures lie between the cluster mode's read just before and just after.
    before = usage_metadata(session)
    meta = remote_usage_metadata(over_ssh(conn, session))
    after = usage_metadata(session)
    assert {k for k in meta if "timeline" not in k} == {k for k in before if "timeline" not in k}
    for key in ("elastic_ray/node_hours", "elastic_ray/gpu_hours_held"):
        assert before[key] <= meta[key] <= after[key], (key, before, meta, after)
    assert meta["elastic_ray/head_moves"] == 1
    host, port = conn.target.host, conn.target.port
    if HAS_MATPLOTLIB:
        page = str(session / "timeline.html")
        assert meta["elastic_ray/timeline"] == MetadataValue.text(f"{host}:{page}")
        assert meta["elastic_ray/timeline_fetch"] == MetadataValue.text(
            fetch_command(host, conn.target.user, port, page))
        assert os.path.isfile(page)
    else:
        assert meta["elastic_ray/timeline"] == MetadataValue.text(
            f"on {host}: elastic-ray session timeline {session} --output run.html")


def test_the_ssh_mode_without_a_session_names_the_path(conn, tmp_path):
    meta = remote_usage_metadata(over_ssh(conn, tmp_path / "gone"))
    assert list(meta) == ["elastic_ray/usage_error"]
    assert "SessionDirError" in meta["elastic_ray/usage_error"] and str(tmp_path / "gone") in meta[
        "elastic_ray/usage_error"]


def test_an_older_cluster_side_costs_the_figures_not_the_step(conn, tmp_path):
    """A cluster-side install from before the call answers "unknown op": the metadata says so."""
    older = tmp_path / "older-python"
    older.write_text(textwrap.dedent(f"""\
        #!/bin/sh
        exec {REMOTE_PYTHON} -c "from elastic_ray.remote import server; del server.OPS['usage']; server.main()"
        """))
    older.chmod(0o755)
    session = write_session(tmp_path, scenario())
    meta = remote_usage_metadata(over_ssh(conn, session, python=str(older)))
    assert list(meta) == ["elastic_ray/usage_error"]
    error = meta["elastic_ray/usage_error"]
    assert error.startswith(f"usage of {session} over ssh to {conn.target.host}: ProtocolError: "), error
    assert "unknown op 'usage'" in error
    assert not (session / "timeline.html").exists()
