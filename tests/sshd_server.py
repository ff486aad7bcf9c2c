"""A real OpenSSH server for tests of the SSH mode, started and stopped by the tests.

The SSH mode drives sessions only through the system ``ssh`` client, so its tests
need a genuine ``sshd`` rather than a fake: key authentication, host key
checking, connection sharing (ControlMaster) and the environment a remote
command sees are all behaviours of OpenSSH itself. :class:`SshServer` runs
Debian's ``/usr/sbin/sshd`` with a configuration, keys and ``known_hosts`` of its
own in one directory, on a loopback address, as a child process of the test
process; it never touches ``/etc/ssh`` or a system sshd on port 22.

:func:`ensure_openssh_server` installs ``openssh-server`` on a fresh Debian
machine (CI) without letting the package start the system service.

Standard library only, no pytest: ``integration/conftest.py`` builds the
``sshd`` and ``lab_sshd`` fixtures on it.
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

SSHD = Path("/usr/sbin/sshd")
POLICY_RC_D = Path("/usr/sbin/policy-rc.d")
PRIVSEP_DIR = Path("/run/sshd")  # sshd refuses to start without it
READY_TIMEOUT = 10.0  # s for a fresh sshd to accept a real login
STOP_GRACE = 5.0  # s between SIGTERM and SIGKILL in stop()
PORT_ATTEMPTS = 3  # a picked free port can be taken before sshd binds it
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


class SshServerError(RuntimeError):
    """sshd could not be installed, configured or started; the message carries its output."""


# --------------------------------------------------------------------------- installation


def _tail(text: str, lines: int = 30) -> str:
    return "\n".join(text.splitlines()[-lines:])


def _apt_install(packages: list[str], log: Path) -> None:
    """apt-get install, with ``apt-get update`` first only when the plain install fails.

    A policy-rc.d that exits 101 tells the package scripts not to start services, so
    installing openssh-server never brings up a system sshd on port 22. One already
    present is left as it is; one we create is removed again afterwards.
    """
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    install = ["apt-get", "install", "-y", "-q", "--no-install-recommends", *packages]
    created_policy = False
    if not POLICY_RC_D.exists():
        POLICY_RC_D.write_text("#!/bin/sh\n# temporary, from elastic-ray tests: start no services\nexit 101\n")
        POLICY_RC_D.chmod(0o755)
        created_policy = True
    try:
        with open(log, "w") as out:
            def run(cmd: list[str]) -> int:
                out.write(f"$ {' '.join(cmd)}\n")
                out.flush()
                return subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                      env=env).returncode

            ok = run(install) == 0 or (run(["apt-get", "update", "-q"]) == 0 and run(install) == 0)
    finally:
        if created_policy:
            POLICY_RC_D.unlink(missing_ok=True)
    if not ok:
        raise SshServerError(f"installing {' '.join(packages)} failed; last lines of {log}:\n"
                             f"{_tail(log.read_text(errors='replace'))}")


def ensure_openssh_server() -> str:
    """Return the path of sshd, installing openssh-server (and the client) if missing."""
    missing = []
    if not SSHD.exists():
        missing.append("openssh-server")
    if shutil.which("ssh") is None or shutil.which("ssh-keygen") is None:
        missing.append("openssh-client")
    if missing:
        if shutil.which("apt-get") is None:
            raise SshServerError(f"{' '.join(missing)} missing and this is no Debian machine (no apt-get)")
        if os.geteuid() != 0:
            raise SshServerError(f"{' '.join(missing)} missing; installing needs root")
        fd, name = tempfile.mkstemp(prefix="openssh-apt-", suffix=".log")
        os.close(fd)
        _apt_install(missing, Path(name))
        if not SSHD.exists() or shutil.which("ssh") is None or shutil.which("ssh-keygen") is None:
            raise SshServerError(f"installed {' '.join(missing)} but sshd/ssh/ssh-keygen are still "
                                 f"missing; see {name}")
    return str(SSHD)


# --------------------------------------------------------------------------- config


def _config_word(value: str, field: str) -> str:
    """Quote one sshd_config argument; backslash and double quote are escaped."""
    if "\n" in value or "\r" in value or "\0" in value:
        raise ValueError(f"{field}: {value!r} contains a line break or NUL, impossible in sshd_config")
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def render_sshd_config(*, address: str, port: int, host_key: Path, pid_file: Path,
                       authorized_keys: Path, env: dict[str, str]) -> str:
    """The sshd_config text; pure, so the choices can be read and tested in one place."""
    lines = [
        f"ListenAddress {_config_word(f'{_bracket(address)}:{port}', 'address')}",
        f"HostKey {_config_word(str(host_key), 'host_key')}",
        f"PidFile {_config_word(str(pid_file), 'pid_file')}",
        f"AuthorizedKeysFile {_config_word(str(authorized_keys), 'authorized_keys')}",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "PubkeyAuthentication yes",
        "PermitRootLogin prohibit-password",
        "UsePAM no",
        "StrictModes no",  # test dirs under /tmp are not the owner-only dirs StrictModes wants
        "MaxSessions 64",  # one ControlMaster carries many sessions in the SSH mode
        "MaxStartups 64:30:128",
        "PrintMotd no",
        "LogLevel VERBOSE",
        "Subsystem sftp internal-sftp",
    ]
    words = []
    for name, value in env.items():
        if not _ENV_NAME.match(name):
            raise ValueError(f"env: {name!r} is not a valid environment variable name")
        words.append(_config_word(f"{name}={value}", f"env[{name!r}]"))
    if words:
        # Only the first SetEnv line counts in sshd_config, so all variables go on one.
        lines.append("SetEnv " + " ".join(words))
    return "\n".join(lines) + "\n"


def _bracket(address: str) -> str:
    return f"[{address}]" if ":" in address else address


def known_hosts_line(address: str, port: int, host_pubkey: str) -> str:
    """known_hosts entry: ssh looks a non-22 port up as ``[host]:port``."""
    key_type, key_b64 = host_pubkey.split()[:2]
    name = address if port == 22 else f"[{address}]:{port}"
    return f"{name} {key_type} {key_b64}\n"


def free_port(address: str) -> int:
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind((address, 0))
        return s.getsockname()[1]


def _socket_inodes(port: int) -> set[str]:
    """Inodes of the TCP sockets (v4 and v6) whose local port is ``port``, from /proc/net."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if len(fields) > 9 and int(fields[1].rsplit(":", 1)[1], 16) == port and fields[9] != "0":
                inodes.add(fields[9])
    return inodes


def connection_pids(port: int) -> list[int]:
    """sshd processes holding a socket on our port: the connections our sshd accepted.

    Found by socket, not by parent: once the listener is gone they are orphans, and a
    connection accepted just before the listener saw SIGTERM was never in a snapshot
    of its children.
    """
    targets = {f"socket:[{inode}]" for inode in _socket_inodes(port)}
    pids = []
    for entry in os.listdir("/proc") if targets else ():
        if not entry.isdigit():
            continue
        try:
            if Path(f"/proc/{entry}/comm").read_text().strip() != "sshd":
                continue
            fds = os.listdir(f"/proc/{entry}/fd")
            if any(os.readlink(f"/proc/{entry}/fd/{fd}") in targets for fd in fds):
                pids.append(int(entry))
        except OSError:  # gone meanwhile, or a fd closed while we looked
            continue
    return pids


# --------------------------------------------------------------------------- server


class SshServer:
    """One sshd on a loopback address with its own keys, config and known_hosts in base_dir.

    ``env`` becomes ``SetEnv`` in sshd_config: every remote command sees those variables
    (the lab passes SLURM_CONF this way, as a cluster's login node would have it set).
    """

    def __init__(self, base_dir: Path, address: str = "127.0.0.1", port: int | None = None,
                 env: dict[str, str] | None = None) -> None:
        self.base_dir = Path(base_dir).resolve()
        self.host = address
        self._fixed_port = port
        self.port = port if port is not None else 0
        self.env = dict(env or {})
        self.user = pwd.getpwuid(os.geteuid()).pw_name
        self.host_key = self.base_dir / "ssh_host_ed25519_key"
        self.key_path = self.base_dir / "id_ed25519"
        self.authorized_keys = self.base_dir / "authorized_keys"
        self.known_hosts = self.base_dir / "known_hosts"
        self.config_path = self.base_dir / "sshd_config"
        self.pid_file = self.base_dir / "sshd.pid"
        self.log_path = self.base_dir / "sshd.log"
        self._proc: subprocess.Popen | None = None
        self._ssh = shutil.which("ssh") or "ssh"

    # -- client side

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def ssh_options(self) -> list[str]:
        """``-o`` options a client needs: only our key, our known_hosts, never a prompt."""
        return ["-o", f"UserKnownHostsFile={self.known_hosts}",
                "-o", "StrictHostKeyChecking=yes",
                "-o", "IdentitiesOnly=yes",
                "-o", "BatchMode=yes"]

    def ssh_argv(self, *remote: str, extra_options: list[str] | tuple[str, ...] = ()) -> list[str]:
        """Full ssh argv; ``-F /dev/null`` keeps the user's ~/.ssh/config out of tests.

        ``extra_options`` go before the destination (e.g. ControlMaster options, ``-O check``).
        """
        return [self._ssh, "-F", "/dev/null", "-p", str(self.port), "-i", str(self.key_path),
                *self.ssh_options(), *extra_options, f"{self.user}@{self.host}", *remote]

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError as e:
            return f"(could not read {self.log_path}: {e})"

    # -- lifecycle

    def start(self) -> SshServer:
        if self._proc is not None and self._proc.poll() is None:
            return self
        sshd = ensure_openssh_server()
        self.base_dir.mkdir(parents=True, exist_ok=True)
        if not PRIVSEP_DIR.is_dir():
            PRIVSEP_DIR.mkdir(mode=0o755, parents=True, exist_ok=True)
        self._make_keys()
        attempts = 1 if self._fixed_port is not None else PORT_ATTEMPTS
        for attempt in range(1, attempts + 1):
            self.port = self._fixed_port if self._fixed_port is not None else free_port(self.host)
            self._write_config(sshd)
            log_start = len(self.log_text())
            try:
                self._spawn_and_wait(sshd)
                return self
            except SshServerError:
                lost_race = "Address already in use" in self.log_text()[log_start:]
                self.stop()
                if not lost_race or attempt == attempts:
                    raise
            except BaseException:
                self.stop()
                raise
        raise AssertionError("unreachable: the last attempt returns or raises")

    def stop(self) -> None:
        """End our sshd by its PID (SIGTERM, then SIGKILL after a grace); idempotent.

        Then the connections it accepted are ended too (SIGTERM, then SIGKILL), so a
        ControlPersist master a test left behind cannot keep a session alive past the
        server. Their remote commands are left to the hangup, as with a real sshd.
        """
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=STOP_GRACE)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        # The listener is gone, so no new connection can start: the set below is complete.
        pids = connection_pids(self.port)
        for pid in pids:
            _signal(pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE
        while pids and time.monotonic() < deadline:
            pids = [pid for pid in pids if _alive(pid)]
            time.sleep(0.02)
        for pid in pids:
            _signal(pid, signal.SIGKILL)

    def __enter__(self) -> SshServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- pieces of start()

    def _make_keys(self) -> None:
        for key, comment in ((self.host_key, "elastic-ray test host"),
                             (self.key_path, "elastic-ray test client")):
            if not key.exists():
                _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(key)])
        self.authorized_keys.write_text(Path(f"{self.key_path}.pub").read_text())

    def _write_config(self, sshd: str) -> None:
        self.config_path.write_text(render_sshd_config(
            address=self.host, port=self.port, host_key=self.host_key, pid_file=self.pid_file,
            authorized_keys=self.authorized_keys, env=self.env))
        host_pub = Path(f"{self.host_key}.pub").read_text()
        self.known_hosts.write_text(known_hosts_line(self.host, self.port, host_pub))
        check = subprocess.run([sshd, "-t", "-f", str(self.config_path)], stdin=subprocess.DEVNULL,
                               capture_output=True, text=True)
        if check.returncode != 0:
            raise SshServerError(f"sshd -t rejected {self.config_path} (rc={check.returncode}):\n"
                                 f"{(check.stderr + check.stdout).strip()}")

    def _spawn_and_wait(self, sshd: str) -> None:
        # sshd re-executes itself for every connection, which needs the absolute path.
        with open(self.log_path, "ab") as log:
            self._proc = subprocess.Popen([sshd, "-D", "-e", "-f", str(self.config_path)],
                                          stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                          start_new_session=True)
        deadline = time.monotonic() + READY_TIMEOUT
        last = ""
        while True:
            rc = self._proc.poll()
            if rc is not None:
                raise SshServerError(f"sshd exited with rc={rc} before accepting logins; "
                                     f"{self.log_path}:\n{_tail(self.log_text())}")
            try:
                probe = subprocess.run(self.ssh_argv("true", extra_options=["-o", "ConnectTimeout=2"]),
                                       stdin=subprocess.DEVNULL, capture_output=True, text=True,
                                       timeout=READY_TIMEOUT)
            except subprocess.TimeoutExpired:
                last = f"ssh did not return within {READY_TIMEOUT:.0f}s"
            else:
                if probe.returncode == 0:
                    return
                last = probe.stderr.strip()
            if time.monotonic() >= deadline:
                raise SshServerError(f"sshd on {self.host}:{self.port} accepted no login within "
                                     f"{READY_TIMEOUT:.0f}s; last ssh error: {last}\n"
                                     f"{self.log_path}:\n{_tail(self.log_text())}")
            time.sleep(0.1)


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _alive(pid: int) -> bool:
    """Running, not a zombie (an orphaned zombie waits for init, which may be slow to reap)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2:].split()[0] != "Z"


def _run(cmd: list[str]) -> None:
    cp = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True)
    if cp.returncode != 0:
        raise SshServerError(f"{' '.join(cmd)} failed (rc={cp.returncode}): "
                             f"{(cp.stderr or cp.stdout).strip()}")
