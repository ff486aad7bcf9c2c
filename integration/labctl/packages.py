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

from .config import REPO, LabError, Settings
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


BUILD_ROOT = REPO / "integration" / "labctl" / "slurm2411" / "build-root.sh"
ROOT_STAMP = ".elastic-ray-root"  # written last by ensure_root: a root without it is half-built
ROOT_BUILDING = ".elastic-ray-root-building"  # next to the root, written first: only such a root is removed


def root_ready(s: Settings) -> bool:
    return (s.slurm_root / ROOT_STAMP).is_file() and (s.slurm_root / "usr" / "sbin" / "slurmctld").exists()


def ensure_root(s: Settings) -> None:
    """The Debian 13 root with Slurm 24.11 (built once, about 95 s and 240 MB; kept across
    labs and clones). A half-built one (no stamp) is removed and built again."""
    if not s.swaps_usr or root_ready(s):
        return
    if shutil.which("debootstrap") is None:
        log("installing debootstrap (for the Slurm 24.11 root) ...")
        apt_log = s.log_dir / "apt.log"
        with open(apt_log, "a") as out:
            cmd = ["apt-get", "install", "-y", "--no-install-recommends", "debootstrap"]
            env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
            if subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=out, env=env).returncode:
                raise LabError(f"{shlex.join(cmd)} failed", apt_log)
    marker = s.slurm_root.parent / f"{s.slurm_root.name}{ROOT_BUILDING}"
    if s.slurm_root.exists():
        if not marker.exists() and any(s.slurm_root.iterdir()):
            raise LabError(f"{s.slurm_root} is not empty and holds no Slurm 24.11 root of the lab's "
                           f"(no {ROOT_STAMP}); set ELASTIC_RAY_LAB_SLURM_ROOT to a new directory")
        log(f"removing the half-built root {s.slurm_root}")
        shutil.rmtree(s.slurm_root)
    s.slurm_root.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text("a Slurm 24.11 root is being built next to this file (integration/labctl)\n")
    build_log = s.log_dir / "root-build.log"
    t0 = time.monotonic()
    log(f"building the Debian 13 root with Slurm 24.11 in {s.slurm_root} (once; about 2 minutes) ...")
    with open(build_log, "w") as out:
        rc = subprocess.run(["bash", str(BUILD_ROOT)], stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                            env=dict(os.environ, ROOT=str(s.slurm_root))).returncode
    if rc != 0 or not (s.slurm_root / "usr" / "sbin" / "slurmctld").exists():
        raise LabError(f"building the Slurm 24.11 root failed (rc={rc})", build_log)
    versions = subprocess.run(["chroot", str(s.slurm_root), "dpkg-query", "-W", "slurmctld", "slurmd", "munge"],
                              capture_output=True, text=True).stdout
    (s.slurm_root / ROOT_STAMP).write_text(versions)
    marker.unlink(missing_ok=True)
    log(f"root built in {_since(t0)}: {' '.join(versions.split())}")
