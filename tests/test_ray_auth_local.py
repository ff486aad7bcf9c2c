"""Ray token auth and memory sizing for real: agents and `ray start` on the local scheduler.

* A Ray client without the session's token is refused by the head and by a
  hosted head (the default layout's first allocation hosts it); the same
  client with ``Session.ray_client_env()`` connects, and drivers started by
  ``Session.run`` connect and run work.
* Neither the token nor ``redis_password`` appears on any process's command
  line (nor the token in any environment): every process on the host is
  scanned while the run's Ray nodes are up.
* Each Ray node reports the memory and object store its Slurm grant allows
  (the local scheduler exports ``SLURM_MEM_PER_NODE`` as Slurm does), split
  between a hosted head and its node's worker.
* ``auth_mode="disabled"`` still works, with a warning.
"""

from __future__ import annotations

import json
import logging
import os
import re
import secrets
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from elastic_ray import SlurmRunAllocationConfig, SlurmWorkerAllocationConfig
from elastic_ray.agent.node.ray_memory import plan_memory
from elastic_ray.config.launcher import RayLauncher
from elastic_ray.coordinator.session import Session
from elastic_ray.protocol.disk.records import AgentState
from elastic_ray.ray_auth import derive_ray_token
from tests.helpers import wait_until

pytestmark = [pytest.mark.ray, pytest.mark.timeout(300)]

CONNECT = """
import json, sys, ray
ray.init(address=sys.argv[1] if len(sys.argv) > 1 else None, logging_level="ERROR", log_to_driver=False)
@ray.remote(num_cpus=1)
def answer():
    return 42
nodes = [n["Resources"] for n in ray.nodes() if n["Alive"]]
print(json.dumps({"answer": ray.get(answer.remote(), timeout=60), "nodes": nodes}))
"""
MiB = 1024 * 1024


def _clean_env(home: Path, **extra: str) -> dict[str, str]:
    """This process's environment without any Ray setting, and a $HOME without ~/.ray/auth_token."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(HOME=str(home), RAY_USAGE_STATS_ENABLED="0", **extra)
    return env


def assert_refused(address: str, *envs: dict[str, str]) -> None:
    """Each client environment is refused. The attempts run at once: a
    refused client waits for its connection to give up, and they do not
    depend on each other."""
    # A refused client tries the GCS again once a second, 20 times by default (Ray's
    # RAY_NUM_REDIS_GET_RETRIES): three tries show the refusal as well, 17 s sooner.
    procs = [subprocess.Popen([sys.executable, "-c", CONNECT, address], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env={**env, "RAY_NUM_REDIS_GET_RETRIES": "3"},
                              stdin=subprocess.DEVNULL) for env in envs]
    try:
        for proc in procs:
            stdout, stderr = proc.communicate(timeout=150)
            text = stdout + stderr
            assert proc.returncode != 0, f"a client without the token got in: {stdout[-500:]}"
            assert "answer" not in stdout
            # Refused for lack of the token, not because nothing answered.
            assert re.search(r"auth|token", text, re.IGNORECASE), text[-3000:]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def connect(address: str, env: dict[str, str]) -> dict:
    out = subprocess.run([sys.executable, "-c", CONNECT, address], capture_output=True, text=True, timeout=150,
                         env=env, stdin=subprocess.DEVNULL)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def run_driver(session: Session, tmp_path: Path, name: str) -> dict:
    """A driver started by Session.run, the way payloads are (RAY_ADDRESS set by run)."""
    out = tmp_path / f"{name}.json"
    with out.open("w") as handle, (tmp_path / f"{name}.err").open("w") as err:
        session.run([sys.executable, "-c", CONNECT], stdout=handle, stderr=err).wait(timeout=150)
    return json.loads(out.read_text().strip().splitlines()[-1])


def expected(mem_mb: int, share: str) -> tuple[int, int]:
    """(memory, object_store) a node of a ``mem_mb`` grant gets; /dev/shm here holds far more."""
    plan = plan_memory({"SLURM_MEM_PER_NODE": str(mem_mb)}, cgroup_limit=None, shm_free=None,
                       launcher_object_store=None, user_args=(), share=share)
    return plan.memory, plan.object_store


def reported(resources: dict) -> tuple[int, int]:
    return round(resources["memory"]), round(resources["object_store_memory"])


def scan_processes(secrets_: dict[str, str], token_path: str) -> dict[str, int]:
    """Every process on the host: no secret in any argv, the token in no environment.

    Returns how many processes carry our token file's path (the Ray processes
    that got the token), so the scan is known to have seen them.
    """
    leaks, carriers = [], 0
    for proc in psutil.process_iter(["pid", "cmdline"]):
        try:
            argv = " ".join(proc.info["cmdline"] or ())
            environ = proc.environ()
        except (psutil.Error, OSError):
            continue
        for what, value in secrets_.items():
            if value in argv:
                leaks.append(f"{what} in argv of {proc.info['pid']}: {argv[:200]}")
        if any(secrets_["token"] in v for v in environ.values()):
            leaks.append(f"token in the environment of {proc.info['pid']}: {argv[:200]}")
        if environ.get("RAY_AUTH_TOKEN_PATH") == token_path and environ.get("RAY_AUTH_MODE") == "token":
            carriers += 1
    assert not leaks, "\n".join(leaks)
    return {"carriers": carriers}


def _end(session: Session) -> None:
    session.teardown()
    wait_until(lambda: all(i.state.is_final for i in session.query().values()), timeout=60,
               message="session jobs did not end after teardown")


@pytest.fixture
def local_env(monkeypatch):
    monkeypatch.setenv("ELASTIC_AGENT_BACKOFF_BASE", "1")
    monkeypatch.setenv("ELASTIC_AGENT_POLL_INTERVAL", "0.5")


def test_head_refuses_clients_without_the_token_and_no_secret_is_on_a_command_line(tmp_path, local_env):
    password = "redis-pw-" + secrets.token_hex(8)
    session = Session.create(tmp_path / "s", scheduler="local", supervise=False,
                             head=SlurmRunAllocationConfig(partition="cpu", time_limit="30", mem="2G"),
                             launcher=RayLauncher(redis_password=password))
    try:
        assert session.launcher.auth_mode == "token"
        address = session.wait_for_head(timeout=120)
        worker = session.add_worker_allocation(SlurmWorkerAllocationConfig(
            partition="cpu", num_nodes=1, cpus_per_task=1, mem="1G", time_limit="30", gpus_per_node=0))
        session.wait_for_worker_allocation(worker, timeout=120)
        token = derive_ray_token(session.dir.secret())
        token_path = str(session.dir.ray_token_file)

        # While every Ray process and agent of the run is up: no secret on any command line.
        seen = scan_processes({"token": token, "redis_password": password}, token_path)
        assert seen["carriers"] >= 4, seen       # at least gcs_server and a raylet on each node

        home = tmp_path / "home"
        home.mkdir()
        wrong = home / "wrong_token"
        wrong.write_text("0" * 64)
        assert_refused(address,
                       _clean_env(home),                                          # RAY_AUTH_MODE unset
                       _clean_env(home, RAY_AUTH_MODE="disabled"),
                       _clean_env(home, RAY_AUTH_MODE="token"),                   # no token anywhere
                       _clean_env(home, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(wrong)))

        # The same client with the session's settings gets in and runs a task.
        direct = connect(address, _clean_env(home, **session.ray_client_env()))
        assert direct["answer"] == 42
        # ...and so does a driver started by Session.run.
        assert run_driver(session, tmp_path, "driver")["answer"] == 42

        # Memory: the head's allocation (2G, its only Ray node) and the worker
        # allocation's first node (1G, keeping a hosted head's share free).
        head = next(r for r in direct["nodes"] if not r.get("CPU"))
        node = next(r for r in direct["nodes"] if r.get("CPU"))
        assert reported(head) == expected(2048, "whole"), head
        assert reported(node) == expected(1024, "worker_beside_head"), node
        assert sum(reported(node)) == 768 * MiB and sum(reported(head)) == 2048 * MiB

        log = "".join(p.read_text() for p in session.dir.log_dir.glob("agent-*.log"))
        assert "event=redis_password_ignored" in log and password not in log
        assert "event=ray_memory" in log
    finally:
        _end(session)


def test_hosted_head_refuses_clients_without_the_token(tmp_path, local_env):
    """The default layout: the run's first allocation hosts the head next to its worker."""
    run = SlurmRunAllocationConfig(partition="gpu-a", num_nodes=1, cpus_per_task=2, gpus_per_node=2, mem="2G",
                                   time_limit="30")
    session = Session.create(tmp_path / "s", head=run, scheduler="local", ray_head_only=False, supervise=False)
    try:
        address = session.wait_for_head(timeout=120)
        first = session.record().head_job
        assert session.record().workers[first].hosts_run_head
        wait_until(lambda: any(s.state is AgentState.JOINED and s.head_job == first
                               for s in session.node_states(first).values()),
                   timeout=90, message="the first allocation's worker did not join its own head")
        home = tmp_path / "home"
        home.mkdir()
        assert_refused(address, _clean_env(home), _clean_env(home, RAY_AUTH_MODE="token"),
                       _clean_env(home, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN="f" * 64))
        seen = run_driver(session, tmp_path, "driver")
        assert seen["answer"] == 42
        # One grant, two Ray nodes: the hosted head's quarter and the worker's rest.
        head = next(r for r in seen["nodes"] if not r.get("CPU"))
        node = next(r for r in seen["nodes"] if r.get("CPU"))
        assert reported(head) == expected(2048, "hosted_head"), head
        assert reported(node) == expected(2048, "worker_beside_head"), node
        assert sum(reported(head)) + sum(reported(node)) == 2048 * MiB
    finally:
        _end(session)


def test_auth_disabled_still_works_and_warns(tmp_path, local_env, caplog):
    caplog.set_level(logging.WARNING, logger="elastic_ray.coordinator")
    session = Session.create(tmp_path / "s", scheduler="local", supervise=False,
                             head=SlurmRunAllocationConfig(partition="cpu", time_limit="30", mem="2G"),
                             launcher=RayLauncher(auth_mode="disabled"))
    try:
        assert "event=ray_auth_disabled" in caplog.text
        address = session.wait_for_head(timeout=120)
        worker = session.add_worker_allocation(SlurmWorkerAllocationConfig(
            partition="cpu", num_nodes=1, cpus_per_task=1, mem="1G", time_limit="30", gpus_per_node=0))
        session.wait_for_worker_allocation(worker, timeout=120)
        assert run_driver(session, tmp_path, "driver")["answer"] == 42
        home = tmp_path / "home"
        home.mkdir()
        assert connect(address, _clean_env(home, RAY_AUTH_MODE="disabled"))["answer"] == 42
        log = "".join(p.read_text() for p in session.dir.log_dir.glob("agent-*.log"))
        assert log.count("event=ray_auth_disabled") >= 2        # the head's agent and the worker's
    finally:
        _end(session)
