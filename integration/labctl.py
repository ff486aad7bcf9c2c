"""A real multi-node Slurm 22.05 lab on one Linux machine, for elastic-ray's integration tests.

Every compute node is a genuine ``slurmd``.  Each one lives in three namespaces of its own:

* a network namespace, joined to a private bridge by a veth pair, with its own IP and *no*
  default route (nothing inside a node can reach anything but the bridge subnet);
* a UTS namespace, so ``hostname`` inside a job prints the node name;
* a mount namespace in which /tmp, /var/tmp and /dev/shm are per-node directories of the lab
  dir (the rest of the filesystem is shared, like NFS home/project dirs on a real cluster).

``slurmctld`` runs on the host network (it owns the bridge address, ``.1``) in its own UTS
namespace whose hostname is ``slurmctl``, so the config never depends on the machine's name.
A private ``munged`` (own key and socket under the lab dir) authenticates everything.

Commands (``integration/lab`` is a thin wrapper around :func:`main`)::

    lab up [N]    start, or repair, an N-node lab (default 4); idempotent
    lab down      stop what this lab started and remove its netns/bridge/hosts block
    lab status    exit 0 when up, 3 when down
    lab env       print the ``export SLURM_CONF=...`` line

Environment knobs:

    ELASTIC_RAY_LAB_DIR          state/config/log dir; absolute       [<repo>/.lab]
    ELASTIC_RAY_LAB_SUBNET       first three octets of the /24        [10.78.0]
                                 (host and controller .1, node k at .(10+k))
    ELASTIC_RAY_LAB_BRIDGE       bridge name, at most 11 characters   [erlab0]
    ELASTIC_RAY_LAB_PRIVATE_TMP  1|0: per-node /tmp, /var/tmp, /dev/shm   [1]
                                 Forced to 0 (with a note) when the repo or the python that
                                 runs jobs lives under one of those dirs: nodes could not see it.
    ELASTIC_RAY_LAB_PYTHON_PREFIX  sys.prefix of the python that will run jobs   [sys.prefix]

Python API for tests: :func:`up`, :func:`down`, :func:`is_up`, :func:`slurm_conf_path`,
:func:`nodes`, :func:`lab_dir`.  Must run as root.  Standard library only.
"""

from __future__ import annotations

import argparse
import dataclasses
import glob
import hashlib
import json
import os
import re
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, NamedTuple

REPO = Path(__file__).resolve().parent.parent

CTL_HOSTNAME = "slurmctl"
CPUS_PER_NODE = 4  # fake, accepted thanks to SlurmdParameters=config_overrides
MEM_PER_NODE = 8192  # MB, fake as well
DEFAULT_NODES = 4
PARTITIONS = ("cpu", "gpu-a", "gpu-b")  # round-robin order; "cpu" is the default partition
PARTITION_GRES = {"cpu": None, "gpu-a": "gpu:a40:4", "gpu-b": "gpu:h100:2"}
NVIDIA_MAJOR = 195  # fake GPUs are char devices with NVIDIA's major number; never opened
PRIVATE_DIRS = ("/tmp", "/var/tmp", "/dev/shm")

PACKAGES = ("slurmctld", "slurmd", "slurm-client", "munge", "iproute2", "util-linux")

IDLE_TIMEOUT = 60.0  # s to wait for every node to be idle after a start
CTLD_TIMEOUT = 30.0  # s to wait for slurmctld to answer a ping
TERM_GRACE = 10.0  # s the daemons get between SIGTERM and SIGKILL in down()
STEP_SETTLE = 2.0  # s job processes get after SIGTERM once the daemons are gone

EXIT_DOWN = 3  # `lab status` exit code when the lab is not running


class LabError(RuntimeError):
    """The lab could not be brought up or down.  ``log_file`` names the log worth reading."""

    def __init__(self, message: str, log_file: Path | None = None):
        super().__init__(message)
        self.log_file = log_file


class Node(NamedTuple):
    name: str
    ip: str
    partition: str
    gres: str | None  # e.g. "gpu:a40:4"; None for CPU-only nodes


@dataclass(frozen=True)
class Settings:
    """Everything that is decided before anything is started (from the environment)."""

    lab_dir: Path
    subnet: str
    bridge: str
    private_tmp: bool
    notes: tuple[str, ...] = ()  # things worth telling the user (e.g. private tmp forced off)

    @property
    def ctl_ip(self) -> str:
        return f"{self.subnet}.1"

    @property
    def etc(self) -> Path:
        return self.lab_dir / "etc"

    @property
    def conf(self) -> Path:
        return self.etc / "slurm.conf"

    @property
    def log_dir(self) -> Path:
        return self.lab_dir / "log"

    @property
    def pid_dir(self) -> Path:
        return self.lab_dir / "pid"

    @property
    def munge_dir(self) -> Path:
        return self.lab_dir / "munge"

    @property
    def munge_socket(self) -> Path:
        return self.munge_dir / "munge.socket"

    @property
    def shared_dir(self) -> Path:
        # Visible at the same path on the host and on every node (unlike /tmp); for job
        # scripts and outputs.  Wiped by `up` (fresh start) and `down`.
        return self.lab_dir / "shared"

    @property
    def state_file(self) -> Path:
        # The last layout brought up.  Kept after `down` on purpose: a later `down` (e.g. after
        # a crash) still knows which netns and cgroups belong to this lab.
        return self.lab_dir / "lab.json"

    @property
    def hosts_tag(self) -> str:
        return f"elastic-ray-lab {self.lab_dir}"

    def netns(self, node: str) -> str:
        # Prefixed with the bridge name so that two labs with different bridges never collide.
        return f"{self.bridge}-{node}"

    def veth(self, index: int) -> str:
        # Host side of node k's veth pair.  Interface names are limited to 15 characters,
        # which is why the bridge name is limited to 11.
        return f"{self.bridge}v{index}"

    def slurmd_pidfile(self, node: str) -> Path:
        return self.pid_dir / f"slurmd-{node}.pid"

    def slurmd_log(self, node: str) -> Path:
        return self.log_dir / f"slurmd-{node}.log"

    def node_dir(self, node: str) -> Path:
        return self.lab_dir / "nodes" / node


@dataclass
class LabInfo:
    lab_dir: Path
    conf: Path
    nodes: list[Node]
    private_tmp: bool
    shared_dir: Path
    action: str = "up"  # "started", "repaired" or "up" (nothing to do)
    notes: list[str] = field(default_factory=list)

    @property
    def export_line(self) -> str:
        return f"export SLURM_CONF={shlex.quote(str(self.conf))}"


# --------------------------------------------------------------------------- logging

def log(msg: str) -> None:
    """One short prefixed line on stderr; stdout stays free for sinfo and the export line."""
    print(f"[lab {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _since(t0: float) -> str:
    return f"{time.monotonic() - t0:.1f}s"


# --------------------------------------------------------------------------- pure functions


def is_under(path: str | os.PathLike, parents: Iterable[str]) -> bool:
    """True if ``path`` is one of ``parents`` or inside one of them (after resolving links)."""
    p = os.path.realpath(path)
    for parent in parents:
        parent = os.path.realpath(parent)
        if p == parent or p.startswith(parent.rstrip("/") + "/"):
            return True
    return False


def settings_from_env(env: dict[str, str] | None = None) -> Settings:
    """Read and validate the ELASTIC_RAY_LAB_* knobs."""
    env = os.environ if env is None else env
    notes: list[str] = []

    lab_dir = env.get("ELASTIC_RAY_LAB_DIR") or str(REPO / ".lab")
    if not os.path.isabs(lab_dir):
        raise LabError(f"ELASTIC_RAY_LAB_DIR must be absolute, got {lab_dir!r}")
    lab_dir = os.path.normpath(lab_dir)
    if lab_dir == "/":
        raise LabError("ELASTIC_RAY_LAB_DIR must not be /")

    subnet = env.get("ELASTIC_RAY_LAB_SUBNET", "10.78.0")
    if not re.fullmatch(r"(\d{1,3})\.(\d{1,3})\.(\d{1,3})", subnet) or any(
        int(o) > 255 for o in subnet.split(".")
    ):
        raise LabError(f"ELASTIC_RAY_LAB_SUBNET must be three octets like 10.78.0, got {subnet!r}")

    bridge = env.get("ELASTIC_RAY_LAB_BRIDGE", "erlab0")
    if not re.fullmatch(r"[A-Za-z][A-Za-z0-9_]{0,10}", bridge):
        raise LabError(f"ELASTIC_RAY_LAB_BRIDGE must be 1-11 letters/digits/_, got {bridge!r}")

    raw_tmp = env.get("ELASTIC_RAY_LAB_PRIVATE_TMP", "1")
    if raw_tmp not in ("0", "1"):
        raise LabError(f"ELASTIC_RAY_LAB_PRIVATE_TMP must be 0 or 1, got {raw_tmp!r}")
    private_tmp = raw_tmp == "1"

    if private_tmp:
        # Nodes get their own /tmp etc.; anything the jobs need from there would vanish.
        prefix = env.get("ELASTIC_RAY_LAB_PYTHON_PREFIX")
        needed = {"the repository": str(REPO)}
        if prefix:
            needed["ELASTIC_RAY_LAB_PYTHON_PREFIX"] = prefix
        else:
            needed["sys.prefix"] = sys.prefix
            needed["sys.base_prefix"] = sys.base_prefix
        hidden = [f"{what} ({path})" for what, path in needed.items() if is_under(path, PRIVATE_DIRS)]
        if hidden:
            private_tmp = False
            notes.append(
                "private /tmp turned OFF: "
                + ", ".join(hidden)
                + " is under /tmp, /var/tmp or /dev/shm and nodes would not see it"
            )
    if private_tmp and is_under(lab_dir, PRIVATE_DIRS):
        raise LabError(
            f"ELASTIC_RAY_LAB_DIR={lab_dir} is under /tmp, /var/tmp or /dev/shm, which every node "
            "replaces with its own; choose another dir or set ELASTIC_RAY_LAB_PRIVATE_TMP=0"
        )
    return Settings(Path(lab_dir), subnet, bridge, private_tmp, tuple(notes))


def compute_layout(n: int, subnet: str) -> list[Node]:
    """Deal n nodes round-robin over the partitions, then group them by partition.

    n=4 -> cpu-1, cpu-2, gpua-1, gpub-1; n=5 adds gpua-2; n=6 adds gpub-2.  IPs follow the
    grouped order: the k-th node (1-based) gets .(10+k).
    """
    if not 1 <= n <= 200:
        raise LabError(f"node count must be between 1 and 200, got {n}")
    per_partition = {p: 0 for p in PARTITIONS}
    for i in range(n):
        per_partition[PARTITIONS[i % len(PARTITIONS)]] += 1
    result: list[Node] = []
    for part in PARTITIONS:
        for j in range(1, per_partition[part] + 1):
            k = len(result) + 1
            name = f"{part.replace('-', '')}-{j}"
            result.append(Node(name, f"{subnet}.{10 + k}", part, PARTITION_GRES[part]))
    return result


def choose_proctrack(mounts_text: str) -> str:
    """proctrack/cgroup needs a cgroup v1 freezer; without one fall back to linuxproc.

    (linuxproc cannot kill children that daemonized out of a job, but works everywhere.)
    """
    for line in mounts_text.splitlines():
        fields = line.split()
        if len(fields) >= 4 and fields[2] == "cgroup" and "freezer" in fields[3].split(","):
            return "cgroup"
    return "linuxproc"


def render_slurm_conf(s: Settings, layout: list[Node], proctrack: str) -> str:
    lab = s.lab_dir
    lines = [
        "# Generated by integration/labctl.py -- edits are lost on the next `lab up`.",
        "ClusterName=erlab",
        # The controller's UTS hostname is slurmctl, which must match SlurmctldHost.
        f"SlurmctldHost={CTL_HOSTNAME}({s.ctl_ip})",
        "SlurmctldPort=6817",
        "SlurmdPort=6818",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        # Our own munged socket.  cred_expire (default 120 s) also delays a requeued job's restart.
        f"AuthInfo=socket={s.munge_socket},cred_expire=30",
        f"StateSaveLocation={lab}/state/ctld",
        # %n = node name: all slurmds share this file, so per-node paths need it.
        f"SlurmdSpoolDir={lab}/state/spool/%n",
        f"SlurmctldPidFile={s.pid_dir}/slurmctld.pid",
        f"SlurmdPidFile={s.pid_dir}/slurmd-%n.pid",
        f"SlurmctldLogFile={s.log_dir}/slurmctld.log",
        f"SlurmdLogFile={s.log_dir}/slurmd-%n.log",
        "SlurmctldDebug=info",
        "SlurmdDebug=info",
        # Without a working mailer slurmctld complains about every job.
        "MailProg=/bin/true",
        "MpiDefault=none",
        f"ProctrackType=proctrack/{proctrack}",
        # The 4 CPUs / 8 GB per node are fiction, so nothing may be pinned or constrained.
        "TaskPlugin=task/none",
        "AccountingStorageType=accounting_storage/none",
        "JobAcctGatherType=jobacct_gather/none",
        # Without accounting, this file is the only record of a job older than MinJobAge.
        "JobCompType=jobcomp/filetxt",
        f"JobCompLoc={s.log_dir}/jobcomp.log",
        "SchedulerType=sched/backfill",
        # Start submitted jobs on the next 1 s tick instead of batching them for 3 s; rescan
        # time-eligible jobs (requeue, --begin) every 5 s instead of 60/30 s.
        "SchedulerParameters=batch_sched_delay=0,sched_interval=5,bf_interval=5",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_CPU_Memory",
        "DefMemPerCPU=256",
        "GresTypes=gpu",
        "SlurmdParameters=config_overrides",
        # 1: an admin "state=down" sticks (node-failure tests need that), while a node that was
        # merely unreachable comes back as soon as its slurmd registers again.
        "ReturnToService=1",
        "SlurmdTimeout=20",
        "SlurmctldTimeout=30",
        "MessageTimeout=10",
        "TCPTimeout=2",
        "BatchStartTimeout=10",
        "KillWait=10",
        "OverTimeLimit=0",
        "InactiveLimit=0",
        # Finished jobs stay visible in squeue -t all / scontrol for 10 minutes.
        "MinJobAge=600",
    ]
    for node in layout:
        gres = f" Gres={node.gres}" if node.gres else ""
        lines.append(
            f"NodeName={node.name} NodeAddr={node.ip} NodeHostname={node.name} "
            f"CPUs={CPUS_PER_NODE} RealMemory={MEM_PER_NODE}{gres} State=UNKNOWN"
        )
    for i, part in enumerate(p for p in PARTITIONS if any(n.partition == p for n in layout)):
        members = ",".join(n.name for n in layout if n.partition == part)
        default = "YES" if i == 0 else "NO"
        lines.append(f"PartitionName={part} Nodes={members} Default={default} MaxTime=INFINITE State=UP")
    return "\n".join(lines) + "\n"


def parse_gres(gres: str) -> tuple[str, str, int]:
    """'gpu:a40:4' -> ('gpu', 'a40', 4)."""
    name, gtype, count = gres.split(":")
    return name, gtype, int(count)


def gpu_device_paths(s: Settings, node: Node) -> list[Path]:
    if not node.gres:
        return []
    _, _, count = parse_gres(node.gres)
    return [s.lab_dir / "dev" / node.name / f"nvidia{i}" for i in range(count)]


def render_gres_conf(s: Settings, layout: list[Node]) -> str:
    # AutoDetect would look for NVML and real GPUs; our devices are listed explicitly.
    lines = ["AutoDetect=off"]
    for node in layout:
        if node.gres:
            name, gtype, count = parse_gres(node.gres)
            files = f"{s.lab_dir}/dev/{node.name}/nvidia[0-{count - 1}]"
            lines.append(f"NodeName={node.name} Name={name} Type={gtype} File={files}")
    return "\n".join(lines) + "\n"


def render_cgroup_conf() -> str:
    # Only read with proctrack/cgroup, and only for tracking: constraining the fake resources
    # would break jobs.  cgroup/v2 in 22.05 wants systemd, which this machine may not have.
    return "\n".join(
        [
            "CgroupPlugin=cgroup/v1",
            "CgroupAutomount=no",
            "ConstrainCores=no",
            "ConstrainRAMSpace=no",
            "ConstrainDevices=no",
        ]
    ) + "\n"


def hosts_markers(tag: str) -> tuple[str, str]:
    return f"# >>> {tag} >>>", f"# <<< {tag} <<<"


def strip_hosts_block(text: str, tag: str) -> str:
    """Remove our marked block (and nothing else) from /etc/hosts content."""
    begin, end = hosts_markers(tag)
    out, inside = [], False
    for line in text.splitlines(keepends=True):
        stripped = line.rstrip("\n")
        if stripped == begin:
            inside = True
        elif stripped == end and inside:
            inside = False
        elif not inside:
            out.append(line)
    return "".join(out)


def render_hosts_block(tag: str, ctl_ip: str, layout: list[Node]) -> str:
    begin, end = hosts_markers(tag)
    rows = [f"{ctl_ip} {CTL_HOSTNAME}"] + [f"{n.ip} {n.name}" for n in layout]
    return "\n".join([begin, *rows, end]) + "\n"


def with_hosts_block(text: str, tag: str, block: str) -> str:
    base = strip_hosts_block(text, tag)
    if base and not base.endswith("\n"):
        base += "\n"
    return base + block


def node_boot_script(s: Settings, node: Node) -> str:
    """The shell snippet that turns fresh UTS+mount namespaces into node ``node`` and execs slurmd.

    Writing /proc/sys/kernel/hostname sets the hostname of the *current* UTS namespace, so no
    `hostname` binary is needed.  slurmd then takes its NodeName from that hostname.
    """
    q = shlex.quote
    cmds = ["set -e", f"echo {q(node.name)} > /proc/sys/kernel/hostname"]
    if s.private_tmp:
        for src, dst in private_mounts(s, node.name):
            cmds.append(f"mount --bind {q(str(src))} {q(dst)}")
    cmds.append(f"exec slurmd -f {q(str(s.conf))}")
    return "\n".join(cmds)


def private_mounts(s: Settings, node: str) -> list[tuple[Path, str]]:
    d = s.node_dir(node)
    return [(d / "tmp", "/tmp"), (d / "var_tmp", "/var/tmp"), (d / "shm", "/dev/shm")]


def fingerprint(files: dict[str, str], s: Settings) -> str:
    """Identity of a lab configuration: same fingerprint -> repair in place, else restart."""
    h = hashlib.sha256()
    for name in sorted(files):
        h.update(name.encode() + b"\0" + files[name].encode() + b"\0")
    h.update(f"private_tmp={s.private_tmp} bridge={s.bridge}".encode())
    return h.hexdigest()[:16]


# --------------------------------------------------------------------------- process helpers


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


def daemon_env(s: Settings) -> dict[str, str]:
    """Environment for our daemons and our own client calls.

    SLURM_* variables of the caller (e.g. when run inside another job) must not leak into the
    daemons, and every client call must talk to *this* lab.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env["SLURM_CONF"] = str(s.conf)
    return env


# --------------------------------------------------------------------------- packages


def missing_packages() -> list[str]:
    wanted = list(PACKAGES)
    if shutil.which("mount") is None:  # split out of util-linux; needed for the bind mounts
        wanted.append("mount")
    cp = subprocess.run(["dpkg-query", "-W", "-f=${Package} ${Status}\n", *wanted],
                        capture_output=True, text=True)
    installed = {line.split()[0] for line in cp.stdout.splitlines() if line.endswith(" installed")}
    return [p for p in wanted if p not in installed]


def ensure_packages(s: Settings) -> None:
    if shutil.which("dpkg-query") is None:
        raise LabError("this lab needs a Debian/Ubuntu machine (dpkg/apt)")
    missing = missing_packages()
    if not missing:
        return
    t0 = time.monotonic()
    log(f"installing {' '.join(missing)} ...")
    apt_log = s.log_dir / "apt.log"
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    with open(apt_log, "w") as out:
        for cmd in (["apt-get", "update"],
                    ["apt-get", "install", "-y", "--no-install-recommends", *missing]):
            out.write(f"$ {shlex.join(cmd)}\n")
            out.flush()
            if subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=out, env=env).returncode:
                raise LabError(f"{shlex.join(cmd)} failed", apt_log)
    log(f"packages installed in {_since(t0)}")


# --------------------------------------------------------------------------- state


def load_state(s: Settings) -> dict | None:
    try:
        return json.loads(s.state_file.read_text())
    except (OSError, ValueError):
        return None


def state_nodes(state: dict | None) -> list[Node]:
    return [Node(*row) for row in (state or {}).get("nodes", [])]


def owned_pid(pidfile: Path, program: str, marker: str) -> int | None:
    """The PID in ``pidfile``, but only if it still is *our* daemon: its executable is
    ``program`` and its command line names ``marker`` (our config or socket path).

    A stale pid file whose PID was reused by an unrelated process must never make us skip a
    start or, worse, signal a stranger.  (This checks the PID we were given; it never looks
    processes up by name.)
    """
    pid = read_pid(pidfile)
    if pid is None:
        return None
    try:
        exe = os.path.basename(os.readlink(f"/proc/{pid}/exe"))
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            args = f.read().split(b"\0")
    except OSError:
        return None
    # Debian installs the real binaries as e.g. /usr/sbin/slurmd-wlm (via alternatives), and
    # an upgraded package leaves "slurmd-wlm (deleted)" behind a running daemon.
    exe = exe.split(" ")[0]
    if exe != program and not exe.startswith(program + "-"):
        return None
    return pid if marker.encode() in args else None


def ctld_pid(s: Settings) -> int | None:
    return owned_pid(s.pid_dir / "slurmctld.pid", "slurmctld", str(s.conf))


def munged_pid(s: Settings) -> int | None:
    return owned_pid(s.munge_dir / "munged.pid", "munged", f"--socket={s.munge_socket}")


def slurmd_pid(s: Settings, node: str) -> int | None:
    return owned_pid(s.slurmd_pidfile(node), "slurmd", str(s.conf))


# --------------------------------------------------------------------------- files


def write_files(s: Settings, files: dict[str, str], layout: list[Node]) -> None:
    s.etc.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (s.etc / name).write_text(text)
    for node in layout:
        for i, dev in enumerate(gpu_device_paths(s, node)):
            dev.parent.mkdir(parents=True, exist_ok=True)
            if not dev.exists():
                try:
                    os.mknod(dev, 0o666 | stat.S_IFCHR, os.makedev(NVIDIA_MAJOR, i))
                except PermissionError:
                    dev.touch()  # still schedules; slurmd merely warns that it is no device


def link_etc_slurm(s: Settings) -> None:
    """Let plain `sbatch` (without SLURM_CONF) find the lab, but never replace a real config."""
    os.makedirs("/etc/slurm", exist_ok=True)
    for name in ("slurm.conf", "gres.conf", "cgroup.conf"):
        link, target = Path("/etc/slurm") / name, s.etc / name
        if os.path.islink(link) and os.readlink(link) == str(target):
            continue
        if os.path.lexists(link):
            log(f"note: {link} exists and is not ours; clients need SLURM_CONF={s.conf}")
            continue
        os.symlink(target, link)


def unlink_etc_slurm(s: Settings) -> None:
    for name in ("slurm.conf", "gres.conf", "cgroup.conf"):
        link = Path("/etc/slurm") / name
        if os.path.islink(link) and os.readlink(link) == str(s.etc / name):
            link.unlink()


def rewrite_hosts(transform: Callable[[str], str], path: str = "/etc/hosts") -> None:
    """Rewrite /etc/hosts *in place* (same inode): it may be a bind mount that cannot be
    replaced by rename, and nodes in other mount namespaces must see the same file."""
    with open(os.open(path, os.O_RDWR | os.O_CREAT, 0o644), "r+") as f:
        old = f.read()
        new = transform(old)
        if new != old:
            f.seek(0)
            f.write(new)
            f.truncate()


def make_dirs(s: Settings, layout: list[Node]) -> None:
    for d in (s.lab_dir, s.etc, s.log_dir, s.pid_dir, s.lab_dir / "state" / "ctld", s.shared_dir):
        d.mkdir(parents=True, exist_ok=True)
    os.chmod(s.lab_dir, 0o755)
    s.munge_dir.mkdir(exist_ok=True)
    os.chmod(s.munge_dir, 0o755)  # munged refuses a socket dir that others cannot traverse
    for node in layout:
        (s.lab_dir / "state" / "spool" / node.name).mkdir(parents=True, exist_ok=True)
        for src, _ in private_mounts(s, node.name):
            src.mkdir(parents=True, exist_ok=True)
            os.chmod(src, 0o1777)  # like the real /tmp: world-writable, sticky


# --------------------------------------------------------------------------- network


def net_up(s: Settings, layout: list[Node]) -> None:
    def ip(*args: str) -> None:
        _run(["ip", *args])

    if not Path(f"/sys/class/net/{s.bridge}").exists():
        ip("link", "add", s.bridge, "type", "bridge")
    ip("addr", "replace", f"{s.ctl_ip}/24", "dev", s.bridge)
    ip("link", "set", s.bridge, "up")
    for k, node in enumerate(layout, start=1):
        ns, veth = s.netns(node.name), s.veth(k)
        if not Path(f"/run/netns/{ns}").exists():
            ip("netns", "add", ns)
        if not Path(f"/sys/class/net/{veth}").exists():
            ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
        ip("link", "set", veth, "master", s.bridge, "up")
        ip("-n", ns, "addr", "replace", f"{node.ip}/24", "dev", "eth0")
        ip("-n", ns, "link", "set", "lo", "up")
        ip("-n", ns, "link", "set", "eth0", "up")
        # Deliberately no default route: a node can reach its peers and the host, nothing else.


def net_intact(s: Settings, layout: list[Node]) -> bool:
    return Path(f"/sys/class/net/{s.bridge}").exists() and all(
        Path(f"/run/netns/{s.netns(n.name)}").exists() for n in layout
    )


def netns_pids(ns: str) -> list[int]:
    if not Path(f"/run/netns/{ns}").exists():
        return []
    cp = _run(["ip", "netns", "pids", ns], check=False)
    return [int(p) for p in cp.stdout.split() if p.isdigit()]


def net_down(s: Settings, layout: list[Node]) -> None:
    # Only the namespaces named in our own state file: other netns on the machine are not ours.
    for node in layout:
        ns = s.netns(node.name)
        if Path(f"/run/netns/{ns}").exists():
            _run(["ip", "netns", "del", ns], check=False)  # also destroys the veth pair
    if Path(f"/sys/class/net/{s.bridge}").exists():
        _run(["ip", "link", "del", s.bridge], check=False)


# --------------------------------------------------------------------------- daemons


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
        ["munged", f"--socket={s.munge_socket}", f"--key-file={key}",
         f"--pid-file={s.munge_dir / 'munged.pid'}", f"--seed-file={s.munge_dir / 'munged.seed'}",
         f"--log-file={log_file}", "--num-threads=4"],
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
    boot = f"echo {CTL_HOSTNAME} > /proc/sys/kernel/hostname && exec slurmctld -f {shlex.quote(str(s.conf))}"
    _start_daemon("slurmctld", ["unshare", "--uts", "sh", "-c", boot], daemon_env(s), log_file)
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


# --------------------------------------------------------------------------- stopping


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


def control_pids(s: Settings) -> set[int]:
    """munged, slurmctld and slurmctld's helper (slurmscriptd), from our pid files."""
    pids = {p for p in (munged_pid(s), ctld_pid(s)) if pid_alive(p)}
    ctld = ctld_pid(s)
    if pid_alive(ctld):
        pids.update(children_of(ctld))
    pids.discard(os.getpid())
    return {p for p in pids if pid_alive(p)}


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


# --------------------------------------------------------------------------- public API


def require_root() -> None:
    if os.geteuid() != 0:
        raise LabError("the Slurm lab must run as root (namespaces, bridge, /etc/hosts)")


def lab_dir() -> Path:
    return settings_from_env().lab_dir


def slurm_conf_path() -> Path:
    return settings_from_env().conf


def _other_lab_dirs(s: Settings) -> list[str]:
    """Lab dirs named by the markers of other labs in /etc/hosts."""
    try:
        text = Path("/etc/hosts").read_text()
    except OSError:
        return []
    found = []
    for line in text.splitlines():
        if line.startswith("# >>> elastic-ray-lab "):
            where = line[len("# >>> elastic-ray-lab "):].rstrip(" >")
            if where != str(s.lab_dir) and where not in found:
                found.append(where)
    return found


def _running(s: Settings) -> bool:
    return load_state(s) is not None and pid_alive(ctld_pid(s))


def is_up() -> bool:
    """True when this lab's slurmctld is alive (zombie-aware) and its layout is recorded."""
    try:
        return _running(settings_from_env())
    except LabError:
        return False


def nodes() -> list[Node]:
    """The running lab's nodes as (name, ip, partition, gres) tuples; [] when it is down."""
    s = settings_from_env()
    return state_nodes(load_state(s)) if _running(s) else []


def up(n: int = DEFAULT_NODES) -> LabInfo:
    """Bring up an n-node lab, or repair the running one if it has the same layout."""
    t0 = time.monotonic()
    s = settings_from_env()
    require_root()
    for note in s.notes:
        log(note)
    s.log_dir.mkdir(parents=True, exist_ok=True)
    ensure_packages(s)

    layout = compute_layout(n, s.subnet)
    proctrack = choose_proctrack(Path("/proc/mounts").read_text())
    files = {
        "slurm.conf": render_slurm_conf(s, layout, proctrack),
        "gres.conf": render_gres_conf(s, layout),
        "cgroup.conf": render_cgroup_conf(),
    }
    fp = fingerprint(files, s)
    info = LabInfo(s.lab_dir, s.conf, layout, s.private_tmp, s.shared_dir, notes=list(s.notes))

    state = load_state(s)
    if state and state.get("fingerprint") == fp and net_intact(s, layout):
        repaired = _repair(s, layout)
        info.action = "repaired" if repaired else "up"
        what = f"restarted {', '.join(repaired)}" if repaired else "nothing to do"
        log(f"up: {n} nodes already running; {what} ({_since(t0)})")
        return info

    if state is None and Path(f"/sys/class/net/{s.bridge}").exists():
        # The bridge belongs to a lab we have no record of (another checkout's
        # lab dir): taking it down would kill someone else's cluster, and a
        # second lab could not bind Slurm's fixed ports anyway.
        owners = _other_lab_dirs(s)
        raise LabError(f"bridge {s.bridge} is in use by another lab ({', '.join(owners) or 'unknown dir'}); "
                       f"stop it with ELASTIC_RAY_LAB_DIR=<that dir> integration/lab down, or reuse it by "
                       f"setting ELASTIC_RAY_LAB_DIR")
    if state is not None or Path(f"/sys/class/net/{s.bridge}").exists():
        if _running(s):
            log("up: a lab with another layout or config is running; restarting it")
        _down(s, quiet=True)

    try:
        _fresh_start(s, layout, files, fp, proctrack)
    except BaseException:
        # Leave nothing half-started behind (a munged without a controller,
        # namespaces without nodes): undo, then report the original error.
        try:
            _down(s, quiet=True)
        except Exception as exc:  # noqa: BLE001 - the first error is the one to report
            log(f"up: cleanup after the failed start also failed: {exc}")
        raise
    info.action = "started"
    log(f"up: {n} nodes in {_since(t0)} (proctrack/{proctrack}, private tmp "
        f"{'on' if s.private_tmp else 'off'})")
    return info


def _fresh_start(s: Settings, layout: list[Node], files: dict[str, str], fp: str,
                 proctrack: str) -> None:
    # A fresh cluster forgets old jobs and node dirs, but keeps the munge key and the logs
    # (truncated, so that errors in them belong to this run).
    for sub in ("state", "pid", "nodes", "dev", "etc", "shared"):
        shutil.rmtree(s.lab_dir / sub, ignore_errors=True)
    make_dirs(s, layout)
    for logf in s.log_dir.glob("*.log"):
        if logf.name != "apt.log":
            logf.write_text("")
    write_files(s, files, layout)
    # Written before anything is created, so that `down` can always find what to remove,
    # even if the knobs in the environment have changed since.
    s.state_file.write_text(json.dumps(
        {"fingerprint": fp, "bridge": s.bridge, "subnet": s.subnet, "proctrack": proctrack,
         "private_tmp": s.private_tmp, "nodes": [list(n) for n in layout]}, indent=1) + "\n")
    link_etc_slurm(s)
    block = render_hosts_block(s.hosts_tag, s.ctl_ip, layout)
    rewrite_hosts(lambda text: with_hosts_block(text, s.hosts_tag, block))
    net_up(s, layout)
    start_munged(s)
    start_slurmctld(s)
    for node in layout:
        start_slurmd(s, node)
    wait_nodes(s, [n.name for n in layout], lambda st: st == "idle", "idle")


def _repair(s: Settings, layout: list[Node]) -> list[str]:
    """Restart whatever died (munged, slurmctld, single slurmds) without touching jobs.

    slurmctld recovers its jobs from StateSaveLocation, and a restarted slurmd reattaches to
    the slurmstepds of running jobs through its spool dir.
    """
    make_dirs(s, layout)
    link_etc_slurm(s)
    block = render_hosts_block(s.hosts_tag, s.ctl_ip, layout)
    rewrite_hosts(lambda text: with_hosts_block(text, s.hosts_tag, block))
    restarted = []
    if start_munged(s):
        restarted.append("munged")
    ctld_restarted = start_slurmctld(s)
    if ctld_restarted:
        restarted.append("slurmctld")
    nodes_restarted = [n.name for n in layout if start_slurmd(s, n)]
    restarted += [f"slurmd@{n}" for n in nodes_restarted]
    # Nodes may be running jobs, so "idle" is too strict: wait until the restarted ones respond
    # (all of them after a slurmctld restart: it recovers every node as "unk" until it
    # re-registers).  A trailing '*' means "not responding"; an admin's plain "down" stays.
    to_wait = [n.name for n in layout] if ctld_restarted else nodes_restarted
    wait_nodes(s, to_wait, lambda st: not st.endswith("*") and st not in ("unk", "missing"),
               "responding")
    return restarted


def down() -> None:
    """Stop everything this lab started and remove its traces; harmless when already down."""
    s = settings_from_env()
    require_root()
    _down(s)


def _down(s: Settings, quiet: bool = False) -> None:
    t0 = time.monotonic()
    state = load_state(s) or {}
    layout = state_nodes(state)
    # Names of netns/bridge come from what was actually brought up, not from today's knobs.
    s = dataclasses.replace(s, bridge=state.get("bridge", s.bridge))
    # Nodes first, while slurmctld and munged still answer: a slurmd that is cleaning up a job
    # keeps retrying to report to a vanished controller for MessageTimeout (10 s).
    pids, slurmds = node_pids(s, layout)
    left = stop_pids(pids, slurmds) if pids else set()
    ctl = control_pids(s)
    left |= stop_pids(ctl, ctl) if ctl else set()
    pids |= ctl
    net_down(s, layout)
    if os.path.exists("/etc/hosts"):
        rewrite_hosts(lambda text: strip_hosts_block(text, s.hosts_tag))
    remove_cgroups(layout)
    unlink_etc_slurm(s)
    for sub in ("state", "pid", "nodes", "shared"):
        shutil.rmtree(s.lab_dir / sub, ignore_errors=True)
    (s.munge_dir / "munged.pid").unlink(missing_ok=True)  # the key stays, the PID is history
    if left:
        raise LabError(f"down: processes still alive after SIGKILL: {sorted(left)}")
    if not quiet:
        log(f"down: stopped {len(pids)} processes in {_since(t0)} (logs kept in {s.log_dir})")


# --------------------------------------------------------------------------- CLI


def _print_layout(s: Settings) -> None:
    cp = subprocess.run(["sinfo", "-o", "%10P %5D %6t %5c %8m %14G %N"], capture_output=True,
                        text=True, env=daemon_env(s), stdin=subprocess.DEVNULL, timeout=30)
    sys.stdout.write(cp.stdout)


def _status(s: Settings) -> int:
    if not _running(s):
        print(f"lab: DOWN ({s.lab_dir})")
        return EXIT_DOWN
    layout = state_nodes(load_state(s))
    print(f"lab: UP ({s.lab_dir}, {len(layout)} nodes, SLURM_CONF={s.conf})")
    _print_layout(s)
    env = daemon_env(s)
    cp = subprocess.run(["squeue", "-o", "%.8i %.9P %.16j %.9T %.10M %.5D %R"], capture_output=True,
                        text=True, env=env, stdin=subprocess.DEVNULL, timeout=30)
    sys.stdout.write(cp.stdout)
    daemons = {"munged": munged_pid(s), "slurmctld": ctld_pid(s)}
    daemons.update({f"slurmd@{n.name}": slurmd_pid(s, n.name) for n in layout})
    for name, pid in daemons.items():
        print(f"  {name:18} pid {pid or '-':>7}  {'alive' if pid_alive(pid) else 'DEAD'}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="lab", description="elastic-ray's multi-node Slurm lab")
    sub = parser.add_subparsers(dest="cmd", required=True)
    p_up = sub.add_parser("up", help="start or repair an N-node lab")
    p_up.add_argument("n", nargs="?", type=int, default=DEFAULT_NODES)
    sub.add_parser("down", help="stop the lab and remove its traces")
    sub.add_parser("status", help="exit 0 when up, 3 when down")
    sub.add_parser("env", help="print the export SLURM_CONF=... line")
    args = parser.parse_args(argv)
    try:
        s = settings_from_env()
        if args.cmd == "up":
            info = up(args.n)
            _print_layout(s)
            print(info.export_line)
        elif args.cmd == "down":
            down()
        elif args.cmd == "status":
            return _status(s)
        elif args.cmd == "env":
            print(f"export SLURM_CONF={shlex.quote(str(s.conf))}")
        return 0
    except LabError as e:
        hint = f" (see {e.log_file})" if e.log_file and str(e.log_file) not in str(e) else ""
        log(f"ERROR: {e}{hint}")
        return 1
    except BrokenPipeError:  # e.g. `lab status | head`: the reader left, nothing to report
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
