"""What the SSH-mode tests share: a client target for the test sshd, and the venv's Python.

The client never reads the user's ``~/.ssh/config`` here (``config_file="/dev/null"``)
and checks the test server's host key strictly.
"""

from __future__ import annotations

import sys
from dataclasses import replace

from elastic_ray.remote import SshTarget

# The cluster side's interpreter: the same venv as the tests (one machine).
REMOTE_PYTHON = sys.executable


def target_of(server, **overrides) -> SshTarget:
    """An SshTarget for a started ``tests.sshd_server.SshServer``."""
    target = SshTarget(host=server.host, user=server.user, port=server.port, key_path=str(server.key_path),
                       config_file="/dev/null",
                       options=(f"UserKnownHostsFile={server.known_hosts}", "StrictHostKeyChecking=yes",
                                "IdentitiesOnly=yes"))
    return replace(target, **overrides)


def process_alive(pid: int | None) -> bool:
    """Whether ``pid`` runs (a zombie, or no PID at all, counts as gone)."""
    if not pid or pid < 0:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False
