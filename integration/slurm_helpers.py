"""Small helpers shared by the lab tests.

``squeue_ids`` asks the real Slurm what it still lists under a job name, the
independent check that a session's teardown left nothing behind;
``end_session`` tears a session down and waits until Slurm lists none of its
jobs, so every lab test ends what it started even when it failed.
"""

from __future__ import annotations

import subprocess

from elastic_ray.coordinator.session import Session
from tests.helpers import wait_until


def squeue_ids(job_name: str) -> list[str]:
    """Job ids Slurm still lists under ``job_name`` (any state)."""
    out = subprocess.run(["squeue", "-h", f"--name={job_name}", "-o", "%i"], check=False, capture_output=True,
                         text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


def end_session(session: Session, timeout: float = 90, label: str | None = None) -> None:
    """Cancel every job of ``session`` and wait until Slurm lists none of them."""
    session.teardown()
    name = session.job_name
    wait_until(lambda: not squeue_ids(name), timeout=timeout,
               message=f"jobs of {label or name} still listed after teardown")
