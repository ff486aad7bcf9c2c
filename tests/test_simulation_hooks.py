"""The simulation hooks (agent/node/simulation.py): off by default, and when set the
agent runs the stand-ins of bench/standin/ exactly where it would run Ray."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import pytest

from elastic_ray.agent.node import gcs, join, local_ray, simulation
from elastic_ray.agent.node.ray_args import build_ray_start, default_ray_executable
from elastic_ray.agent.node.ray_node import RayNode
from elastic_ray.config import SlurmRunAllocationConfig, SlurmWorkerAllocationConfig
from elastic_ray.config.launcher import RayLauncher

STANDIN = Path(__file__).resolve().parent.parent / "bench" / "standin"


def test_hooks_are_off_unless_set():
    assert simulation.ray_executable({}) is None
    assert simulation.ray_executable({simulation.RAY_EXECUTABLE_ENV: "  "}) is None
    assert simulation.gcs_probe_argv({}) is None
    assert simulation.gcs_probe_argv({simulation.GCS_PROBE_ENV: ""}) is None


def test_hooks_read_their_variables():
    assert simulation.ray_executable({simulation.RAY_EXECUTABLE_ENV: "/opt/sim/ray"}) == "/opt/sim/ray"
    argv = simulation.gcs_probe_argv({simulation.GCS_PROBE_ENV: "/usr/bin/python3 '/a b/probe.py'"})
    assert argv == ["/usr/bin/python3", "/a b/probe.py"]


def test_a_probe_command_that_cannot_be_split_names_the_variable():
    with pytest.raises(ValueError, match=simulation.GCS_PROBE_ENV):
        simulation.gcs_probe_argv({simulation.GCS_PROBE_ENV: "python 'unclosed"})


def _launched_argv(monkeypatch, tmp_path, role: str) -> list[str]:
    captured: dict[str, list[str]] = {}

    class Node:
        @staticmethod
        def start(cmd, log_path):
            captured["argv"] = list(cmd.argv)
            raise RuntimeError("stop here")

    monkeypatch.setattr(local_ray, "RayNode", Node)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    alloc = (SlurmRunAllocationConfig(partition="cpu", time_limit="10") if role == "head"
             else SlurmWorkerAllocationConfig())
    lr = local_ray.LocalRay(local_ray.NodePlace("1", "n-1", "127.0.0.2", 0, "s-1", tmp_path), RayLauncher(),
                            alloc, lambda *a, **k: None, token_path=str(tmp_path / "token"))
    monkeypatch.setattr(lr, "_make_temp_dir", lambda d: None)
    with pytest.raises(RuntimeError, match="stop here"):
        lr.launch(None if role == "head" else "127.0.0.3:6379", lr.generation, role)
    return captured["argv"]


@pytest.mark.parametrize("role", ["head", "worker"])
def test_the_agent_starts_the_named_executable_only_when_set(monkeypatch, tmp_path, role):
    monkeypatch.delenv(simulation.RAY_EXECUTABLE_ENV, raising=False)
    assert _launched_argv(monkeypatch, tmp_path, role)[:2] == [default_ray_executable(), "start"]
    monkeypatch.setenv(simulation.RAY_EXECUTABLE_ENV, "/opt/sim/ray")
    assert _launched_argv(monkeypatch, tmp_path, role)[:2] == ["/opt/sim/ray", "start"]


def test_the_gcs_probe_hook_runs_the_stand_in(monkeypatch):
    monkeypatch.setenv(simulation.GCS_PROBE_ENV, f"{sys.executable} {STANDIN / 'gcs_probe.py'}")
    assert gcs.gcs_ready("127.0.0.1:1", timeout=20) == {"cluster_id": "standin", "session_name": "standin"}
    result = gcs.mark_nodes_dead("127.0.0.1:1", ["a" * 56, "b" * 56], message="gone", timeout=20)
    assert result.marked == ("a" * 56, "b" * 56)


def test_an_explicit_probe_prefix_still_wins_over_the_hook(monkeypatch):
    monkeypatch.setenv(simulation.GCS_PROBE_ENV, "/nonexistent/probe")
    answer = gcs.run_probe("ready", ["--address=127.0.0.1:1"], 20,
                           argv_prefix=[sys.executable, str(STANDIN / "gcs_probe.py")])
    assert answer["ok"] is True


def _signal_state(pid: int) -> dict[str, str]:
    """The state and signal lines of ``/proc/<pid>/status`` (empty once it is gone)."""
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return {}
    keys = ("State", "SigPnd", "ShdPnd", "SigBlk", "SigIgn", "SigCgt")
    return {k: v.strip() for k, _, v in (line.partition(":") for line in lines) if k in keys}


@pytest.mark.timeout(60)
def test_the_ray_stand_in_joins_and_stops_as_the_agent_sees_ray(tmp_path):
    """The agent's own join check and stop accept the stand-in `ray start`."""
    short = tempfile.mkdtemp(prefix="sim-", dir="/tmp")     # Ray's socket-path limit: a short temp dir
    request_cleanup = lambda: shutil.rmtree(short, ignore_errors=True)  # noqa: E731
    cmd = build_ray_start("worker", job_id="1", node_ip="127.0.0.2", temp_dir=f"{short}/t",
                          launcher=RayLauncher(), ports={}, head_address="127.0.0.3:6379",
                          ray_executable=str(STANDIN / "ray"), token_path=str(tmp_path / "token"))
    node = RayNode.start(cmd, tmp_path / "ray.log")
    try:
        started = time.time()
        joined = join.wait_joined(node, cmd.gcs_address, cmd.temp_dir, started, started + 30,
                                  cancelled=lambda: False, log=lambda *a, **k: None)
        assert joined is not None and joined.how == "raylet registered" and len(joined.node_id) == 56
        assert node.startup_finished()
        raylet = node.raylet_pid()
        assert raylet is not None
        signals = _signal_state(raylet)
    finally:
        # A wide grace: this checks that SIGTERM alone ends the stand-in, not
        # how fast it ends on a loaded machine (one CI run in about ten saw
        # the raylet outlive its 2.5 s share and get SIGKILLed).
        report = node.stop(grace=10.0)
        request_cleanup()
    # What /proc said of the raylet's signals just before the stop: the message
    # tells a blocked or ignored SIGTERM from a slow machine.
    assert node.members() == [] and report.killed == (), (report, signals)
    assert os.path.exists(tmp_path / "ray.log")
