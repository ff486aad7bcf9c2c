"""The launcher's per-node settings on the real path: a session on the local
scheduler whose launcher names the interpreter and a node_ip_address_command;
the head's agent runs under that interpreter and its Ray binds the address
the command printed (not the 127.0.0.x the local scheduler hands it)."""

from __future__ import annotations

import stat
import sys

import pytest

from elastic_ray import SlurmRunAllocationConfig
from elastic_ray.config.launcher import RayLauncher
from elastic_ray.coordinator.session import Session

from tests.helpers import wait_until

pytestmark = [pytest.mark.ray, pytest.mark.timeout(240)]


def test_the_head_agent_uses_the_launcher_interpreter_and_address(tmp_path, monkeypatch):
    monkeypatch.setenv("ELASTIC_AGENT_POLL_INTERVAL", "0.5")
    marker = tmp_path / "interpreter-used"
    wrapper = tmp_path / "bin" / "python"
    wrapper.parent.mkdir()
    # An interpreter of the site's choosing: here a wrapper that leaves a mark and runs ours.
    wrapper.write_text(f'#!/bin/sh\necho "$$" >> {marker}\nexec {sys.executable} "$@"\n')
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    launcher = RayLauncher(object_store_memory=100_000_000, python_executable=str(wrapper),
                           node_ip_address_command='echo "127.0.0.$((70 + SLURM_NODEID))"')
    session = Session.create(tmp_path / "s", scheduler="local", supervise=False, launcher=launcher,
                             head=SlurmRunAllocationConfig(partition="cpu", time_limit="30", mem="2G"))
    try:
        address = session.wait_for_head(timeout=120)
        assert address.startswith("127.0.0.70:"), address
        assert marker.read_text().split(), "the agent did not start through the launcher's interpreter"
        head = session.record().head_job
        log = (session.dir.log_dir / f"head-{head}.out").read_text()
        assert "(127.0.0.70) role head" in log
    finally:
        session.teardown()
        wait_until(lambda: all(i.state.is_final for i in session.query().values()), timeout=60,
                   message="session jobs did not end after teardown")
