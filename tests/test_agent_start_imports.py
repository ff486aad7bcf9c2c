"""The agent's path to `ray start` imports nothing heavy it does not need.

Every node of every allocation runs one agent, and a joining node waits for
it: its start-up is on the critical path of a join. A fresh interpreter
imports the agent's entry module, builds an Agent on a session directory and
goes through the real launch up to the moment it would spawn `ray start`;
then it lists what it has imported. ``import ray`` alone costs seconds and
75 MB (GCS work runs in probe processes, ``agent.node.gcs``); the coordinator and
Dagster are other rooms; ``importlib.metadata`` (with the email package) is
needed only to publish a running head's Ray version.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from elastic_ray.config.launcher import RayLauncher
from elastic_ray.protocol.disk.records import SessionInfo
from elastic_ray.protocol.disk.session_dir import SessionDir

FORBIDDEN = ("ray", "dagster", "dagster_pipes", "dagster_shared", "elastic_ray.coordinator", "importlib.metadata",
             "email", "zmq.asyncio", "zmq.utils.monitor")

PROBE = r'''
import json, os, shutil, sys
{extra}
import elastic_ray.agent.cli  # what `python -m elastic_ray.agent` and `elastic-agent` import first
from elastic_ray.agent.node import ray_node
from elastic_ray.agent.runner import Agent, AgentOptions   # what `run` imports

seen = {{}}

def start(cls, cmd, log_path, **kwargs):   # the moment the agent would spawn `ray start`
    seen["argv"] = list(cmd.argv)
    seen["modules"] = sorted(sys.modules)
    shutil.rmtree(cmd.temp_dir, ignore_errors=True)
    raise SystemExit(0)

ray_node.RayNode.start = classmethod(start)
agent = Agent(AgentOptions(session=sys.argv[1], job_id="4242", role="head", node="probe", node_ip="127.0.0.2"))
try:
    agent.local.launch(None, agent.local.generation, "head")
except SystemExit:
    pass
agent.control.close()
agent.publishing.close()
print(json.dumps(seen))
'''


def _session(tmp_path) -> str:
    info = SessionInfo(session_id="s-imports", job_name="er-imports", created_at=1.0, scheduler={"kind": "local"},
                       head={"partition": "cpu"}, worker_allocation=None, launcher=RayLauncher().to_dict())
    directory = SessionDir.create(tmp_path / "session", info)
    directory.ensure_ray_token()
    return str(directory.path)


def _imported_on_the_way(tmp_path, extra: str = "") -> dict:
    out = subprocess.run([sys.executable, "-c", PROBE.format(extra=extra), _session(tmp_path)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def _forbidden(modules: list[str]) -> list[str]:
    return [m for m in modules if any(m == f or m.startswith(f + ".") for f in FORBIDDEN)]


def test_the_path_to_ray_start_imports_nothing_heavy(tmp_path):
    seen = _imported_on_the_way(tmp_path)
    assert seen["argv"][1:3] == ["start", "--head"], seen["argv"]   # the probe did reach the spawn
    assert _forbidden(seen["modules"]) == []


@pytest.mark.parametrize("module", ["importlib.metadata", "elastic_ray.coordinator.session"])
def test_the_check_sees_a_forbidden_import(tmp_path, module):
    seen = _imported_on_the_way(tmp_path, extra=f"import {module}")
    assert module in _forbidden(seen["modules"])
