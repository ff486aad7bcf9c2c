"""The Debian packages the lab needs, installed with apt when they are missing.

mariadb-server and slurmdbd are the lab's accounting (its own mariadbd and slurmdbd, started by
daemons.py).  Their package scripts would start the system's MariaDB and slurmdbd services: the
install runs under a policy-rc.d that answers 101 ("action forbidden"), so that no daemon is left
running that the lab did not start by PID.  A policy-rc.d already on the machine is used as it is;
one written here is removed again after the install.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import time
from pathlib import Path

from .config import LabError, Settings
from .report import _since, log

PACKAGES = ("slurmctld", "slurmd", "slurm-client", "munge", "iproute2", "util-linux")
ACCOUNTING_PACKAGES = ("slurmdbd", "mariadb-server")  # not needed with ELASTIC_RAY_LAB_ACCOUNTING=0
POLICY_RC = Path("/usr/sbin/policy-rc.d")
POLICY_TEXT = ("#!/bin/sh\n# temporary, from elastic-ray's Slurm lab (integration/labctl/packages.py): "
               "start no services\nexit 101\n")


def missing_packages(accounting: bool = True) -> list[str]:
    wanted = [*PACKAGES, *(ACCOUNTING_PACKAGES if accounting else ())]
    if shutil.which("mount") is None:  # split out of util-linux; needed for the bind mounts
        wanted.append("mount")
    cp = subprocess.run(["dpkg-query", "-W", "-f=${Package} ${Status}\n", *wanted],
                        capture_output=True, text=True)
    installed = {line.split()[0] for line in cp.stdout.splitlines() if line.endswith(" installed")}
    return [p for p in wanted if p not in installed]


def _no_services(policy: Path = POLICY_RC) -> bool:
    """Put a policy-rc.d in place that forbids starting services; True if we wrote it (so we remove it)."""
    if policy.exists():
        return False
    policy.write_text(POLICY_TEXT)
    os.chmod(policy, 0o755)
    return True


def ensure_packages(s: Settings) -> None:
    if shutil.which("dpkg-query") is None:
        raise LabError("this lab needs a Debian/Ubuntu machine (dpkg/apt)")
    missing = missing_packages(s.accounting)
    if not missing:
        return
    t0 = time.monotonic()
    log(f"installing {' '.join(missing)} (no system service is started) ...")
    apt_log = s.log_dir / "apt.log"
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    made_policy = _no_services()
    try:
        with open(apt_log, "w") as out:
            for cmd in (["apt-get", "update"],
                        ["apt-get", "install", "-y", "--no-install-recommends", *missing]):
                out.write(f"$ {shlex.join(cmd)}\n")
                out.flush()
                if subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=out, env=env).returncode:
                    raise LabError(f"{shlex.join(cmd)} failed", apt_log)
    finally:
        if made_policy:
            POLICY_RC.unlink(missing_ok=True)
    log(f"packages installed in {_since(t0)}")
