"""The Debian packages the lab needs, installed with apt when they are missing."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import time

from .config import LabError, Settings
from .report import _since, log

PACKAGES = ("slurmctld", "slurmd", "slurm-client", "munge", "iproute2", "util-linux")


def missing_packages() -> list[str]:
    wanted = list(PACKAGES)
    if shutil.which("mount") is None:  # split out of util-linux; needed for the bind mounts
        wanted.append("mount")
    cp = subprocess.run(["dpkg-query", "-W", "-f=${Package} ${Status}\n", *wanted],
                        capture_output=True, text=True)
    installed = {line.split()[0] for line in cp.stdout.splitlines() if line.endswith(" installed")}
    return [p for p in wanted if p not in installed]


def ensure_packages(s: Settings) -> None:
    if shutil.which("dpkg-query") is None:
        raise LabError("this lab needs a Debian/Ubuntu machine (dpkg/apt)")
    missing = missing_packages()
    if not missing:
        return
    t0 = time.monotonic()
    log(f"installing {' '.join(missing)} ...")
    apt_log = s.log_dir / "apt.log"
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    with open(apt_log, "w") as out:
        for cmd in (["apt-get", "update"],
                    ["apt-get", "install", "-y", "--no-install-recommends", *missing]):
            out.write(f"$ {shlex.join(cmd)}\n")
            out.flush()
            if subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=out, env=env).returncode:
                raise LabError(f"{shlex.join(cmd)} failed", apt_log)
    log(f"packages installed in {_since(t0)}")
