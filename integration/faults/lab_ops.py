"""The faults themselves, as an operator (or a cluster) would cause them on the lab.

Every lab node shares the host's PID namespace, so the host sees (and can
signal) every process of every node; a process's node and job come from the
``SLURMD_NODENAME`` / ``SLURM_JOB_ID`` in its environment, which Ray's
processes inherit from the agent that started them. Nothing here ends a
process it did not find under one of the session's own job ids, except the
lab's own daemons (``slurmd``, ``slurmctld``), whose pids the lab records and
whose restart the lab itself performs.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from integration import labctl


@dataclass(frozen=True)
class Proc:
    """One process of the session seen from the host."""

    pid: int
    node: str
    job: str
    kind: str  # agent | raylet | gcs | driver | ray (any other Ray process) | other
    cmd: str


def _kind(argv: list[str]) -> str:
    text = " ".join(argv)
    exe = os.path.basename(argv[0]) if argv else ""
    if exe == "raylet" or "/raylet " in text or text.endswith("/raylet"):
        return "raylet"
    if exe == "gcs_server" or "gcs_server" in (argv[0] if argv else ""):
        return "gcs"
    if "elastic-agent" in text or "elastic_ray.agent" in text:
        return "agent"
    if "elastic_ray.demo.payload" in text:
        return "driver"
    if "ray" in text:
        return "ray"
    return "other"


def _environ(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    out = {}
    for item in raw.split(b"\0"):
        key, eq, value = item.partition(b"=")
        if eq:
            out[key.decode(errors="replace")] = value.decode(errors="replace")
    return out


_TICKS = os.sysconf("SC_CLK_TCK")
# The boot time to 10 ms (now minus /proc/uptime); /proc/stat's btime is whole
# seconds, too coarse for the phases bench/bench_agent.py reads from it.
_BOOT = time.time() - float(Path("/proc/uptime").read_text().split()[0])


def started_at(pid: int) -> float | None:
    """A process's start as a Unix time (from /proc/<pid>/stat and the boot time)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return _BOOT + int(fields[19]) / _TICKS


def _net_ns(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/net")
    except OSError:
        return None


def session_processes(job_ids: set[str], since: float = 0.0) -> list[Proc]:
    """Every live process (not a zombie) whose environment carries one of ``job_ids``
    and that started at or after ``since`` (Slurm reuses job ids after the lab's
    state is reset, so an old process can carry a new session's job id)."""
    found = []
    # The lab's nodes are network namespaces; the local scheduler's emulated
    # jobs (other tests, benches) carry SLURM_JOB_ID too, with the same small
    # ids and node names, but live in this process's namespace. Only the
    # lab's count, so a concurrent local run is never reported or killed here.
    own_net = _net_ns(os.getpid())
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        pid = int(entry)
        if pid == os.getpid():
            continue
        env = _environ(pid)
        job = env.get("SLURM_JOB_ID")
        if not job or job not in job_ids or not labctl.pid_alive(pid):
            continue
        if own_net is not None and _net_ns(pid) == own_net:
            continue
        if since and (started_at(pid) or 0.0) < since - 1.0:
            continue
        try:
            argv = [a.decode(errors="replace") for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if a]
        except OSError:
            continue
        if not argv or os.path.basename(argv[0]) in ("slurmstepd", "srun", "sleep", "sh", "bash"):
            continue
        found.append(Proc(pid, env.get("SLURMD_NODENAME", "?"), job, _kind(argv), " ".join(argv)[:160]))
    return found


def kill_one(job_ids: set[str], kind: str, node: str | None = None, sig: int = signal.SIGKILL,
             since: float = 0.0) -> Proc:
    """SIGKILL the one process of ``kind`` (on ``node``) among the session's; fails if none."""
    matches = [p for p in session_processes(job_ids, since) if p.kind == kind and (node is None or p.node == node)]
    if kind == "agent" and len(matches) > 1:
        # The agent re-execs nothing, but `elastic-agent` may sit behind a wrapper: the oldest one is the agent.
        matches.sort(key=lambda p: p.pid)
    if not matches:
        raise RuntimeError(f"no {kind} process of jobs {sorted(job_ids)} on {node or 'any node'}")
    victim = matches[0]
    os.kill(victim.pid, sig)
    return victim


def settings() -> labctl.Settings:
    return labctl.running_settings(labctl.settings_from_env())


def node_of(name: str) -> tuple[int, labctl.Node]:
    for k, node in enumerate(labctl.nodes(), start=1):  # numbered as labctl.net_up numbers veths
        if node.name == name:
            return k, node
    raise KeyError(name)


def link(node: str, up: bool) -> None:
    """Cut (or restore) ``node``'s only link: its veth's host side, on the lab bridge."""
    k, _ = node_of(node)
    veth = settings().veth(k)
    subprocess.run(["ip", "link", "set", veth, "up" if up else "down"], check=True, timeout=30)
    if up:
        subprocess.run(["ip", "link", "set", veth, "master", settings().bridge], check=False, timeout=30)


def kill_slurmd(node: str) -> int:
    s = settings()
    pid = labctl.slurmd_pid(s, node)
    if not pid:
        raise RuntimeError(f"no slurmd on {node}")
    os.kill(pid, signal.SIGKILL)
    return pid


def kill_slurmctld() -> int:
    pid = labctl.ctld_pid(settings())
    if not pid:
        raise RuntimeError("no slurmctld")
    os.kill(pid, signal.SIGKILL)
    return pid


def repair_lab() -> None:
    """Restart the lab's dead daemons (slurmd, slurmctld), as `lab up` does; keeps jobs."""
    labctl.up(len(labctl.nodes()) or labctl.DEFAULT_NODES)


def partition_state(partition: str, state: str) -> None:
    """``scontrol update PartitionName=... State=...``: INACTIVE closes a queue
    (sbatch refuses new jobs), UP opens it again."""
    subprocess.run(["scontrol", "update", f"PartitionName={partition}", f"State={state}"], check=True,
                   capture_output=True, timeout=30)


def restore_node(node: str) -> None:
    """A node whose link was cut for good: link up, dead daemons restarted, back in Slurm."""
    link(node, True)
    repair_lab()
    wait_node_ready(node)


def node_states() -> dict[str, str]:
    return labctl.node_states(settings())


def wait_node_ready(node: str, timeout: float = 90.0, settle: float = 5.0) -> None:
    """Wait until Slurm lists ``node`` idle/mixed/allocated again (after a slurmd restart or a
    cut link), and still so ``settle`` s later. A node drained or down is resumed; the settling
    catches the drain that comes after a resume: a node back from a cut link still runs the
    steps of a job Slurm requeued meanwhile, and when the requeued job is placed there again
    slurmctld drains the node ("Duplicate jobid"; seen on the lab)."""
    deadline = time.monotonic() + timeout
    ready_since: float | None = None
    while time.monotonic() < deadline:
        state = node_states().get(node, "")
        if state.rstrip("*") in ("idle", "mix", "alloc") and not state.endswith("*"):
            ready_since = ready_since if ready_since is not None else time.monotonic()
            if time.monotonic() - ready_since >= settle:
                return
        else:
            ready_since = None
            if state.startswith("down") or state.startswith("drain"):
                subprocess.run(["scontrol", "update", f"nodename={node}", "state=resume"], check=False,
                               capture_output=True, timeout=30)
        time.sleep(1.0)
    raise RuntimeError(f"node {node} not back in Slurm after {timeout:.0f}s: {node_states().get(node)}")


def all_nodes_ready(timeout: float = 90.0) -> list[str]:
    """Every lab node idle/mixed/allocated, resuming the ones an earlier scenario left drained
    or down (see :func:`wait_node_ready`); returns the nodes that had to be brought back."""
    back = [node for node, state in node_states().items()
            if not (state.rstrip("*") in ("idle", "mix", "alloc") and not state.endswith("*"))]
    for node in back:
        wait_node_ready(node, timeout=timeout, settle=2.0)
    return back


def on_node(node: str, argv: list[str], timeout: float = 30.0) -> subprocess.CompletedProcess:
    """Run ``argv`` inside ``node``'s namespaces (network, hostname, private /tmp), as its jobs see them.

    Enters the namespaces of the node's slurmd, so it works while no job of
    ours runs there (e.g. to ask `elastic-agent status` about a dead agent).
    """
    pid = labctl.slurmd_pid(settings(), node)
    if not pid:
        return subprocess.CompletedProcess(argv, 99, "", f"no slurmd on {node}")
    cmd = ["nsenter", f"--target={pid}", "--net", "--uts", "--mount", "--"] + argv
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


class LoopFs:
    """A small ext4 filesystem that the host and every node see at one path.

    Lab nodes live in private mount namespaces, so a mount made on the host
    after they started is invisible to them; mounting the same loop device in
    each node's namespace gives them the one superblock, like an NFS export.
    ``fill()`` takes all its free space until ``free()``.
    """

    def __init__(self, where: Path, size_mb: int = 64):
        self.where = where
        self.image = where.with_suffix(".img")
        self.size_mb = size_mb
        self.device: str | None = None
        self.mounted_in: list[int] = []
        self.filler = where / ".filler"

    def __enter__(self) -> "LoopFs":
        self.where.mkdir(parents=True, exist_ok=True)
        subprocess.run(["truncate", "-s", f"{self.size_mb}M", str(self.image)], check=True)
        subprocess.run(["mkfs.ext4", "-q", "-F", str(self.image)], check=True)
        self.device = subprocess.run(["losetup", "-f", "--show", str(self.image)], check=True,
                                     capture_output=True, text=True).stdout.strip()
        subprocess.run(["mount", self.device, str(self.where)], check=True)
        self.mounted_in.append(0)
        s = settings()
        for node in labctl.nodes():
            pid = labctl.slurmd_pid(s, node.name)
            if pid:
                subprocess.run(["nsenter", f"--target={pid}", "--mount", "--", "mount", self.device,
                                str(self.where)], check=True)
                self.mounted_in.append(pid)
        return self

    def fill(self) -> None:
        """Take every free block (a file as large as the free space)."""
        st = os.statvfs(self.where)
        free = st.f_bavail * st.f_frsize
        with open(self.filler, "wb") as f:
            try:
                f.truncate(0)
                os.posix_fallocate(f.fileno(), 0, max(free - 4096, 4096))
            except OSError:
                pass
            chunk = b"\0" * (1 << 20)
            try:
                while True:
                    f.write(chunk)
                    f.flush()
            except OSError:
                pass

    def free(self) -> None:
        try:
            self.filler.unlink()
        except FileNotFoundError:
            pass

    def __exit__(self, *exc: object) -> None:
        self.free()
        for pid in reversed(self.mounted_in):
            if pid == 0:
                cmd = ["umount", "-l", str(self.where)]
            else:
                cmd = ["nsenter", f"--target={pid}", "--mount", "--", "umount", "-l", str(self.where)]
            subprocess.run(cmd, check=False, capture_output=True)
        if self.device:
            subprocess.run(["losetup", "-d", self.device], check=False, capture_output=True)
        try:
            self.image.unlink()
        except FileNotFoundError:
            pass


def quote(argv: list[str]) -> str:
    return " ".join(shlex.quote(a) for a in argv)
