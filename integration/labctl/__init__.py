"""A real multi-node Slurm lab (22.05, or 24.11 from a Debian 13 root) on one Linux machine, for elastic-ray's integration tests.

Every compute node is a genuine ``slurmd``.  Each one lives in three namespaces of its own:

* a network namespace, joined to a private bridge by a veth pair, with its own IP and *no*
  default route (nothing inside a node can reach anything but the bridge subnet);
* a UTS namespace, so ``hostname`` inside a job prints the node name;
* a mount namespace in which /tmp, /var/tmp and /dev/shm are per-node directories of the lab
  dir (the rest of the filesystem is shared, like NFS home/project dirs on a real cluster).

``slurmctld`` runs on the host network (it owns the bridge address, ``.1``) in its own UTS
namespace whose hostname is ``slurmctl``, so the config never depends on the machine's name.
A private ``munged`` (own key and socket under the lab dir) authenticates everything.
Job accounting is on by default: the lab runs its own ``mariadbd`` (datadir and unix socket
under the lab dir, no TCP) and a ``slurmdbd`` that slurmctld reports to, so ``sacct`` answers.

Commands (``integration/lab`` is a thin wrapper around :func:`main`)::

    lab up [N] [--slurm 22.05|24.11] [--limits]
                  start, or repair, an N-node lab (default 4); idempotent
    lab down      stop what this lab started and remove its netns/bridge/hosts block
    lab status    exit 0 when up, 3 when down
    lab env       print the ``export SLURM_CONF=...`` line (and PATH for 24.11)

Environment knobs (read by :func:`config.settings_from_env`):

    ELASTIC_RAY_LAB_DIR          state/config/log dir; absolute       [<repo>/.lab]
    ELASTIC_RAY_LAB_SUBNET       first three octets of the /24        [10.78.0]
                                 (host and controller .1, node k at .(10+k))
    ELASTIC_RAY_LAB_BRIDGE       bridge name, at most 11 characters   [erlab0]
    ELASTIC_RAY_LAB_PRIVATE_TMP  1|0: per-node /tmp, /var/tmp, /dev/shm   [1]
                                 Forced to 0 (with a note) when the repo or the python that
                                 runs jobs lives under one of those dirs: nodes could not see it.
    ELASTIC_RAY_LAB_PYTHON_PREFIX  sys.prefix of the python that will run jobs   [sys.prefix]
    ELASTIC_RAY_LAB_ACCOUNTING   1|0: mariadbd + slurmdbd, sacct answers  [1]
                                 0: AccountingStorageType=accounting_storage/none, as before.
    ELASTIC_RAY_LAB_SLURM        22.05|24.11: the Slurm the lab runs   [22.05]
                                 22.05: the host's Debian 12 packages.  24.11: Debian 13's, from a
                                 debootstrapped root (built once, ~2 min) whose /usr replaces the
                                 host's in a private mount namespace of every lab daemon (and so of
                                 every job); the host calls 24.11's clients through wrappers in
                                 LAB/bin, first on PATH (22.05 clients cannot talk to 24.11).
    ELASTIC_RAY_LAB_LIMITS       1|0: enforce each job's memory (TaskPlugin=task/cgroup,
                                 ConstrainRAMSpace) as most clusters do   [0]
    ELASTIC_RAY_LAB_SLURM_ROOT   where that root is built and kept
                                 [/var/cache/elastic-ray-lab/trixie-slurm-24.11]

Python API for tests: :func:`up`, :func:`down`, :func:`is_up`, :func:`slurm_conf_path`,
:func:`nodes`, :func:`lab_dir`.  Must run as root.  Standard library only: integration/lab
runs it with the system python3, outside any virtualenv.

One module per job, so that what the lab *is* can be checked without root
(tests/test_lab_config.py) and what it *does* stays in thin shells around it:

    config     the knobs, the node layout and every file the lab writes, as text (pure)
    report     the one-line progress log on stderr
    procs      pid files, liveness, short commands, self-daemonizing starts, stopping by PID
    packages   the Debian packages the lab needs (apt)
    files      the lab dir, the rendered configs on disk, fake GPU devices, /etc/slurm links
    net        the bridge, one network namespace and veth pair per node, /etc/hosts in place
    daemons    munged, slurmctld, the slurmds, node states, the lab's processes, cgroups
    accounting mariadbd and slurmdbd, the cluster registered in them
    lifecycle  the state file, up (fresh start or repair), down, is_up, nodes
    users      the two ordinary users (erlab-alice, erlab-bob) tests act as
    cli        ``lab up|down|status|env``

Every name of the single module this package was (``integration/labctl.py``) is re-exported
here, so ``from integration import labctl`` then ``labctl.up(4)``, ``labctl.slurmd_pid(...)``
or ``labctl.DEFAULT_NODES`` work as before.  Names with a leading underscore are shared
between the package's modules only.
"""

from __future__ import annotations

from .cli import EXIT_DOWN, main
from .config import (
    SLURM_VERSIONS,
    daemon_argv,
    export_lines,
    render_client_wrapper,
    usr_swap_lines,
    ACCT_DB,
    CLUSTER,
    CPUS_PER_NODE,
    CTL_HOSTNAME,
    DBD_PORT,
    DEFAULT_NODES,
    MEM_PER_NODE,
    NVIDIA_MAJOR,
    PARTITION_GRES,
    PARTITIONS,
    PRIVATE_DIRS,
    REPO,
    LabError,
    LabInfo,
    Node,
    Settings,
    choose_proctrack,
    compute_layout,
    fingerprint,
    gpu_device_paths,
    hosts_markers,
    is_under,
    node_boot_script,
    parse_gres,
    private_mounts,
    render_cgroup_conf,
    render_gres_conf,
    render_hosts_block,
    render_slurm_conf,
    render_slurmdbd_conf,
    settings_from_env,
    strip_hosts_block,
    with_hosts_block,
)
from .accounting import (
    DB_TIMEOUT,
    accounting_pids,
    clusters,
    dbd_env,
    mariadbd_pid,
    slurmdbd_pid,
    start_mariadb,
    start_slurmdbd,
)
from .daemons import (
    CTLD_TIMEOUT,
    IDLE_TIMEOUT,
    control_pids,
    ctld_answers,
    ctld_pid,
    ctld_pids,
    daemon_env,
    munged_pid,
    node_pids,
    node_states,
    remove_cgroups,
    slurmd_pid,
    start_munged,
    start_slurmctld,
    start_slurmd,
    wait_nodes,
)
from .files import link_etc_slurm, make_dirs, unlink_etc_slurm, write_client_wrappers, write_files
from .lifecycle import (down, is_up, lab_dir, load_state, nodes, require_root, running_settings, slurm_conf_path,
                        state_nodes, up)
from .net import net_down, net_intact, net_up, netns_pids, rewrite_hosts
from .packages import ACCOUNTING_PACKAGES, PACKAGES, ensure_packages, ensure_root, missing_packages, root_ready
from .procs import STEP_SETTLE, TERM_GRACE, children_of, owned_pid, pid_alive, poll_until, read_pid, stop_pids
from .report import log
from .users import LAB_USERS, ensure_users, missing_users

__all__ = [
    # config
    "ACCT_DB", "CLUSTER", "CPUS_PER_NODE", "CTL_HOSTNAME", "DBD_PORT", "DEFAULT_NODES", "MEM_PER_NODE",
    "NVIDIA_MAJOR", "PARTITION_GRES",
    "PARTITIONS", "PRIVATE_DIRS", "REPO", "LabError", "LabInfo", "Node", "Settings", "choose_proctrack",
    "compute_layout", "fingerprint", "gpu_device_paths", "hosts_markers", "is_under", "node_boot_script",
    "parse_gres", "private_mounts", "render_cgroup_conf", "render_gres_conf", "render_hosts_block",
    "render_slurm_conf", "render_slurmdbd_conf", "settings_from_env", "strip_hosts_block", "with_hosts_block",
    "SLURM_VERSIONS", "daemon_argv", "export_lines", "render_client_wrapper", "usr_swap_lines",
    # report, procs, packages, files, net
    "log",
    "STEP_SETTLE", "TERM_GRACE", "children_of", "owned_pid", "pid_alive", "poll_until", "read_pid", "stop_pids",
    "ACCOUNTING_PACKAGES", "PACKAGES", "ensure_packages", "ensure_root", "missing_packages", "root_ready",
    "link_etc_slurm", "make_dirs", "unlink_etc_slurm", "write_client_wrappers", "write_files",
    "net_down", "net_intact", "net_up", "netns_pids", "rewrite_hosts",
    # daemons
    "CTLD_TIMEOUT", "IDLE_TIMEOUT", "control_pids", "ctld_answers", "ctld_pid", "ctld_pids", "daemon_env", "munged_pid",
    "node_pids", "node_states", "remove_cgroups", "slurmd_pid", "start_munged", "start_slurmctld",
    "start_slurmd", "wait_nodes",
    # accounting
    "DB_TIMEOUT", "accounting_pids", "clusters", "dbd_env", "mariadbd_pid", "slurmdbd_pid", "start_mariadb",
    "start_slurmdbd",
    # lifecycle, cli
    "down", "is_up", "lab_dir", "load_state", "nodes", "require_root", "running_settings", "slurm_conf_path",
    "state_nodes", "up",
    "EXIT_DOWN", "main",
    # users
    "LAB_USERS", "ensure_users", "missing_users",
]
