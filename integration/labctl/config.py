"""What the lab is, decided before anything starts: the knobs, the layout, every file as text.

``settings_from_env`` reads the ``ELASTIC_RAY_LAB_*`` knobs (listed in the package's docstring,
``integration/labctl/__init__.py``) from the mapping it is given; the rest renders slurm.conf,
gres.conf, cgroup.conf, slurmdbd.conf, the /etc/hosts block, a node's boot script and the
accounting database's command lines from those settings.

Pure on purpose: nothing here starts, writes, signals or installs anything (it only reads the
environment mapping and resolves paths), so tests/test_lab_config.py checks it without root
and without a lab, and the effects stay in the modules that call it.
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, NamedTuple

REPO = Path(__file__).resolve().parents[2]  # integration/labctl/config.py -> the repository

CTL_HOSTNAME = "slurmctl"
CPUS_PER_NODE = 4  # fake, accepted thanks to SlurmdParameters=config_overrides
MEM_PER_NODE = 8192  # MB, fake as well
DEFAULT_NODES = 4
PARTITIONS = ("cpu", "gpu-a", "gpu-b")  # round-robin order; "cpu" is the default partition
PARTITION_GRES = {"cpu": None, "gpu-a": "gpu:a40:4", "gpu-b": "gpu:h100:2"}
NVIDIA_MAJOR = 195  # fake GPUs are char devices with NVIDIA's major number; never opened
PRIVATE_DIRS = ("/tmp", "/var/tmp", "/dev/shm")
CLUSTER = "erlab"  # ClusterName, and the cluster registered in slurmdbd
DBD_PORT = 6819  # slurmdbd's default port; slurmctld and every client reach it at the controller's address
ACCT_DB = "slurm_acct_db"
#: Slurm versions the lab can run: the host's Debian 12 packages (the default), or Debian 13's
#: from a debootstrapped root whose /usr replaces the host's for every lab process (issue 25).
SLURM_VERSIONS = ("22.05", "24.11")
DEFAULT_SLURM = "22.05"
#: Where the Debian 13 root with Slurm 24.11 is built once and kept (outside any checkout, so
#: clones share it; `lab down` leaves it).
DEFAULT_SLURM_ROOT = Path("/var/cache/elastic-ray-lab/trixie-slurm-24.11")
#: The client commands the lab's bin/ wraps for 24.11 (host code calls them by bare name).
CLIENTS = ("sbatch", "squeue", "scancel", "scontrol", "sacct", "sacctmgr", "srun", "sinfo", "salloc",
           "sattach", "sstat", "sprio", "sshare")


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
    accounting: bool = True  # slurmdbd + the lab's own MariaDB (ELASTIC_RAY_LAB_ACCOUNTING)
    slurm: str = DEFAULT_SLURM  # ELASTIC_RAY_LAB_SLURM: one of SLURM_VERSIONS
    slurm_root: Path = DEFAULT_SLURM_ROOT  # ELASTIC_RAY_LAB_SLURM_ROOT: the 24.11 root (unused for 22.05)
    limits: bool = False  # ELASTIC_RAY_LAB_LIMITS: task/cgroup with each job's memory enforced

    @property
    def swaps_usr(self) -> bool:
        """True when every lab process runs with the 24.11 root's /usr over the host's."""
        return self.slurm != DEFAULT_SLURM

    @property
    def bin_dir(self) -> Path:
        # Wrappers of the client commands (24.11 only): first on the PATH of the lab's own
        # calls, the tests and `lab env`.
        return self.lab_dir / "bin"

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

    @property
    def dbd_conf(self) -> Path:
        # slurmdbd has no -f: it reads slurmdbd.conf from the directory of $SLURM_CONF.
        return self.etc / "slurmdbd.conf"

    @property
    def db_dir(self) -> Path:
        # Under state/: a fresh lab starts with an empty database, as its job ids start at 1 again.
        return self.lab_dir / "state" / "mariadb"

    @property
    def db_socket(self) -> Path:
        return self.db_dir / "mariadb.sock"

    @property
    def db_pidfile(self) -> Path:
        return self.pid_dir / "mariadbd.pid"

    @property
    def dbd_pidfile(self) -> Path:
        return self.pid_dir / "slurmdbd.pid"

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
    slurm: str = DEFAULT_SLURM
    bin_dir: Path | None = None  # 24.11: the wrapped clients, first on PATH

    @property
    def export_line(self) -> str:
        return export_lines(self.conf, self.bin_dir)


def export_lines(conf: Path, bin_dir: Path | None) -> str:
    """What a shell needs to use the lab: SLURM_CONF, and for 24.11 the clients' bin/ first on PATH."""
    line = f"export SLURM_CONF={shlex.quote(str(conf))}"
    return line if bin_dir is None else line + f"\nexport PATH={shlex.quote(str(bin_dir))}:\"$PATH\""


def is_under(path: str | os.PathLike, parents: Iterable[str]) -> bool:
    """True if ``path`` is one of ``parents`` or inside one of them (after resolving links)."""
    p = os.path.realpath(path)
    for parent in parents:
        parent = os.path.realpath(parent)
        if p == parent or p.startswith(parent.rstrip("/") + "/"):
            return True
    return False


def settings_from_env(env: dict[str, str] | None = None) -> Settings:
    """Read and validate the ELASTIC_RAY_LAB_* knobs (listed in the package's docstring)."""
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
    raw_acct = env.get("ELASTIC_RAY_LAB_ACCOUNTING", "1")
    if raw_acct not in ("0", "1"):
        raise LabError(f"ELASTIC_RAY_LAB_ACCOUNTING must be 0 or 1, got {raw_acct!r}")
    slurm = env.get("ELASTIC_RAY_LAB_SLURM") or DEFAULT_SLURM
    if slurm not in SLURM_VERSIONS:
        raise LabError(f"ELASTIC_RAY_LAB_SLURM must be one of {', '.join(SLURM_VERSIONS)}, got {slurm!r}")
    root = env.get("ELASTIC_RAY_LAB_SLURM_ROOT") or str(DEFAULT_SLURM_ROOT)
    if not os.path.isabs(root) or os.path.normpath(root) == "/":
        raise LabError(f"ELASTIC_RAY_LAB_SLURM_ROOT must be an absolute directory other than /, got {root!r}")
    if slurm != DEFAULT_SLURM and is_under(root, PRIVATE_DIRS):
        raise LabError(f"ELASTIC_RAY_LAB_SLURM_ROOT={root} is under /tmp, /var/tmp or /dev/shm, which nodes "
                       "replace with their own; choose another dir")
    raw_limits = env.get("ELASTIC_RAY_LAB_LIMITS", "0")
    if raw_limits not in ("0", "1"):
        raise LabError(f"ELASTIC_RAY_LAB_LIMITS must be 0 or 1, got {raw_limits!r}")
    return Settings(Path(lab_dir), subnet, bridge, private_tmp, tuple(notes), raw_acct == "1", slurm,
                    Path(os.path.normpath(root)), raw_limits == "1")


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


def has_v1_controller(mounts_text: str, controller: str) -> bool:
    """A cgroup v1 hierarchy with ``controller`` is mounted (``/proc/mounts`` text)."""
    return any(len(f := line.split()) >= 4 and f[2] == "cgroup" and controller in f[3].split(",")
               for line in mounts_text.splitlines())


def render_slurm_conf(s: Settings, layout: list[Node], proctrack: str) -> str:
    lab = s.lab_dir
    lines = [
        # This line still names the module labctl was before it became a package: the text is
        # part of the fingerprint, and a new one would make the next `up` restart a running lab
        # of the same layout (instead of repairing it) once.
        "# Generated by integration/labctl.py -- edits are lost on the next `lab up`.",
        f"ClusterName={CLUSTER}",
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
        # The 4 CPUs / 8 GB per node are fiction, so nothing may be pinned or constrained ...
        # 24.11 ships no task/none plugin: leaving TaskPlugin unset is the same there.
        # ... unless the lab enforces limits (ELASTIC_RAY_LAB_LIMITS): then each job's memory
        # (its --mem, not the fictional 8 GB) is a cgroup limit, as on most real clusters.
        *(["TaskPlugin=task/cgroup"] if s.limits else ["TaskPlugin=task/none"] if not s.swaps_usr else []),
        *accounting_lines(s),
        # The plain record of every job's end, kept next to the logs (with or without accounting).
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


def accounting_lines(s: Settings) -> list[str]:
    if not s.accounting:
        return ["AccountingStorageType=accounting_storage/none", "JobAcctGatherType=jobacct_gather/none"]
    return [
        "AccountingStorageType=accounting_storage/slurmdbd",
        # slurmctl resolves to the bridge address (the /etc/hosts block): reachable from the host
        # and from inside every node, so sacct works in a job too.
        f"AccountingStorageHost={CTL_HOSTNAME}",
        f"AccountingStoragePort={DBD_PORT}",
        # Not a password with munge: the munged socket for talking to slurmdbd (AuthInfo is not
        # used for that), so it is our munged again and not the system's default socket.
        f"AccountingStoragePass={s.munge_socket}",
        # GPUs are not accounted by default: without this AllocTRES names no gres/gpu.
        "AccountingStorageTRES=gres/gpu",
        # Reads /proc; cgroup would need the cgroup plugin, which proctrack/linuxproc labs lack.
        "JobAcctGatherType=jobacct_gather/linux",
    ]


def render_slurmdbd_conf(s: Settings) -> str:
    """slurmdbd.conf: the same munged, root as SlurmUser (as slurm.conf), MariaDB over its socket.

    StorageHost=localhost makes the MySQL client library use a unix socket; which one comes from
    $MYSQL_UNIX_PORT in slurmdbd's environment (daemons.py), as slurmdbd has no socket option.
    The database lets root in by socket credentials, so the file holds no password.
    """
    return "\n".join([
        "# Generated by integration/labctl -- edits are lost on the next `lab up`.",
        "AuthType=auth/munge",
        f"AuthInfo=socket={s.munge_socket}",
        # "localhost" passes slurmdbd's check that DbdHost names the machine it runs on; it still
        # listens on every address, so slurmctld reaches it at the controller's.
        "DbdHost=localhost",
        f"DbdPort={DBD_PORT}",
        "SlurmUser=root",
        f"LogFile={s.log_dir}/slurmdbd.log",
        f"PidFile={s.dbd_pidfile}",
        "DebugLevel=info",
        "StorageType=accounting_storage/mysql",
        "StorageHost=localhost",
        "StorageUser=root",
        f"StorageLoc={ACCT_DB}",
    ]) + "\n"


def mariadb_options(s: Settings) -> list[str]:
    """The options both mariadb-install-db and mariadbd get: none of the machine's my.cnf files,
    our datadir, a unix socket only (no TCP at all), and small buffers."""
    return [
        "--no-defaults",
        f"--datadir={s.db_dir / 'data'}",
        f"--socket={s.db_socket}",
        "--user=root",
        "--skip-networking",
        # Small on purpose: the lab's database holds a few hundred jobs.  slurmdbd logs once, at
        # its start, that the buffer pool is below what it recommends for a real site; harmless.
        "--innodb-buffer-pool-size=16M",
        "--innodb-log-file-size=32M",
        "--innodb-log-buffer-size=2M",
        "--innodb-lock-wait-timeout=900",
        # MyISAM/Aria caches the Slurm tables (InnoDB) never use: 128M each by default.
        "--key-buffer-size=1M",
        "--aria-pagecache-buffer-size=1M",
        "--query-cache-size=0",
    ]


def mariadb_install_argv(s: Settings) -> list[str]:
    return ["mariadb-install-db", *mariadb_options(s), "--auth-root-authentication-method=socket",
            "--skip-test-db"]


def mariadbd_argv(s: Settings) -> list[str]:
    return ["mariadbd", *mariadb_options(s), f"--pid-file={s.db_pidfile}",
            f"--log-error={s.log_dir / 'mariadbd.log'}", "--skip-name-resolve", "--performance-schema=off"]


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


def render_cgroup_conf(slurm: str = DEFAULT_SLURM, limits: bool = False) -> str:
    # Only read with proctrack/cgroup, and only for tracking: constraining the fake resources
    # would break jobs.  cgroup/v2 in 22.05 wants systemd, which this machine may not have.
    # 24.11 calls CgroupAutomount defunct (an error line at every start): left out there.
    # With ``limits`` (task/cgroup) a job's memory is enforced: RAM at its --mem, and no swap
    # beyond it. Cores stay unconstrained: the nodes' 4 CPUs are fiction on a 2-core machine,
    # and a cpuset of CPUs that do not exist would fail every step.
    return "\n".join(
        [
            "CgroupPlugin=cgroup/v1",
            *(["CgroupAutomount=no"] if slurm == DEFAULT_SLURM else []),
            "ConstrainCores=no",
            *(["ConstrainRAMSpace=yes", "AllowedRAMSpace=100", "ConstrainSwapSpace=yes", "AllowedSwapSpace=0"]
              if limits else ["ConstrainRAMSpace=no"]),
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
    cmds = ["set -e", *usr_swap_lines(s), f"echo {q(node.name)} > /proc/sys/kernel/hostname"]
    if s.private_tmp:
        for src, dst in private_mounts(s, node.name):
            cmds.append(f"mount --bind {q(str(src))} {q(dst)}")
    cmds.append(f"exec slurmd -f {q(str(s.conf))}")
    return "\n".join(cmds)


def usr_swap_lines(s: Settings) -> list[str]:
    """Shell lines that put the 24.11 root's /usr (and its loader cache) over the host's in the
    current mount namespace; none for 22.05. Both systems are usr-merged, so this one bind swaps
    glibc, Slurm and its plugins, munge and the shell tools together, while /etc (users, the lab's
    /etc/hosts block), /root, /work and the lab dir stay the host's."""
    if not s.swaps_usr:
        return []
    q = shlex.quote
    return [f"mount --bind {q(str(s.slurm_root / 'usr'))} /usr",
            f"mount --bind {q(str(s.slurm_root / 'etc' / 'ld.so.cache'))} /etc/ld.so.cache"]


def daemon_argv(s: Settings, argv: list[str], hostname: str | None = None) -> list[str]:
    """``argv`` as a lab daemon is started: with 24.11, in a private mount namespace with the
    root's /usr (``usr_swap_lines``); with ``hostname``, in a UTS namespace of its own named so.
    22.05 without a hostname: ``argv`` unchanged."""
    lines = usr_swap_lines(s)
    if hostname:
        lines.append(f"echo {shlex.quote(hostname)} > /proc/sys/kernel/hostname")
    if not lines:
        return list(argv)
    flags = (["--uts"] if hostname else []) + (["--mount", "--propagation", "private"] if s.swaps_usr else [])
    return ["unshare", *flags, "sh", "-c", " && ".join(lines) + ' && exec "$@"', "sh", *argv]


def render_client_wrapper(s: Settings) -> str:
    """bin/<client> for 24.11: the root's client in a private mount namespace with its /usr,
    keeping the caller's cwd, environment and files. Exec'd by absolute path, so a PATH that
    starts with bin/ cannot loop; where /usr already is the root's (inside a node), directly."""
    root = shlex.quote(str(s.slurm_root))
    return "\n".join([
        "#!/bin/sh",
        "# Generated by integration/labctl (Slurm 24.11 lab): run this Slurm client from the lab's root.",
        f"root={root}",
        'name=$(basename "$0")',
        '[ /usr -ef "$root/usr" ] && exec "/usr/bin/$name" "$@"',
        'exec unshare -m --propagation private sh -c \'mount --bind "$0/usr" /usr && '
        'mount --bind "$0/etc/ld.so.cache" /etc/ld.so.cache && exec "$@"\' "$root" "/usr/bin/$name" "$@"',
    ]) + "\n"


def private_mounts(s: Settings, node: str) -> list[tuple[Path, str]]:
    d = s.node_dir(node)
    return [(d / "tmp", "/tmp"), (d / "var_tmp", "/var/tmp"), (d / "shm", "/dev/shm")]


def fingerprint(files: dict[str, str], s: Settings) -> str:
    """Identity of a lab configuration: same fingerprint -> repair in place, else restart."""
    h = hashlib.sha256()
    for name in sorted(files):
        h.update(name.encode() + b"\0" + files[name].encode() + b"\0")
    h.update(f"private_tmp={s.private_tmp} bridge={s.bridge}".encode())
    if s.swaps_usr:   # 22.05's fingerprint stays what it was (a running lab is repaired, not restarted)
        h.update(f" slurm={s.slurm} root={s.slurm_root}".encode())
    return h.hexdigest()[:16]
