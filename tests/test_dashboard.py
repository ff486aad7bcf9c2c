"""The head's dashboard address: its record field, where it is found, the SSH
tunnel to it and ``elastic-ray session dashboard`` on a session directory
written by hand (real files; the command reads them as on a cluster).

The real head that publishes an address whose port answers is in
tests/test_dashboard_local.py (it starts Ray).
"""

from __future__ import annotations

import json
import shlex
import time
import uuid
from pathlib import Path

import pytest
from click.testing import CliRunner

from elastic_ray.agent.node.ray_args import build_ray_start
from elastic_ray.cli import main
from elastic_ray.cli.dashboard_model import (
    TURN_ON,
    DashboardPlace,
    locate_dashboard,
    split_address,
    tunnel_argv,
    tunnel_command,
)
from elastic_ray.config.launcher import RayLauncher
from elastic_ray.protocol.disk.records import HeadEndpoint, SessionInfo
from elastic_ray.protocol.disk.session_dir import SessionDir

pytestmark = pytest.mark.timeout(60)

BASE = {"job_id": "20", "host": "cpu-1", "address": "10.0.0.1:6379", "ray_version": "2.60.0",
        "started_at": 1000.0, "ports": {"gcs_port": 6379, "dashboard_port": 8265}}


# ----------------------------------------------------------------- HeadEndpoint.dashboard

@pytest.mark.parametrize("extra, dashboard", [
    ({}, None),                                         # written by an agent that predates the field
    ({"dashboard": None}, None),                        # null reads as "off"
    ({"dashboard": "10.0.0.1:8265"}, "10.0.0.1:8265"),
    ({"dashboard": "cpu-1.cluster:30002"}, "cpu-1.cluster:30002"),
])
def test_head_endpoint_reads_the_dashboard_when_there_and_none_when_not(extra, dashboard):
    endpoint = HeadEndpoint.from_dict({**BASE, **extra})
    assert endpoint.dashboard == dashboard
    written = endpoint.to_dict()
    assert ("dashboard" in written) == (dashboard is not None)   # absent when off: older readers see no change
    assert HeadEndpoint.from_dict(written) == endpoint


@pytest.mark.parametrize("value, message", [
    ("10.0.0.1", "dashboard '10.0.0.1' is not host:port"),
    (":8265", "dashboard ':8265' is not host:port"),
    ("10.0.0.1:0", "is not host:port"),
    ("10.0.0.1:65536", "is not host:port"),
    ("10.0.0.1:http", "is not host:port"),
    (8265, "'dashboard' has type int"),
    (True, "'dashboard' must not be a boolean"),
])
def test_head_endpoint_refuses_a_bad_dashboard_naming_the_key(value, message):
    with pytest.raises(ValueError, match=message):
        HeadEndpoint.from_dict({**BASE, "dashboard": value})


def test_a_bad_gcs_address_is_still_named_as_before():
    with pytest.raises(ValueError, match="address 'nohost' is not host:port"):
        HeadEndpoint.from_dict({**BASE, "address": "nohost"})


# ----------------------------------------------------------------- which ray start publishes what

@pytest.mark.parametrize("role, dashboard, ports, address", [
    ("head", True, {"gcs_port": 6400, "dashboard_port": 30002}, "10.0.0.7:30002"),
    ("head", True, {"gcs_port": 6400}, "10.0.0.7:8265"),          # fixed strategy: Ray's default port
    ("head", False, {"gcs_port": 6400, "dashboard_port": 30002}, None),
    ("worker", True, {}, None),                                    # a worker runs no dashboard
])
def test_the_start_command_knows_its_dashboard_and_binds_it_to_the_node(role, dashboard, ports, address):
    launcher = RayLauncher(include_dashboard=dashboard, auth_mode="disabled")
    cmd = build_ray_start(role, job_id="7", node_ip="10.0.0.7", temp_dir="/tmp/er-x", launcher=launcher,
                          ports=ports, head_address=None if role == "head" else "10.0.0.1:6379")
    assert cmd.dashboard_address == address
    # On the node's address, not Ray's 127.0.0.1: a tunnel through the login host must reach it.
    assert ("--dashboard-host=10.0.0.7" in cmd.argv) == (address is not None)


# ----------------------------------------------------------------- locate_dashboard

def _endpoint(job: str = "20", dashboard: str | None = "10.0.0.1:8265") -> HeadEndpoint:
    return HeadEndpoint.from_dict({**BASE, "job_id": job, **({"dashboard": dashboard} if dashboard else {})})


@pytest.mark.parametrize("pointer, endpoint, launcher, address, problem", [
    ("20", _endpoint(), {"include_dashboard": True}, "10.0.0.1:8265", None),
    (None, None, {"include_dashboard": True}, None, "no head yet"),
    ("20", None, {"include_dashboard": True}, None, "head job 20 has not published its endpoint"),
    # head.json of the job before: the pointer moved, the new head is not ready.
    ("21", _endpoint("20"), {"include_dashboard": True}, None, "head job 21 has not published its endpoint"),
    ("20", _endpoint(dashboard=None), {"include_dashboard": False}, None, f"the dashboard is off: {TURN_ON}"),
    ("20", _endpoint(dashboard=None), {}, None, "the dashboard is off"),
    ("20", _endpoint(dashboard=None), {"include_dashboard": True}, None, "published no dashboard address"),
])
def test_locate_dashboard(pointer, endpoint, launcher, address, problem):
    place = locate_dashboard(pointer, endpoint, launcher)
    assert place.address == address
    assert (place.problem is None) if problem is None else problem in place.problem
    assert place.head_job == pointer


# ----------------------------------------------------------------- the ssh command

@pytest.mark.parametrize("address, local, login, argv", [
    ("10.0.0.1:8265", 8265, "login.cluster.example.org",
     ["ssh", "-N", "-L", "8265:10.0.0.1:8265", "login.cluster.example.org"]),
    ("10.0.0.1:30002", 9000, "alice@login1", ["ssh", "-N", "-L", "9000:10.0.0.1:30002", "alice@login1"]),
    ("cpu-1:30002", 8265, "cluster", ["ssh", "-N", "-L", "8265:cpu-1:30002", "cluster"]),
    ("[fd00::7]:30002", 8265, "cluster", ["ssh", "-N", "-L", "8265:[fd00::7]:30002", "cluster"]),
])
def test_tunnel_argv(address, local, login, argv):
    assert tunnel_argv(address, local, login) == argv
    assert shlex.split(tunnel_command(address, local, login)) == argv   # quoted where a shell needs it


@pytest.mark.parametrize("address, local, login, message", [
    ("10.0.0.1:8265", 0, "login", "--local-port: 0 is not a TCP port"),
    ("10.0.0.1:8265", 65536, "login", "--local-port"),
    ("10.0.0.1:8265", True, "login", "--local-port"),
    ("10.0.0.1:8265", 8265, "-oProxyCommand=evil", "--login: '-oProxyCommand=evil' is not a host name"),
    ("10.0.0.1:8265", 8265, "login host", "--login"),
    ("10.0.0.1:8265", 8265, "", "--login"),
    ("10.0.0.1", 8265, "login", "dashboard address '10.0.0.1' is not host:port"),
])
def test_tunnel_argv_refuses_what_ssh_would_misread(address, local, login, message):
    with pytest.raises(ValueError, match=message):
        tunnel_argv(address, local, login)


def test_split_address_unbrackets_ipv6():
    assert split_address("[::1]:8265") == ("::1", 8265)
    assert split_address("10.0.0.1:8265") == ("10.0.0.1", 8265)


def test_a_place_is_json_ready():
    assert json.loads(json.dumps(DashboardPlace("20", "cpu-1", "10.0.0.1:8265", None).to_dict()))["address"]


# ----------------------------------------------------------------- the command, on real files

def _session(tmp_path: Path, include_dashboard: bool) -> SessionDir:
    info = SessionInfo(session_id=uuid.uuid4().hex, job_name="er-dash", created_at=time.time(),
                       scheduler={"kind": "slurm"}, head={"partition": "cpu"},
                       launcher=RayLauncher(include_dashboard=include_dashboard).to_dict())
    return SessionDir.create(tmp_path / "session", info)


def _write_head(session: SessionDir, job: str, dashboard: str | None) -> None:
    """ray_head and jobs/<job>/head.json as an agent leaves them, written as plain files."""
    (session.path / "jobs" / job).mkdir(parents=True, exist_ok=True)
    record = {**BASE, "job_id": job, **({"dashboard": dashboard} if dashboard else {})}
    (session.path / "jobs" / job / "head.json").write_text(json.dumps(record))
    (session.path / "ray_head").write_text(f"{job}\n")


def _run(*args: str):
    return CliRunner().invoke(main, ["session", "dashboard", *args], catch_exceptions=False)


def test_dashboard_prints_the_tunnel_to_the_current_head_and_follows_it(tmp_path):
    session = _session(tmp_path, include_dashboard=True)
    _write_head(session, "20", "10.0.0.1:30002")
    result = _run(str(session.path), "--login", "login.cluster.example.org")
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == "ssh -N -L 8265:10.0.0.1:30002 login.cluster.example.org"
    assert "open http://localhost:8265" in result.stderr and "ray_token" in result.stderr

    _write_head(session, "31", "10.0.0.9:30050")       # the head moved: the next call follows it
    result = _run(str(session.path), "--login", "login1", "--local-port", "9000", "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["head_job"] == "31" and doc["address"] == "10.0.0.9:30050" and doc["url"] == "http://localhost:9000"
    assert doc["argv"] == ["ssh", "-N", "-L", "9000:10.0.0.9:30050", "login1"]


def test_dashboard_defaults_to_this_host_and_takes_the_session_from_the_environment(tmp_path, monkeypatch):
    session = _session(tmp_path, include_dashboard=True)
    _write_head(session, "20", "10.0.0.1:30002")
    monkeypatch.setenv("ELASTIC_RAY_SESSION", str(session.path))
    result = _run("--json")
    assert result.exit_code == 0, result.output
    from elastic_ray.cli.dashboard import this_host
    assert json.loads(result.stdout)["login"] == this_host()


@pytest.mark.parametrize("include, head, message", [
    (True, None, "no dashboard to tunnel to: no head yet"),
    (True, "pointer-only", "head job 20 has not published its endpoint (jobs/20/head.json)"),
    (False, "10.0.0.1:6379-no-dashboard", "the dashboard is off: set include_dashboard=True"),
])
def test_dashboard_fails_naming_what_is_missing(tmp_path, include, head, message):
    session = _session(tmp_path, include_dashboard=include)
    if head == "pointer-only":
        (session.path / "ray_head").write_text("20\n")
    elif head is not None:
        _write_head(session, "20", None)
    result = _run(str(session.path), "--login", "login1")
    assert result.exit_code == 1
    assert message in result.stderr
    assert result.stdout == ""


def test_dashboard_refuses_a_login_that_ssh_would_read_as_an_option(tmp_path):
    session = _session(tmp_path, include_dashboard=True)
    _write_head(session, "20", "10.0.0.1:30002")
    result = _run(str(session.path), "--login=-oProxyCommand=x")
    assert result.exit_code == 2 and "is not a host name" in result.stderr
