"""Acting as one of the lab's ordinary users (issue 25): their own copy of the
project, their own virtualenv built with the system Python, commands run with
their uid and nothing of root's environment.

As ``docs/real-cluster.md`` tells a user: ``python3 -m venv`` with the
system's ``/usr/bin/python3`` (not root's pyenv) in the user's home (the
lab's shared filesystem), then ``pip install "<their clone>[dagster]"`` (their
clone: a copy of this tree's files that the user makes). The
dependencies take minutes to install, so a venv is kept per dependency set
(a hash of ``pyproject.toml`` and ``scripts/constraints.txt``) and only the
project itself is installed again, from a fresh copy of this tree, once per
test session.
"""

from __future__ import annotations

import hashlib
import os
import pwd
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from integration.labctl.users import LAB_USERS

REPO = Path(__file__).resolve().parents[1]
SYSTEM_PYTHON = "/usr/bin/python3"
ALICE, BOB = (name for name, _ in LAB_USERS)


@dataclass(frozen=True)
class LabUser:
    name: str
    uid: int
    gid: int
    home: Path
    python: Path  # the user's venv's interpreter

    def env(self, **extra: str) -> dict[str, str]:
        """A login-like environment: nothing of root's but the lab's SLURM_CONF (and PATH for 24.11)."""
        path = os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin")
        # Keep the lab's Slurm clients and the system's; drop root's venv (this interpreter's) and pyenv.
        keep = [p for p in path.split(":") if p and not p.startswith(("/root", sys.prefix, sys.base_prefix))]
        env = {"HOME": str(self.home), "USER": self.name, "LOGNAME": self.name, "SHELL": "/bin/bash",
               "LANG": "C.UTF-8", "PATH": ":".join([str(self.python.parent), *keep]),
               "SLURM_CONF": os.environ["SLURM_CONF"]}
        # The machine's package index settings (pip's PIP_* knobs, a proxy) are the site's, not root's.
        env.update({k: v for k, v in os.environ.items()
                    if k.startswith("PIP_") or k.lower() in ("http_proxy", "https_proxy", "no_proxy")})
        env.update(extra)
        return env

    def argv(self, argv: list[str], extra_env: dict[str, str] | None = None) -> list[str]:
        """``argv`` run as this user (``setpriv``: its uid, gid and groups; a clean environment)."""
        return ["setpriv", f"--reuid={self.uid}", f"--regid={self.gid}", "--init-groups", "--",
                "env", "-i", *(f"{k}={v}" for k, v in self.env(**(extra_env or {})).items()), *argv]

    def run(self, argv: list[str], *, timeout: float = 600, check: bool = True, cwd: Path | None = None,
            extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        cp = subprocess.run(self.argv(argv, extra_env), capture_output=True, text=True, timeout=timeout,
                            cwd=cwd or self.home, stdin=subprocess.DEVNULL)
        if check and cp.returncode != 0:
            raise AssertionError(f"as {self.name}: {' '.join(argv)} exited {cp.returncode}\n"
                                 f"--- stdout\n{cp.stdout[-4000:]}\n--- stderr\n{cp.stderr[-4000:]}")
        return cp

    def popen(self, argv: list[str], *, cwd: Path | None = None, extra_env: dict[str, str] | None = None,
              stderr: Any = subprocess.PIPE) -> subprocess.Popen:
        return subprocess.Popen(self.argv(argv, extra_env), stdout=subprocess.PIPE, stderr=stderr, text=True,
                                cwd=cwd or self.home, stdin=subprocess.DEVNULL)

    def python_code(self, code: str, *args: str, timeout: float = 600, check: bool = True,
                    extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        return self.run([str(self.python), "-c", code, *args], timeout=timeout, check=check, extra_env=extra_env)


def deps_key() -> str:
    h = hashlib.sha256()
    for name in ("pyproject.toml", "scripts/constraints.txt"):
        h.update((REPO / name).read_bytes())
    h.update(os.path.realpath(SYSTEM_PYTHON).encode())
    return h.hexdigest()[:12]


def stage_source(stage: Path) -> Path:
    """This tree's files (tracked and new, not ignored: what a clone of it would hold) in
    ``stage/src``, root's and readable by all, for a user to copy."""
    listed = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            capture_output=True, check=True, timeout=60).stdout.decode().split("\0")
    src = stage / "src"
    for rel in filter(None, listed):
        path = REPO / rel
        if not path.is_file():
            continue   # deleted in the working tree
        dest = src / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, dest)
    for root, dirs, files in os.walk(stage):
        os.chmod(root, 0o755)
        for name in files:
            os.chmod(os.path.join(root, name), 0o644 | (os.stat(os.path.join(root, name)).st_mode & 0o111))
    return src


def lab_user(name: str, stage: Path) -> LabUser:
    """The lab user ``name`` with a venv that has this tree installed (built or refreshed as the
    user, from their own copy of the tree, which they make from ``stage``: root never writes in a
    user's home)."""
    entry = pwd.getpwnam(name)
    home = Path(entry.pw_dir)
    venv = home / "venvs" / f"elastic-ray-{deps_key()}"
    user = LabUser(name, entry.pw_uid, entry.pw_gid, home, venv / "bin" / "python")
    staged = stage / "src" if (stage / "src").is_dir() else stage_source(stage)
    src = home / "src" / "elastic-ray"
    user.run(["rm", "-rf", str(src)])
    user.run(["mkdir", "-p", str(src.parent), str(venv.parent)])
    user.run(["cp", "-r", str(staged), str(src)])
    constraints = src / "scripts" / "constraints.txt"
    if not user.python.exists():
        user.run([SYSTEM_PYTHON, "-m", "venv", str(venv)])
        user.run([str(user.python), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                  "-c", str(constraints), f"{src}[dagster]"], timeout=1800)
    else:
        # The dependencies are there: only this tree's code, as a user updating their clone would.
        user.run([str(user.python), "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps",
                  "--force-reinstall", str(src)], timeout=600)
    return user
