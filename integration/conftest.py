"""pytest glue for the real multi-node Slurm lab (see integration/labctl/).

Tests that need Slurm take the session-scoped ``slurm_lab`` fixture and carry ``@pytest.mark.slurm``.
The fixture reuses a lab that is already up (so a developer can keep one running between test
runs) and only takes down a lab it started itself.

The SSH mode's tests take a real OpenSSH server (tests/sshd_server.py): ``sshd`` is a plain one
on 127.0.0.1 (no Slurm, also re-exported to tests/), ``lab_sshd`` one whose remote commands see
the lab's SLURM_CONF, like a login node of the lab. Both are session-scoped and stopped by PID at
the end of the session, also when tests failed.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from integration import labctl
from tests.signal_guard import _signals_left_as_found  # noqa: F401 - an autouse fixture, here too
from tests.postmortem import pytest_runtest_makereport  # noqa: F401 - logs of a failed test's sessions
from tests.sshd_server import SshServer

LAB_NODES = 4  # the layout the tests are written for: cpu-1, cpu-2, gpua-1, gpub-1


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "slurm: needs the real multi-node Slurm lab (integration/lab, root only)"
    )


@dataclass(frozen=True)
class SlurmLab:
    conf: Path
    nodes: list[labctl.Node]
    lab_dir: Path
    private_tmp: bool
    shared: Path  # same path on the host and every node; wiped by the lab's up/down

    def node(self, name: str) -> labctl.Node:
        return next(n for n in self.nodes if n.name == name)

    @property
    def partitions(self) -> set[str]:
        return {n.partition for n in self.nodes}

    def shared_dir(self, name: str) -> Path:
        """A directory that the host and every node see at the same path (unlike /tmp)."""
        d = self.shared / name
        d.mkdir(parents=True, exist_ok=True)
        return d


def _log_tail(path: Path | None, lines: int = 40) -> str:
    if not path:
        return ""
    try:
        tail = path.read_text(errors="replace").splitlines()[-lines:]
    except OSError as e:
        return f"\n(could not read {path}: {e})"
    return f"\n--- last {len(tail)} lines of {path} ---\n" + "\n".join(tail)


def _unavailable(reason: str) -> None:
    # In CI a missing lab is a broken build, not a reason to silently skip half the suite.
    if os.environ.get("CI") == "true":
        pytest.fail(f"Slurm lab unavailable: {reason}", pytrace=False)
    print(f"\nskipping Slurm lab tests: {reason}", file=sys.stderr)
    pytest.skip(f"Slurm lab unavailable: {reason}")


@pytest.fixture(scope="session")
def slurm_lab():
    started = False
    try:
        if labctl.is_up():
            running = labctl.nodes()
            if len(running) < LAB_NODES:
                _unavailable(
                    f"a lab with only {len(running)} nodes is running; the tests need "
                    f"{LAB_NODES} (run `integration/lab up {LAB_NODES}`)"
                )
            # Same layout as running -> this only repairs dead daemons and keeps jobs.
            info = labctl.up(len(running))
        else:
            info = labctl.up(LAB_NODES)
            started = True
    except labctl.LabError as e:
        _unavailable(f"{e}{_log_tail(e.log_file)}")
    except OSError as e:  # e.g. a tool missing in an unusual environment
        _unavailable(f"{type(e).__name__}: {e}")

    os.environ["SLURM_CONF"] = str(info.conf)
    if info.bin_dir is not None:   # Slurm 24.11 (ELASTIC_RAY_LAB_SLURM): its clients first on PATH
        os.environ["PATH"] = f"{info.bin_dir}:{os.environ.get('PATH', '')}"
    try:
        yield SlurmLab(conf=info.conf, nodes=list(info.nodes), lab_dir=info.lab_dir,
                       private_tmp=info.private_tmp, shared=info.shared_dir)
    finally:
        if started:
            labctl.down()


@pytest.fixture(scope="session")
def sshd(tmp_path_factory):
    """A started SshServer on 127.0.0.1 with its own keys and known_hosts; no Slurm, no Ray."""
    with SshServer(tmp_path_factory.mktemp("sshd")) as server:
        yield server


@pytest.fixture(scope="session")
def lab_sshd(slurm_lab, tmp_path_factory):
    """A started SshServer whose remote commands get SLURM_CONF of the lab (sshd_config SetEnv).

    It runs in the host network namespace on 127.0.0.1, like the test process and slurmctld's
    clients there, so ``sbatch``/``squeue`` run over it reach the lab's controller.
    """
    env = {"SLURM_CONF": str(slurm_lab.conf)}
    if labctl.settings_from_env().swaps_usr:
        env["PATH"] = os.environ["PATH"]   # the 24.11 clients' bin/ first, as in this process
    with SshServer(tmp_path_factory.mktemp("lab-sshd"), env=env) as server:
        yield server
