"""The lab's job accounting: its own mariadbd and slurmdbd, and the cluster registered in them.

Both are started by the lab like munged and slurmctld, and stopped by the PIDs in their pid files
(never as system services).  mariadbd keeps its data under ``state/mariadb`` of the lab dir,
listens on a unix socket there and on no TCP port at all; a fresh lab gets a fresh database, as
its job ids start again at 1.  slurmdbd runs on the host network and listens on port 6819;
slurmctld and the clients reach it at the controller's address (``slurmctl``).  Started before
slurmctld, so that the controller finds its cluster registered.
"""

from __future__ import annotations

import subprocess

from .config import CLUSTER, LabError, Settings, daemon_argv, mariadb_install_argv, mariadbd_argv
from .daemons import daemon_env
from .procs import _run, _start_daemon, owned_pid, pid_alive, poll_until

DB_TIMEOUT = 30.0  # s for mariadbd to answer on its socket, and for slurmdbd to answer sacctmgr


def mariadbd_pid(s: Settings) -> int | None:
    return owned_pid(s.db_pidfile, "mariadbd", f"--socket={s.db_socket}")


def slurmdbd_pid(s: Settings) -> int | None:
    # slurmdbd's command line is just "slurmdbd": it is ours if it was started with our SLURM_CONF.
    return owned_pid(s.dbd_pidfile, "slurmdbd", f"SLURM_CONF={s.conf}", where="environ")


def accounting_pids(s: Settings) -> tuple[set[int], set[int]]:
    """({slurmdbd}, {mariadbd}) of this lab, each empty when not running: stopped in this order."""
    return ({p for p in (slurmdbd_pid(s),) if pid_alive(p)},
            {p for p in (mariadbd_pid(s),) if pid_alive(p)})


def _db_answers(s: Settings) -> bool:
    cp = subprocess.run(["mariadb-admin", "--no-defaults", f"--socket={s.db_socket}", "--user=root", "ping"],
                        capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=30)
    return cp.returncode == 0


def start_mariadb(s: Settings) -> bool:
    """Start the lab's mariadbd unless it runs (creating its datadir first if there is none)."""
    if pid_alive(mariadbd_pid(s)):
        return False
    log_file = s.log_dir / "mariadbd.log"
    s.db_dir.mkdir(parents=True, exist_ok=True)
    if not (s.db_dir / "data" / "mysql").is_dir():
        _run(mariadb_install_argv(s), log_file=log_file)
    # mariadbd stays in the foreground; setsid -f forks it off into a session of its own.
    _start_daemon("mariadbd", ["setsid", "-f", *mariadbd_argv(s)], daemon_env(s), log_file)
    if not poll_until(lambda: pid_alive(mariadbd_pid(s)) and _db_answers(s), DB_TIMEOUT, 0.1):
        raise LabError(f"mariadbd did not answer on {s.db_socket} within {DB_TIMEOUT:.0f}s", log_file)
    return True


def dbd_env(s: Settings) -> dict[str, str]:
    # The MySQL client library in slurmdbd takes its socket from here (StorageHost=localhost).
    return dict(daemon_env(s), MYSQL_UNIX_PORT=str(s.db_socket))


def _sacctmgr(s: Settings, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["sacctmgr", *args], capture_output=True, text=True, env=daemon_env(s),
                          stdin=subprocess.DEVNULL, timeout=30)


def clusters(s: Settings) -> list[str] | None:
    """The clusters slurmdbd knows; None when it does not answer."""
    cp = _sacctmgr(s, "--noheader", "--parsable2", "show", "cluster", "format=cluster")
    return cp.stdout.split() if cp.returncode == 0 else None


def start_slurmdbd(s: Settings) -> bool:
    """Start slurmdbd unless it runs; then make sure the lab's cluster is registered."""
    started = False
    log_file = s.log_dir / "slurmdbd.log"
    if not pid_alive(slurmdbd_pid(s)):
        _start_daemon("slurmdbd", daemon_argv(s, ["slurmdbd"]), dbd_env(s), log_file)
        started = True
    answer: list[list[str] | None] = [None]

    def answers() -> bool:
        answer[0] = clusters(s)
        return answer[0] is not None

    poll_until(answers, DB_TIMEOUT, 0.1)
    known = answer[0]
    if known is None:
        raise LabError(f"slurmdbd did not answer `sacctmgr show cluster` within {DB_TIMEOUT:.0f}s", log_file)
    if CLUSTER not in known:
        cp = _sacctmgr(s, "-i", "add", "cluster", CLUSTER)
        if cp.returncode != 0:
            raise LabError(f"sacctmgr add cluster {CLUSTER} failed: {(cp.stderr or cp.stdout).strip()}", log_file)
    return started
