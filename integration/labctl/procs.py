"""Process helpers: pid files, liveness, short commands, self-daemonizing starts, stopping.

Every process is found through a PID the lab recorded or was given, never by its name.
"""

from __future__ import annotations

import glob
import os
import shlex
import signal
import subprocess
import time
from pathlib import Path
from typing import Callable

from .config import LabError

TERM_GRACE = 10.0  # s the daemons get between SIGTERM and SIGKILL in down()
STEP_SETTLE = 2.0  # s job processes get after SIGTERM once the daemons are gone


def read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def pid_alive(pid: int | None) -> bool:
    """Alive = exists and is not a zombie.

    The sandbox's PID 1 reaps orphans only after a second or more, and kill(pid, 0) succeeds
    on a zombie; treating zombies as alive made `up` believe a crashed daemon was still there.
    """
    if not pid or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("State:"):
                    return line.split()[1] != "Z"
    except OSError:
        return False
    return True


def children_of(ppid: int) -> list[int]:
    kids = []
    for stat_path in glob.glob("/proc/[0-9]*/stat"):
        try:
            with open(stat_path) as f:
                data = f.read()
        except OSError:
            continue
        # The comm field may contain spaces and parentheses; fields after the last ')' are safe.
        rest = data[data.rfind(")") + 2 :].split()
        if len(rest) > 1 and int(rest[1]) == ppid:
            kids.append(int(stat_path.split("/")[2]))
    return kids


def _run(cmd: list[str], *, check: bool = True, timeout: float = 60,
         log_file: Path | None = None) -> subprocess.CompletedProcess:
    """Run a short command, capturing output; failures become LabError with stderr attached."""
    try:
        cp = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                            timeout=timeout)
    except FileNotFoundError as e:
        raise LabError(f"command not found: {cmd[0]}") from e
    except subprocess.TimeoutExpired as e:
        raise LabError(f"timed out after {timeout}s: {shlex.join(cmd)}", log_file) from e
    if check and cp.returncode != 0:
        msg = (cp.stderr or cp.stdout).strip().splitlines()
        raise LabError(f"{shlex.join(cmd)} failed (rc={cp.returncode}): {' | '.join(msg[-3:])}", log_file)
    return cp


def _start_daemon(label: str, cmd: list[str], env: dict, log_file: Path) -> None:
    """Run a command whose final exec is a self-daemonizing server; return once it forked off.

    Output goes to a file, never to a pipe: a daemon holding our pipe open would block us.
    """
    with open(log_file, "ab") as out:
        rc = subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=out, env=env,
                            timeout=60).returncode
    if rc != 0:
        raise LabError(f"starting {label} failed (rc={rc})", log_file)


def poll_until(pred: Callable[[], object], timeout: float, interval: float = 0.1) -> object:
    """Call pred until it returns something truthy or timeout passes; return the last value."""
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value or time.monotonic() >= deadline:
            return value
        time.sleep(interval)


def owned_pid(pidfile: Path, program: str, marker: str, where: str = "cmdline") -> int | None:
    """The PID in ``pidfile``, but only if it still is *our* daemon: its executable is
    ``program`` and its command line names ``marker`` (our config or socket path).  A daemon
    whose command line names nothing of ours (slurmdbd finds its config through $SLURM_CONF)
    is checked in its environment instead: ``where="environ"``.

    A stale pid file whose PID was reused by an unrelated process must never make us skip a
    start or, worse, signal a stranger.  (This checks the PID we were given; it never looks
    processes up by name.)
    """
    pid = read_pid(pidfile)
    if pid is None:
        return None
    try:
        exe = os.path.basename(os.readlink(f"/proc/{pid}/exe"))
        with open(f"/proc/{pid}/{where}", "rb") as f:
            args = f.read().split(b"\0")
    except OSError:
        return None
    # Debian installs the real binaries as e.g. /usr/sbin/slurmd-wlm (via alternatives), and
    # an upgraded package leaves "slurmd-wlm (deleted)" behind a running daemon.
    exe = exe.split(" ")[0]
    if exe != program and not exe.startswith(program + "-"):
        return None
    return pid if marker.encode() in args else None


def stop_pids(pids: set[int], daemons: set[int], grace: float = TERM_GRACE,
              settle: float = STEP_SETTLE) -> set[int]:
    """SIGTERM everything, then SIGKILL what is left.  Returns PIDs still alive afterwards.

    The daemons get up to ``grace`` seconds.  slurmstepd ignores SIGTERM (it expects orders
    from slurmd), so once the daemons are gone there is no point in waiting the full grace for
    the rest: job processes get ``settle`` seconds after the TERM and are then killed.
    """
    def signal_all(sig: int, targets: set[int]) -> None:
        for pid in targets:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass

    t_term = time.monotonic()
    signal_all(signal.SIGTERM, pids)
    poll_until(lambda: not any(map(pid_alive, pids)) or (
        not any(map(pid_alive, daemons)) and time.monotonic() - t_term >= settle), grace, 0.1)
    left = {p for p in pids if pid_alive(p)}
    if left:
        signal_all(signal.SIGKILL, left)
        poll_until(lambda: not any(map(pid_alive, left)), 5.0, 0.1)
        left = {p for p in left if pid_alive(p)}
    return left
