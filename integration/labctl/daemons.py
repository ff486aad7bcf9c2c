"""The lab's daemons: munged, slurmctld and one slurmd per node; the nodes' states as Slurm
reports them; which processes belong to the lab; and the cgroups its slurmds leave behind."""

from __future__ import annotations

import glob
import os
import subprocess
import time
from typing import Callable

from .config import CTL_HOSTNAME, LabError, Node, Settings, daemon_argv, node_boot_script
from .net import netns_pids
from .procs import _start_daemon, children_of, owned_pid, pid_alive, poll_until

IDLE_TIMEOUT = 60.0  # s to wait for every node to be idle after a start
CTLD_TIMEOUT = 30.0  # s to wait for slurmctld to answer a ping


def daemon_env(s: Settings) -> dict[str, str]:
    """Environment for our daemons and our own client calls.

    SLURM_* variables of the caller (e.g. when run inside another job) must not leak into the
    daemons, and every client call must talk to *this* lab.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env["SLURM_CONF"] = str(s.conf)
    if s.swaps_usr:
        # Slurm 24.11's clients (the host's 22.05 ones cannot talk to its daemons): bin/ first.
        rest = [p for p in env.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin").split(":") if p and p != str(s.bin_dir)]
        env["PATH"] = ":".join([str(s.bin_dir), *rest])
    return env


def ctld_pid(s: Settings) -> int | None:
    return owned_pid(s.pid_dir / "slurmctld.pid", "slurmctld", str(s.conf))


def munged_pid(s: Settings) -> int | None:
    return owned_pid(s.munge_dir / "munged.pid", "munged", f"--socket={s.munge_socket}")


def slurmd_pid(s: Settings, node: str) -> int | None:
    return owned_pid(s.slurmd_pidfile(node), "slurmd", str(s.conf))


def start_munged(s: Settings) -> bool:
    """Start our private munged unless it runs.  Returns True if it had to be started."""
    if pid_alive(munged_pid(s)):
        return False
    key = s.munge_dir / "munge.key"
    if not key.exists() or key.stat().st_size < 32:
        fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o400)
        with os.fdopen(fd, "wb") as f:
            f.write(os.urandom(1024))
    os.chmod(key, 0o400)  # munged rejects a key readable by anybody else
    log_file = s.log_dir / "munged.log"
    _start_daemon(
        "munged",
        daemon_argv(s, ["munged", f"--socket={s.munge_socket}", f"--key-file={key}",
                        f"--pid-file={s.munge_dir / 'munged.pid'}", f"--seed-file={s.munge_dir / 'munged.seed'}",
                        f"--log-file={log_file}", "--num-threads=4"]),
        daemon_env(s), log_file)
    if not poll_until(lambda: s.munge_socket.exists() and pid_alive(munged_pid(s)), 10):
        raise LabError("munged did not come up", log_file)
    return True


def ctld_answers(s: Settings) -> bool:
    cp = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, env=daemon_env(s),
                        stdin=subprocess.DEVNULL, timeout=30)
    return "is UP" in cp.stdout


def start_slurmctld(s: Settings) -> bool:
    if pid_alive(ctld_pid(s)):
        return False
    log_file = s.log_dir / "slurmctld.log"
    _start_daemon("slurmctld", daemon_argv(s, ["slurmctld", "-f", str(s.conf)], hostname=CTL_HOSTNAME),
                  daemon_env(s), log_file)
    if not poll_until(lambda: ctld_answers(s), CTLD_TIMEOUT, 0.1):
        raise LabError(f"slurmctld did not answer `scontrol ping` within {CTLD_TIMEOUT:.0f}s", log_file)
    return True


def start_slurmd(s: Settings, node: Node) -> bool:
    if pid_alive(slurmd_pid(s, node.name)):
        return False
    cmd = ["nsenter", f"--net=/run/netns/{s.netns(node.name)}",
           "unshare", "--uts", "--mount", "--propagation", "private",
           "sh", "-c", node_boot_script(s, node)]
    _start_daemon(f"slurmd on {node.name}", cmd, daemon_env(s), s.slurmd_log(node.name))
    return True


def node_states(s: Settings) -> dict[str, str]:
    """{node: short state}, e.g. 'idle', 'mix', 'down*' (a trailing * = not responding)."""
    cp = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %t"], capture_output=True, text=True,
                        env=daemon_env(s), stdin=subprocess.DEVNULL, timeout=30)
    states: dict[str, str] = {}
    for line in cp.stdout.splitlines():
        parts = line.split()
        if len(parts) == 2:
            states[parts[0]] = parts[1]
    return states


def wait_nodes(s: Settings, names: list[str], ok: Callable[[str], bool], what: str) -> None:
    """Wait until every node in ``names`` satisfies ``ok``; fail early if its slurmd died."""
    last: dict[str, str] = {}
    t0 = time.monotonic()

    def ready() -> bool:
        nonlocal last
        last = node_states(s)
        if time.monotonic() - t0 > 2.0:  # a slurmd writes its pid file only once it is running
            dead = [n for n in names if not ok(last.get(n, "missing"))
                    and not pid_alive(slurmd_pid(s, n))]
            if dead:
                raise LabError(f"slurmd on {dead[0]} died during startup; see "
                               f"{s.slurmd_log(dead[0])}", s.slurmd_log(dead[0]))
        return all(ok(last.get(n, "missing")) for n in names)

    if poll_until(ready, IDLE_TIMEOUT, 0.1):
        return
    bad = [n for n in names if not ok(last.get(n, "missing"))]
    detail = ", ".join(f"{n}={last.get(n, 'missing')}" for n in bad)
    first = s.slurmd_log(bad[0]) if bad else s.log_dir / "slurmctld.log"
    raise LabError(
        f"nodes not {what} after {IDLE_TIMEOUT:.0f}s: {detail}; see {first} "
        f"and {s.log_dir / 'slurmctld.log'}", first)


def node_pids(s: Settings, layout: list[Node]) -> tuple[set[int], set[int]]:
    """(every process inside our node network namespaces, the slurmds among them).

    Anything at all in those namespaces was started by this lab: slurmd, slurmstepd, job
    processes and whatever they left behind.  Nothing is selected by name."""
    slurmds = {p for p in (slurmd_pid(s, n.name) for n in layout) if pid_alive(p)}
    pids = set(slurmds)
    for node in layout:
        pids.update(netns_pids(s.netns(node.name)))
    pids.discard(os.getpid())
    return {p for p in pids if pid_alive(p)}, slurmds


def ctld_pids(s: Settings) -> set[int]:
    """slurmctld and its helper (slurmscriptd), from our pid file."""
    ctld = ctld_pid(s)
    pids = {ctld, *children_of(ctld)} if pid_alive(ctld) else set()
    pids.discard(os.getpid())
    return {p for p in pids if p and pid_alive(p)}


def control_pids(s: Settings) -> set[int]:
    """munged, slurmctld and slurmctld's helper (slurmscriptd), from our pid files."""
    pids = ctld_pids(s) | {p for p in (munged_pid(s),) if pid_alive(p)}
    pids.discard(os.getpid())
    return pids


def remove_cgroups(layout: list[Node]) -> None:
    # Debian builds slurm with multiple-slurmd support, which prefixes each node's cgroup tree
    # with its name: /sys/fs/cgroup/<controller>/slurm_<node>/...  rmdir works bottom-up once
    # no task is left inside; files in cgroupfs need no removal.
    for node in layout:
        for top in glob.glob(f"/sys/fs/cgroup/*/slurm_{glob.escape(node.name)}"):
            for dirpath, _, _ in os.walk(top, topdown=False):
                for _ in range(20):
                    try:
                        os.rmdir(dirpath)
                        break
                    except FileNotFoundError:
                        break
                    except OSError:  # EBUSY: a just-killed task is still being released
                        time.sleep(0.05)
