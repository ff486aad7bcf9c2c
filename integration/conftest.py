"""pytest glue for the real multi-node Slurm lab (see labctl.py).

Tests that need Slurm take the session-scoped ``slurm_lab`` fixture and carry ``@pytest.mark.slurm``.
The fixture reuses a lab that is already up (so a developer can keep one running between test
runs) and only takes down a lab it started itself.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

_HERE = Path(__file__).resolve().parent
if str(_HERE) not in sys.path:
    sys.path.insert(0, str(_HERE))

import labctl  # noqa: E402

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
    try:
        yield SlurmLab(conf=info.conf, nodes=list(info.nodes), lab_dir=info.lab_dir,
                       private_tmp=info.private_tmp, shared=info.shared_dir)
    finally:
        if started:
            labctl.down()
