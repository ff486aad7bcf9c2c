"""Two ordinary users on the lab, for tests that stand for user work (issue 25).

Created by the tests that need them (``ensure_users``), not by ``lab up``.

The lab's nodes share the host's /etc/passwd and filesystem (only /tmp, /var/tmp
and /dev/shm are per node), so a user created here exists on every node, and
its home is on the "shared filesystem" as on a real cluster. Created once with
fixed ids (``useradd``), kept by ``down``: their homes hold the virtualenvs the
tests build with the system Python, which take minutes to build again.
"""

from __future__ import annotations

import pwd
import subprocess

from .config import LabError
from .report import log

#: (name, uid): the users every lab has; uids far above Debian's first ordinary one (1000).
LAB_USERS = (("erlab-alice", 42101), ("erlab-bob", 42102))


def missing_users() -> list[tuple[str, int]]:
    out = []
    for name, uid in LAB_USERS:
        try:
            entry = pwd.getpwnam(name)
        except KeyError:
            out.append((name, uid))
            continue
        if entry.pw_uid != uid:
            raise LabError(f"user {name} exists with uid {entry.pw_uid}, not the lab's {uid}; remove it "
                           f"(userdel -r {name}) or free uid {uid}")
    return out


def ensure_users() -> list[str]:
    """Create the lab's users that are missing; return their names."""
    made = []
    for name, uid in missing_users():
        # HOME_MODE: a home others cannot read (Debian's default follows UMASK, 022 here).
        cmd = ["useradd", "--uid", str(uid), "--user-group", "--create-home", "-K", "HOME_MODE=0700",
               "--shell", "/bin/bash", name]
        cp = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=60)
        if cp.returncode != 0:
            raise LabError(f"{' '.join(cmd)} failed: {(cp.stderr or cp.stdout).strip()}")
        made.append(name)
    if made:
        log(f"created the lab's users {', '.join(made)}")
    return made
