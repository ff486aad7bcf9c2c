"""The one place that runs the system's OpenSSH client.

Why the system client and not a Python SSH library: it honours what users
already set up to reach their cluster (``~/.ssh/config``, ProxyJump, agents,
Kerberos, hardware keys). Why one multiplexed connection: every call of the
SSH mode is one remote command, and a fresh SSH handshake costs a few hundred
milliseconds (more through a jump host); with ``ControlMaster=auto`` the
first call opens a master connection and every later call opens only a new
channel on it. ``ControlPersist`` keeps the master a short while after the
last call so that a burst of calls reuses it, and :meth:`SshConnection.close`
ends it.

ssh itself exits 255 when it could not connect or authenticate; any other
code is the remote command's. Only the former becomes :class:`SshError`,
whose message names the host, the user, the command and ssh's own words.
"""

from __future__ import annotations

import logging
import os
import shlex
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

# Defined in errors (its docstring says why); ``X as X`` keeps it importable from here, for type checkers too.
from ..errors import SshError as SshError

log = logging.getLogger(__name__)

SSH_FAILED = 255  # ssh's own exit code for a connection or authentication failure
UNIX_PATH_MAX = 103  # bytes of a Unix socket path (sun_path less its NUL: 107 on Linux, 103 on macOS)
CONTROL_NAME_BYTES = 40 + 17  # %C (a SHA-1 in hex) plus the suffix ssh adds while binding


@dataclass(frozen=True)
class SshTarget:
    """Where and how to log in; None leaves the choice to ssh and ``~/.ssh/config``.

    ``options`` are extra ``-o NAME=VALUE`` settings; ``config_file`` is
    ssh's ``-F`` (``/dev/null`` ignores the user's config, as tests do).
    """

    host: str
    user: str | None = None
    port: int | None = None
    key_path: str | None = None
    options: tuple[str, ...] = ()
    config_file: str | None = None
    ssh_command: str = "ssh"
    connect_timeout: float = 15.0

    def __post_init__(self) -> None:
        if not isinstance(self.host, str) or not self.host or self.host.startswith("-") or any(
                c.isspace() for c in self.host):
            raise ValueError(f"ssh.host: {self.host!r} is not a host name")
        if self.user is not None and (not self.user or self.user.startswith("-") or "@" in self.user):
            raise ValueError(f"ssh.user: {self.user!r} is not a user name")
        if self.port is not None and not (isinstance(self.port, int) and 0 < self.port < 65536):
            raise ValueError(f"ssh.port: {self.port!r} must be a TCP port (1-65535)")
        for option in self.options:
            if not isinstance(option, str) or "=" not in option or option.startswith("-"):
                raise ValueError(f"ssh.options: {option!r} must look like NAME=VALUE")
        if self.key_path is not None and not Path(self.key_path).expanduser().is_file():
            raise ValueError(f"ssh.key_path: {self.key_path!r} is not a file")


def _short_temp_dir() -> Path:
    """A private folder for the control socket, short enough for a socket path
    (macOS's $TMPDIR alone is about 50 characters: /tmp is preferred)."""
    base = "/tmp" if os.path.isdir("/tmp") and os.access("/tmp", os.W_OK) else None
    return Path(tempfile.mkdtemp(prefix="er-ssh-", dir=base))


@dataclass
class SshConnection:
    """Runs remote commands over one multiplexed connection to ``target``."""

    target: SshTarget
    control_dir: Path = field(default_factory=lambda: _short_temp_dir())
    persist: int = 120

    def __post_init__(self) -> None:
        # ssh binds the master's socket at ControlPath plus a random suffix,
        # and a Unix socket path has at most 107 bytes.
        if len(str(self.control_dir)) + len("/") + CONTROL_NAME_BYTES > UNIX_PATH_MAX:
            raise ValueError(f"control_dir: {str(self.control_dir)!r} is too long for ssh's control socket "
                             f"(at most {UNIX_PATH_MAX - CONTROL_NAME_BYTES - 1} characters)")

    def _base(self) -> list[str]:
        t = self.target
        argv = [t.ssh_command]
        if t.config_file:
            argv += ["-F", t.config_file]
        if t.port:
            argv += ["-p", str(t.port)]
        if t.key_path:
            argv += ["-i", str(Path(t.key_path).expanduser())]
        if t.user:
            argv += ["-l", t.user]
        argv += ["-o", "BatchMode=yes", "-o", f"ConnectTimeout={int(max(1, t.connect_timeout))}",
                 "-o", "ServerAliveInterval=15", "-o", "ServerAliveCountMax=4",
                 "-o", "ControlMaster=auto", "-o", f"ControlPath={self.control_dir}/%C",
                 "-o", f"ControlPersist={self.persist}"]
        for option in t.options:
            argv += ["-o", option]
        return argv

    def argv(self, remote: Sequence[str]) -> list[str]:
        """The full local argv that runs ``remote`` (quoted for the remote shell)."""
        self.control_dir.mkdir(mode=0o700, exist_ok=True)   # again after close(): a connection is reusable
        return [*self._base(), "-T", "--", self.target.host, shlex.join(remote)]

    def popen(self, remote: Sequence[str], **kwargs) -> subprocess.Popen:
        """Start ``remote``; the caller owns the pipes (stdin/stdout/stderr in ``kwargs``).
        :class:`SshError` if there is no ssh program to start."""
        try:
            return subprocess.Popen(self.argv(remote), **kwargs)
        except FileNotFoundError as exc:
            raise SshError(self.target, remote, None, f"{self.target.ssh_command}: {exc.strerror}") from None

    def close(self) -> None:
        """End the master connection, if one is up (ssh -O exit), and its socket folder."""
        if not self.control_dir.exists():
            return
        if any(self.control_dir.iterdir()):
            subprocess.run([*self._base(), "-O", "exit", self.target.host], capture_output=True,
                           stdin=subprocess.DEVNULL, timeout=10)
        for p in self.control_dir.iterdir():
            try:
                p.unlink()
            except OSError:
                pass
        try:
            os.rmdir(self.control_dir)
        except OSError:
            pass
