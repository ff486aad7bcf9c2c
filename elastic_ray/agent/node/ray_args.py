"""Which ``ray start`` command a node runs: ports, arguments and environment.

Everything here is a pure function of its inputs (the launcher, the allocation, the Slurm facts the caller
read, and a ``free_port`` callable for the ``random`` strategy), so every decision is unit-tested without Ray.
:mod:`elastic_ray.agent.node.ray_node` runs the result. The facts these choices rest on were measured with
Ray 2.60 in this sandbox (``notes/ray-in-this-sandbox.md``); the WHY of each choice is written next to it.

Ports
=====
Several Ray nodes may share one host: a worker of one allocation next to the head elected onto that node, or
workers of two jobs that Slurm packed onto one shared node. ``choose_ports`` returns the ports a node passes
explicitly; a port missing from the result is left to Ray's own default.

``random``
    Every port Ray can choose itself stays unset (node manager, object manager, dashboard agent gRPC,
    runtime-env agent) and core worker ports come from the OS (``--min-worker-port=0
    --max-worker-port=0``, as ``ray.cluster_utils`` does), so none of them can collide. The ports that cannot
    be 0, or whose default is a fixed number that collides between two nodes on one host, get
    ``free_port()`` (a free port below the kernel's ephemeral range, :mod:`.port_window`):
    the head's GCS ``--port``, ``--ray-client-server-port`` (Ray rejects 0),
    ``--dashboard-port`` and the env ``AUTOSCALER_METRIC_PORT`` / ``DASHBOARD_METRIC_PORT`` (head), and
    ``--dashboard-agent-listen-port`` on every node (default 52365 collides even between different node IPs,
    because the agent also binds 127.0.0.1). ``--metrics-export-port`` gets one too, although Ray could
    choose it: the agent must know it to read its node's GPU load (:mod:`.ray_load`).

``hash_jobid``
    A block of :data:`HASH_BLOCK_SIZE` consecutive ports, stable across
    restarts of the same job, so an operator can compute it by hand and open
    it in a firewall::

        n     = int(job_id)                  (non-numeric ids: first 8 bytes of sha256)
        pair  = n mod HASH_PAIRS             (HASH_PAIRS = 399)
        block = 2 * pair + (1 if role == "head" else 0)
        first = HASH_PORT_BASE + HASH_BLOCK_SIZE * block      (HASH_PORT_BASE = 20000)

    so ports 20000..32767 are used. Each job owns two adjacent blocks, one for
    its worker nodes and one for a head it may host, which are disjoint by
    construction; any 399 consecutive job ids (Slurm hands them out in
    sequence, and jobs that share a node at the same time are usually close in
    id) get pairwise disjoint blocks. The range ends below 32768, where
    Linux's ephemeral range starts (``ip_local_port_range`` 32768-60999 by
    default), so a port the OS hands out to some other program (or to a
    ``random`` node) can never squat on a block. Core worker ports still come
    from the OS: a node runs an open-ended number of worker processes, which
    no fixed block can size.

``fixed``
    The launcher's ``head_port`` for the head's GCS and Ray's defaults for
    everything else: one Ray node per host, so nothing can collide, and no
    worker allocation can host an elected head.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ...config import SlurmWorkerAllocationConfig
from ...config.launcher import PORT_STRATEGIES, RayLauncher
from ...ray_auth import SCRUBBED_ENV, ray_auth_env

ROLES = ("head", "worker")

# --------------------------------------------------------------------------
# Port keys: what choose_ports returns and build_ray_start consumes.

#: Port keys that become ``ray start`` options.
PORT_OPTIONS: Mapping[str, str] = {
    "gcs_port": "--port",
    "ray_client_server_port": "--ray-client-server-port",
    "dashboard_port": "--dashboard-port",
    "dashboard_agent_listen_port": "--dashboard-agent-listen-port",
    "dashboard_agent_grpc_port": "--dashboard-agent-grpc-port",
    "runtime_env_agent_port": "--runtime-env-agent-port",
    "metrics_export_port": "--metrics-export-port",
    "node_manager_port": "--node-manager-port",
    "object_manager_port": "--object-manager-port",
    "min_worker_port": "--min-worker-port",
    "max_worker_port": "--max-worker-port",
}
#: Port keys that Ray reads from the environment (head only; the autoscaler
#: monitor and the dashboard bind them on 0.0.0.0 with fixed defaults).
PORT_ENV: Mapping[str, str] = {
    "autoscaler_metric_port": "AUTOSCALER_METRIC_PORT",
    "dashboard_metric_port": "DASHBOARD_METRIC_PORT",
}
#: The agent's own control socket (not a Ray port). 0 means "bind to any free
#: port and publish it": the endpoint is written to the session directory
#: anyway; only ``hash_jobid`` pins it inside the job's block.
AGENT_CONTROL_PORT = "agent_control_port"
#: Ports only a head has; passing ``--port`` or ``--ray-client-server-port``
#: to a worker makes ``ray start`` abort.
HEAD_ONLY_PORTS = frozenset({"gcs_port", "ray_client_server_port", "dashboard_port",
                             "autoscaler_metric_port", "dashboard_metric_port"})

HASH_PORT_BASE = 20000
HASH_PORT_LIMIT = 32768          # exclusive; Linux's ephemeral range starts here
HASH_BLOCK_SIZE = 16
HASH_PAIRS = (HASH_PORT_LIMIT - HASH_PORT_BASE) // (2 * HASH_BLOCK_SIZE)   # 399
#: Offset of each port inside a node's hash block. Both roles use the same
#: layout; a worker leaves the head-only offsets unused. 12..15 are spare.
HASH_OFFSETS: Mapping[str, int] = {
    "gcs_port": 0,
    "ray_client_server_port": 1,
    "dashboard_port": 2,
    "dashboard_agent_listen_port": 3,
    "dashboard_agent_grpc_port": 4,
    "runtime_env_agent_port": 5,
    "metrics_export_port": 6,
    "node_manager_port": 7,
    "object_manager_port": 8,
    "autoscaler_metric_port": 9,
    "dashboard_metric_port": 10,
    AGENT_CONTROL_PORT: 11,
}
assert max(HASH_OFFSETS.values()) < HASH_BLOCK_SIZE

# The ports `random` must pick because Ray cannot (or would collide).
_RANDOM_HEAD_PICKS = ("gcs_port", "ray_client_server_port", "dashboard_port", "dashboard_agent_listen_port",
                      "metrics_export_port", "autoscaler_metric_port", "dashboard_metric_port")
# metrics_export_port: the agent reads its node's GPU load there (agent/node/ray_load).
_RANDOM_WORKER_PICKS = ("dashboard_agent_listen_port", "metrics_export_port")
_FREE_PORT_ATTEMPTS = 50


def _check_role(role: str) -> None:
    if role not in ROLES:
        raise ValueError(f"role={role!r}: must be one of {', '.join(ROLES)}")


def job_number(job_id: str) -> int:
    """The integer a ``hash_jobid`` block is derived from.

    Slurm job ids are integers (``SLURM_JOB_ID``); the local scheduler's ids
    may not be, so anything else is hashed (stable across processes, unlike
    Python's ``hash``).
    """
    text = str(job_id).strip()
    if not text:
        raise ValueError("job_id must not be empty")
    if text.isdigit():
        return int(text)
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")


def hash_block_start(job_id: str, role: str) -> int:
    """First port of the ``hash_jobid`` block of ``role`` in job ``job_id``."""
    _check_role(role)
    block = 2 * (job_number(job_id) % HASH_PAIRS) + (1 if role == "head" else 0)
    return HASH_PORT_BASE + HASH_BLOCK_SIZE * block


def choose_ports(strategy: str, job_id: str, role: str, free_port: Callable[[], int],
                 *, head_port: int = 6379) -> dict[str, int]:
    """The explicit ports of one Ray node (see the module docstring).

    ``free_port`` is only called for ``random``; it must return a port that is
    free right now (the caller binds port 0 and closes it). Values it returns
    twice are asked again, so one node never gets the same port for two
    services. ``head_port`` is the launcher's, used by ``fixed``.

    Keys are those of :data:`PORT_OPTIONS` and :data:`PORT_ENV`, plus
    :data:`AGENT_CONTROL_PORT` for the agent's own socket (absent or 0: bind
    any free port; it is published in the session directory either way).
    """
    _check_role(role)
    if strategy not in PORT_STRATEGIES:
        raise ValueError(f"port_strategy={strategy!r}: must be one of {', '.join(PORT_STRATEGIES)}")
    if strategy == "fixed":
        # Ray's defaults (core workers 10002-19999 included): one node per host.
        return {"gcs_port": head_port} if role == "head" else {}

    # Worker processes: the OS picks, so neither strategy can run out of a
    # fixed range or collide with another node's workers.
    ports: dict[str, int] = {"min_worker_port": 0, "max_worker_port": 0}
    if strategy == "hash_jobid":
        first = hash_block_start(job_id, role)
        for key, offset in HASH_OFFSETS.items():
            if role == "head" or key not in HEAD_ONLY_PORTS:
                ports[key] = first + offset
        return ports

    # random
    picked: set[int] = set()
    for key in (_RANDOM_HEAD_PICKS if role == "head" else _RANDOM_WORKER_PICKS):
        for _ in range(_FREE_PORT_ATTEMPTS):
            port = free_port()
            if isinstance(port, bool) or not isinstance(port, int) or not 1024 <= port <= 65535:
                raise ValueError(f"free_port() returned {port!r}; expected a port number 1024-65535")
            if port not in picked:
                break
        else:
            raise RuntimeError(f"free_port() kept returning ports already taken for this node: {sorted(picked)}")
        picked.add(port)
        ports[key] = port
    ports[AGENT_CONTROL_PORT] = 0
    return ports


# --------------------------------------------------------------------------
# Slurm facts -> Ray numbers (pure; the caller passes os.environ).

def slurm_cpus_on_node(environ: Mapping[str, str]) -> int | None:
    """``SLURM_CPUS_ON_NODE``: the CPUs Slurm granted on this node, not every CPU of a shared node."""
    value = environ.get("SLURM_CPUS_ON_NODE", "").strip()
    return int(value) if value.isdigit() and int(value) > 0 else None


def slurm_memory_bytes(environ: Mapping[str, str]) -> int | None:
    """The job's memory on this node in bytes, from ``SLURM_MEM_PER_NODE`` (MB) or
    ``SLURM_MEM_PER_CPU`` x ``SLURM_CPUS_ON_NODE``.

    Passed as ``--memory`` because every Ray node otherwise reports (almost)
    all of the host's RAM, which over-commits a shared node.
    """
    per_node = environ.get("SLURM_MEM_PER_NODE", "").strip()
    if per_node.isdigit() and int(per_node) > 0:
        return int(per_node) * 1024 * 1024
    per_cpu = environ.get("SLURM_MEM_PER_CPU", "").strip()
    cpus = slurm_cpus_on_node(environ)
    if per_cpu.isdigit() and int(per_cpu) > 0 and cpus:
        return int(per_cpu) * cpus * 1024 * 1024
    return None


def worker_gpus(launcher: RayLauncher, allocation: SlurmWorkerAllocationConfig | None) -> int:
    """GPUs a worker advertises: the allocation's ``gpus_per_node``, else the launcher's default."""
    if allocation is not None and allocation.gpus_per_node is not None:
        return allocation.gpus_per_node
    return launcher.num_gpus_per_node


# --------------------------------------------------------------------------
# The command.

#: Environment every node gets (values are strings, as the environment needs).
#: * RAY_USAGE_STATS_ENABLED=0: no phone-home from compute nodes (and no delay
#:   when there is no internet).
#: * RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S=0: in Ray >= 2.60, SIGTERM to
#:   `ray start --block` first drains the node through the GCS and waits up to
#:   this long (default 30 s). The agent drains explicitly, with the deadline
#:   it chose, before it stops anything; a second drain would only delay the
#:   stop, and when the head is gone it wastes the whole timeout on a dead
#:   GCS (measured: 30 s). Older Ray ignores the variable.
BASE_ENV: Mapping[str, str] = {
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0",
}
#: Worker-only environment.
#: * RAY_gcs_rpc_server_reconnect_timeout_s=10: a raylet that lost its GCS
#:   exits after this long (default 60). A head never comes back on the same
#:   address with our setup (no external Redis: a restarted GCS is refused
#:   with an auth error anyway), so waiting longer only keeps a dead node
#:   around; at 10 s it was gone 11 s after the head (measured). It must be
#:   set on the worker: the head's --system-config does not propagate.
#: * RAY_gcs_server_port_wait_time_s=3: in Ray 2.60 this is the number of
#:   attempts a joining node makes to reach the GCS (default 20: about 14
#:   minutes when nothing answers, 40 s per attempt). Measured with 3: a
#:   refused port fails `ray start` after 21 s; a silent host would take
#:   about 2 minutes. The agent only starts a worker once the head published
#:   that it is ready, so a long wait only hides a head that died in
#:   between; the agent's supervisor then starts again with whatever head
#:   ``ray_head`` names (and may stop a start that hangs earlier).
WORKER_ENV: Mapping[str, str] = {
    "RAY_gcs_rpc_server_reconnect_timeout_s": "10",
    "RAY_gcs_server_port_wait_time_s": "3",
}

#: Options the agent fixes on the head: the head's Ray node advertises no CPU
#: and no GPU, so no resource-requesting work lands next to the GCS. The
#: launcher's ray_start_args (shared by every node) cannot change them there.
HEAD_PINNED_OPTIONS = frozenset({"num-cpus", "num-gpus", "resources"})

# Unix socket paths are limited to 107 bytes; Ray puts its sockets at
# <temp_dir>/session_<YYYY-MM-DD_HH-MM-SS_ffffff>_<pid>/sockets/plasma_store.
_SOCKET_SUFFIX = "/session_2000-01-01_00-00-00_000000_4194304/sockets/plasma_store"
MAX_TEMP_DIR_LEN = 107 - len(_SOCKET_SUFFIX)

_LABEL_PART = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9_.\-/]*[A-Za-z0-9])?$")
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([A-Za-z0-9_.\-]*[A-Za-z0-9])?)?$")


@dataclass(frozen=True)
class RayStartCommand:
    """One ``ray start --block`` invocation.

    ``env`` holds only what the agent adds; the process inherits the agent's
    own environment underneath it (Slurm's variables, ``pre_start_commands``
    exports), minus ``unset_env``, and ``env`` wins over it.
    """

    argv: tuple[str, ...]
    env: dict[str, str]
    role: str
    temp_dir: str
    node_ip: str
    ports: dict[str, int]
    unset_env: tuple[str, ...] = SCRUBBED_ENV
    dashboard_address: str | None = None     # the head's dashboard, ip:port; None when off

    @property
    def gcs_address(self) -> str | None:
        """``ip:port`` of the GCS this node starts (head) -- None for a worker."""
        if self.role != "head":
            return None
        port = self.ports.get("gcs_port", 6379)
        return f"{self.node_ip}:{port}"


def default_ray_executable() -> str:
    """The ``ray`` script of this interpreter's environment, not whatever is on PATH.

    ``sys.executable`` is not resolved: in a venv it is a symlink to the base
    interpreter, whose directory holds no (or another) ``ray``.
    """
    return str(Path(sys.executable).parent / "ray")


def option_name(arg: str) -> str:
    """``--num-cpus=8`` -> ``num-cpus``; ``--block`` -> ``block``."""
    if not arg.startswith("--"):
        raise ValueError(f"{arg!r} is not a long option")
    return arg[2:].split("=", 1)[0]


def merge_options(*sources: Sequence[str]) -> tuple[str, ...]:
    """Concatenate option lists so that a later source replaces an earlier one.

    Ray's CLI (click 8) already lets the last of a repeated option win, but
    the agent does not rely on that: an option given by a later source is
    removed from every earlier source, so the final command line names each
    option once per source and reads the way it behaves (and stays right if
    a click version ever refused repeats). Duplicates inside one source are
    left as the user wrote them.
    """
    result: list[str] = []
    for index, source in enumerate(sources):
        later = {option_name(a) for s in sources[index + 1:] for a in s}
        result.extend(a for a in source if option_name(a) not in later)
    return tuple(result)


def format_labels(labels: Mapping[str, str]) -> str:
    """``k=v,k2=v2`` (Ray's ``--labels`` form; JSON still works but is deprecated)."""
    parts = []
    for key, value in labels.items():
        if not isinstance(key, str) or not _LABEL_PART.match(key):
            raise ValueError(f"label key {key!r}: letters, digits, '-', '_', '.', '/' only")
        if not isinstance(value, str) or len(value) > 63 or not _LABEL_VALUE.match(value):
            raise ValueError(f"label {key}={value!r}: value must be at most 63 letters, digits, '-', '_', '.'")
        parts.append(f"{key}={value}")
    return ",".join(parts)


def check_temp_dir(temp_dir: str) -> str:
    """Refuse a temp dir whose Ray sockets would exceed the Unix socket path limit."""
    if not temp_dir.startswith("/"):
        raise ValueError(f"temp_dir={temp_dir!r}: must be an absolute path")
    if len(temp_dir.encode()) > MAX_TEMP_DIR_LEN:
        raise ValueError(f"temp_dir={temp_dir!r}: longer than {MAX_TEMP_DIR_LEN} bytes; Ray's socket "
                         "paths below it would exceed the 107-byte Unix socket limit")
    return temp_dir.rstrip("/") or "/"


def check_ip(node_ip: str) -> str:
    # 127.0.0.1 and localhost are silently replaced by the host's primary IP
    # (services.resolve_ip_for_localhost), which would put the node on the
    # wrong interface; 127.0.0.2 and up are kept.
    if node_ip in ("127.0.0.1", "localhost", "::1", "") or node_ip.startswith("0."):
        raise ValueError(f"node_ip={node_ip!r}: Ray rewrites it; use a real address (127.0.0.2+ on loopback)")
    return node_ip


def _port_args(ports: Mapping[str, int], role: str) -> tuple[list[str], dict[str, str]]:
    args: list[str] = []
    env: dict[str, str] = {}
    for key, port in ports.items():
        if key == AGENT_CONTROL_PORT:
            continue
        if role == "worker" and key in HEAD_ONLY_PORTS:
            raise ValueError(f"ports[{key!r}] is head-only; `ray start` aborts a worker given it")
        if key in PORT_OPTIONS:
            args.append(f"{PORT_OPTIONS[key]}={port}")
        elif key in PORT_ENV:
            env[PORT_ENV[key]] = str(port)
        else:
            raise ValueError(f"ports[{key!r}]: unknown port key")
    return args, env


def build_ray_start(
    role: str,
    *,
    job_id: str,
    node_ip: str,
    temp_dir: str,
    launcher: RayLauncher,
    ports: Mapping[str, int],
    allocation: SlurmWorkerAllocationConfig | None = None,
    head_address: str | None = None,
    num_cpus: int | None = None,
    num_gpus: int | None = None,
    memory_bytes: int | None = None,
    object_store_bytes: int | None = None,
    labels: Mapping[str, str] | None = None,
    ray_executable: str | None = None,
    token_path: str | None = None,
) -> RayStartCommand:
    """The ``ray start --block`` command of one node.

    Head: a control plane only (``--num-cpus=0 --num-gpus=0``), with the
    launcher's dashboard setting. The allocation's Ray settings describe its
    worker nodes and are not applied to a head, even one elected onto that
    allocation; the launcher's ``ray_start_args`` are (they are shared by
    every node), except the pinned resource options.

    Worker: joins ``head_address``; ``num_cpus`` is ``SLURM_CPUS_ON_NODE``
    (omitted: Ray counts every CPU of the host), ``num_gpus`` defaults to
    :func:`worker_gpus`, custom resources are ``dagster_slurm_worker: 1`` plus
    the allocation's ``ray_resources``, and ``--labels`` carries
    ``slurm.job-id`` plus ``labels``. ``memory_bytes`` becomes ``--memory``.
    Then the launcher's ``ray_start_args`` and the allocation's, last, so the
    user's values win (see :func:`merge_options`).

    Both: ``--block`` (the node's processes stay children of one process in
    one session, so the agent can find and stop all of them), an explicit
    ``--node-ip-address`` and per-node ``--temp-dir`` (the GCS records the
    raylet socket under it, which is how an agent finds its own node id).
    Authentication travels in ``env`` only (:func:`elastic_ray.ray_auth.ray_auth_env`;
    ``token_path`` is required in token mode), never in ``argv``.
    """
    _check_role(role)
    auth_env = ray_auth_env(launcher.auth_mode, token_path)
    node_ip = check_ip(node_ip)
    temp_dir = check_temp_dir(temp_dir)
    if labels is not None and not isinstance(labels, Mapping):
        raise ValueError("labels must be a mapping")
    exe = ray_executable or default_ray_executable()
    port_args, port_env = _port_args(ports, role)

    agent: list[str] = [f"--node-ip-address={node_ip}", f"--temp-dir={temp_dir}"]
    user: list[tuple[str, ...]] = []
    if role == "head":
        if head_address is not None:
            raise ValueError("head_address is for workers; a head starts its own GCS")
        agent[:0] = ["--head", "--block"]
        agent += ["--num-cpus=0", "--num-gpus=0",
                  f"--include-dashboard={'true' if launcher.include_dashboard else 'false'}"]
        if launcher.include_dashboard:   # Ray's 127.0.0.1 is out of reach of a tunnel via the login host;
            agent.append(f"--dashboard-host={node_ip}")   # no wider than the GCS, and token auth guards both
        if memory_bytes is not None:
            agent.append(f"--memory={_positive('memory_bytes', memory_bytes)}")
        if labels:
            agent.append(f"--labels={format_labels(labels)}")
        user.append(tuple(a for a in launcher.ray_start_args if option_name(a) not in HEAD_PINNED_OPTIONS))
    else:
        if not head_address or ":" not in head_address:
            raise ValueError(f"head_address={head_address!r}: a worker needs the head's ip:port")
        gpus = worker_gpus(launcher, allocation) if num_gpus is None else num_gpus
        resources: dict[str, float] = {"dagster_slurm_worker": 1}
        if allocation is not None:
            resources.update(allocation.ray_resources)
        agent[:0] = [f"--address={head_address}", "--block"]
        if num_cpus is not None:
            agent.append(f"--num-cpus={_non_negative('num_cpus', num_cpus)}")
        agent.append(f"--num-gpus={_non_negative('num_gpus', gpus)}")
        agent.append("--resources=" + json.dumps(resources, separators=(",", ":")))
        agent.append("--labels=" + format_labels({"slurm.job-id": str(job_id), **(labels or {})}))
        if memory_bytes is not None:
            agent.append(f"--memory={_positive('memory_bytes', memory_bytes)}")
        user.append(launcher.ray_start_args)
        if allocation is not None:
            user.append(allocation.ray_start_args)
    agent += port_args
    store = object_store_bytes if object_store_bytes is not None else launcher.object_store_memory
    if store is not None:
        agent.append(f"--object-store-memory={_positive('object_store_bytes', store)}")
    # launcher.redis_password is never passed: Ray hands it on to its
    # gcs_server and worker command lines (argv, readable by every user of
    # the node) whichever way it gets it, and it only guards an external
    # Redis, which we do not set up. Token auth protects the cluster.
    agent.append("--disable-usage-stats")
    # Plain text in the node's log file (Ray colours it even when not a tty).
    agent.append("--log-color=false")

    env = {**launcher.keepalive_env(), **launcher.env}   # the user's own RAY_grpc_* win
    env.update(BASE_ENV)
    # Always explicit: with RAY_AUTH_MODE unset, a head whose $HOME holds
    # ~/.ray/auth_token turns token auth on by itself, and workers do not.
    env.update(auth_env)
    if role == "worker":
        env.update(WORKER_ENV)
    env.update(port_env)

    argv = (exe, "start", *merge_options(agent, *user))
    return RayStartCommand(argv=argv, env=env, role=role, temp_dir=temp_dir, node_ip=node_ip,
                           ports=dict(ports), dashboard_address=f"{node_ip}:{ports.get('dashboard_port', 8265)}"
                           if role == "head" and launcher.include_dashboard else None)   # 8265: Ray's default


def _non_negative(name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name}={value!r}: must be a whole number >= 0 (ray start takes integers)")
    return value


def _positive(name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0 or not math.isfinite(value):
        raise ValueError(f"{name}={value!r}: must be a whole number of bytes > 0")
    return value
