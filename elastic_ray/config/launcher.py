"""RayLauncher: how Ray is started on every node of a run.

One launcher per session; every node (head and workers, of every
allocation) starts Ray with these settings, so they are stored in
session.json and read by each agent.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import Any

from .allocation import check_ray_start_args
from .shell_check import check_pre_start_commands, check_shell_command
from ..errors import ConfigError

PORT_STRATEGIES = ("random", "hash_jobid", "fixed")
AUTH_MODES = ("disabled", "token")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Linux allows up to 15 bytes, no '/', no whitespace; ':' and '@' show up in
# alias and VLAN names.
_INTERFACE = re.compile(r"[A-Za-z0-9_.:@-]{1,15}")
# Environment the agent sets itself; a launcher value would be overwritten
# or, worse, would break the agent's control of Ray.
# RAY_AUTH_TOKEN(_PATH): the session's token reaches Ray through a file the
# agent points to (see elastic_ray.ray_auth); a second token would shadow it.
AGENT_OWNED_ENV = frozenset({"RAY_ADDRESS", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH",
                             "RAY_USAGE_STATS_ENABLED",
                             "RAY_gcs_rpc_server_reconnect_timeout_s", "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S"})


#: The value a field had in effect before it existed, for a launcher read back from an
#: older session.json (``RayLauncher.from_dict``): no standby, Ray's own keepalive.
WRITTEN_BEFORE: Mapping[str, Any] = MappingProxyType({"standby_head": False, "network_keepalive_ms": None})


@dataclass(frozen=True)
class RayLauncher:
    """Ray settings shared by every node of a run.

    ``num_gpus_per_node`` is the launcher's default for worker nodes; an
    allocation's ``gpus_per_node`` wins. ``port_strategy``: ``random`` (every
    Ray port chosen by the OS at start; the default), ``hash_jobid`` (a port
    block derived from the Slurm job id, stable across restarts of the same
    job) or ``fixed`` (``head_port`` and Ray's defaults; one Ray node per host,
    so a worker allocation can never host an elected head).
    ``pre_start_commands`` are shell lines run on every node before Ray
    starts (module loads, exports); bash must parse them (checked here with
    ``bash -n``) and none may open a here-document.

    ``auth_mode``: ``token`` (the default) runs every Ray process of the run
    with Ray's token authentication, the token derived from the session
    secret (``elastic_ray.ray_auth``); ``disabled`` lets anyone who reaches
    the nodes' Ray ports run code, and is logged as a warning.

    ``python_executable``: the interpreter that runs the agent (and so Ray)
    on every node, an absolute path as the nodes see it (not checked here:
    the submitting host may not have it); None: the interpreter that
    submits, which suits a venv on a shared filesystem.
    The address Ray binds to on each node, at most one of:
    ``network_interface`` (an interface name such as ``ib0``; each agent
    takes that interface's IPv4 address on its node) or
    ``node_ip_address_command`` (one line of shell the agent runs on its
    node; the first line it prints is the address; checked with ``bash -n``
    here). Neither: the address the node's host name resolves to.
    ``redis_password`` is accepted for old configurations but never passed
    to Ray (Ray would put it on command lines); setting it logs a warning.

    ``include_dashboard`` (default False) starts Ray's dashboard on the
    head, on the head node's address; the head publishes it and
    ``elastic-ray session dashboard`` prints the SSH tunnel to it. Off by
    default: measured, it adds about 200 MiB and 1.7 % of a core to an idle
    head (bench/bench_dashboard.py, docs/operations.md).

    ``network_keepalive_ms`` (default 2000; None: Ray's own settings): gRPC
    keepalive on every Ray process of the run (each node's, through its
    agent, and each payload driver's, through ``Session.run``), so that a
    node cut off the network fails its tasks, and they are retried
    elsewhere, within seconds instead of after TCP's own minutes. A ping
    every period on each connection with a call in flight, dead after 1.5
    periods without an answer; a task longer than the period is not
    affected (the servers accept pings as often as their own period). A
    ``RAY_grpc_*keepalive*`` variable in ``env`` (or a driver's environment)
    wins over it. A driver started outside ``Session.run`` gets it only with
    the variables of ``keepalive_env()`` in its environment.

    ``standby_head`` (default None: on wherever a worker node can host a
    head, that is with ``port_strategy`` ``random`` (the default) or
    ``hash_jobid``; off with ``fixed``) keeps a warm standby head: a
    head-only Ray control plane (GCS and a raylet with 0 CPUs and 0 GPUs)
    already running, unpublished, on the first node of the worker allocation
    the next election would pick. An election that picks it only publishes
    it, so a lost head is replaced without waiting for a ``ray start --head``
    (seconds on a busy node). Its cost: one more idle control plane on one
    node of the run, inside the memory share that node holds back for a
    hosted head anyway, and its processes. The session's supervisor places
    it (once a worker allocation's first node joined, then at its checks),
    so a run without a supervisor, or a head lost before the standby is up,
    gains nothing. ``False`` turns it off; ``True`` with ``fixed`` is an
    error. ``keeps_standby`` says what the launcher does; ``session.json``
    keeps the field as given (None: decided by the port strategy, which it
    keeps too, so every process of the run decides alike).
    """

    num_gpus_per_node: int = 0
    port_strategy: str = "random"
    head_port: int = 6379
    env: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    pre_start_commands: tuple[str, ...] = ()
    redis_password: str | None = None
    auth_mode: str = "token"
    ray_start_args: tuple[str, ...] = ()
    include_dashboard: bool = False
    object_store_memory: int | None = None
    python_executable: str | None = None
    network_interface: str | None = None
    node_ip_address_command: str | None = None
    standby_head: bool | None = None
    network_keepalive_ms: int | None = 2000

    def __post_init__(self) -> None:
        set_ = lambda n, v: object.__setattr__(self, n, v)  # noqa: E731 - frozen dataclass
        if isinstance(self.num_gpus_per_node, bool) or not isinstance(self.num_gpus_per_node, int) \
                or self.num_gpus_per_node < 0:
            raise ConfigError("num_gpus_per_node", self.num_gpus_per_node, "must be a whole number >= 0")
        if self.port_strategy not in PORT_STRATEGIES:
            raise ConfigError("port_strategy", self.port_strategy, f"must be one of {', '.join(PORT_STRATEGIES)}")
        if isinstance(self.head_port, bool) or not isinstance(self.head_port, int) \
                or not 1024 <= self.head_port <= 65535:
            raise ConfigError("head_port", self.head_port, "must be a port number between 1024 and 65535")
        if not isinstance(self.env, Mapping):
            raise ConfigError("env", self.env, "must be a mapping of variable name to value")
        env: dict[str, str] = {}
        for key, value in self.env.items():
            if not isinstance(key, str) or not _ENV_NAME.fullmatch(key):
                raise ConfigError(f"env[{key!r}]", key, "is not a valid environment variable name")
            if key in AGENT_OWNED_ENV:
                raise ConfigError(f"env[{key!r}]", key, "is set by the agent")
            if not isinstance(value, str) or "\x00" in value:
                raise ConfigError(f"env[{key!r}]", value, "must be a string without NUL")
            env[key] = value
        set_("env", MappingProxyType(env))
        commands = self.pre_start_commands
        if isinstance(commands, str) or not isinstance(commands, (list, tuple)):
            raise ConfigError("pre_start_commands", commands, "must be a list of shell lines")
        for index, line in enumerate(commands):
            if not isinstance(line, str) or "\n" in line or "\r" in line or "\x00" in line:
                raise ConfigError(f"pre_start_commands[{index}]", line, "must be one line of shell")
        set_("pre_start_commands", tuple(commands))
        check_pre_start_commands(self.pre_start_commands)   # bash -n; here-documents refused
        if self.redis_password is not None and (not isinstance(self.redis_password, str)
                                                or not self.redis_password or "\n" in self.redis_password):
            raise ConfigError("redis_password", "***", "must be a non-empty single-line string")
        if self.auth_mode not in AUTH_MODES:
            raise ConfigError("auth_mode", self.auth_mode, f"must be one of {', '.join(AUTH_MODES)}")
        set_("ray_start_args", check_ray_start_args("ray_start_args", self.ray_start_args))
        if not isinstance(self.include_dashboard, bool):
            raise ConfigError("include_dashboard", self.include_dashboard, "must be True or False")
        if self.object_store_memory is not None and (
                isinstance(self.object_store_memory, bool) or not isinstance(self.object_store_memory, int)
                or self.object_store_memory < 78643200):
            raise ConfigError("object_store_memory", self.object_store_memory,
                              "must be a whole number of bytes, at least 75 MiB (Ray's minimum)")
        self._check_node_fields()
        keepalive = self.network_keepalive_ms
        if keepalive is not None and (isinstance(keepalive, bool) or not isinstance(keepalive, int)
                                      or not 500 <= keepalive <= 600_000):
            raise ConfigError("network_keepalive_ms", keepalive,
                              "must be a whole number of milliseconds from 500 to 600000, or None (Ray's own)")
        if self.standby_head is not None and not isinstance(self.standby_head, bool):
            raise ConfigError("standby_head", self.standby_head, "must be True, False or None (on where it can be)")
        if self.standby_head and not self.can_host_elected_head:
            raise ConfigError("standby_head", self.standby_head,
                              f"needs a port strategy that can host a head (random or hash_jobid), "
                              f"not port_strategy={self.port_strategy!r}")

    def _check_node_fields(self) -> None:
        """The per-node interpreter and address settings (see the class docstring)."""
        python = self.python_executable
        if python is not None and (not isinstance(python, str) or not os.path.isabs(python)
                                   or any(c in python for c in "\x00\n\r")):
            raise ConfigError("python_executable", python, "must be an absolute path (as the nodes see it)")
        interface = self.network_interface
        if interface is not None and (not isinstance(interface, str) or not _INTERFACE.fullmatch(interface)):
            raise ConfigError("network_interface", interface,
                              "must be a network interface name such as ib0 or eth0 (no blanks or slashes)")
        command = self.node_ip_address_command
        if command is not None:
            if not isinstance(command, str) or not command.strip() or any(c in command for c in "\x00\n\r"):
                raise ConfigError("node_ip_address_command", command, "must be one non-empty line of shell")
            if interface is not None:
                raise ConfigError("node_ip_address_command", command,
                                  f"cannot be set together with network_interface={interface!r}; choose one")
            check_shell_command("node_ip_address_command", command)   # bash -n

    def keepalive_env(self) -> dict[str, str]:
        """The ``RAY_*`` variables of ``network_keepalive_ms`` (empty when None).

        Client and server side alike, on every process: Ray's servers accept
        pings as often as their own client keepalive period, so a period set
        only on the clients is answered with ``too_many_pings``.
        """
        period = self.network_keepalive_ms
        if period is None:
            return {}
        timeout = str(period * 3 // 2)
        return {"RAY_grpc_client_keepalive_time_ms": str(period), "RAY_grpc_client_keepalive_timeout_ms": timeout,
                "RAY_grpc_keepalive_time_ms": str(period), "RAY_grpc_keepalive_timeout_ms": timeout}

    @property
    def keeps_standby(self) -> bool:
        """Whether the run keeps a warm standby head: ``standby_head``, or where it is None,
        wherever a worker node can host a head."""
        return self.can_host_elected_head if self.standby_head is None else self.standby_head

    @property
    def can_host_elected_head(self) -> bool:
        """A worker node can host a second (head) Ray node only with separate ports."""
        return self.port_strategy in ("random", "hash_jobid")

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            out[f.name] = dict(value) if isinstance(value, Mapping) else list(value) if isinstance(value, tuple) else value
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "RayLauncher":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(unknown[0], data[unknown[0]], "is not a field of RayLauncher")
        # A session.json written before a field existed keeps the behaviour of the version that
        # wrote it: its running nodes were started that way (a driver with keepalive pinging
        # nodes started without it would be cut off with too_many_pings).
        return cls(**{**WRITTEN_BEFORE, **dict(data)})
