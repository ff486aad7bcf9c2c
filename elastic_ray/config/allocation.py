"""Allocation configs: what a user asks Slurm (and Ray) for.

The configs are frozen dataclasses validated when they are built, so that an
error names the field and the value on the user's side, before anything is
submitted. ``None`` means "unset": the inheritance rules
(:func:`inherit_worker_config`) fill unset fields from the session's first
worker allocation or from the head allocation.

Everything here is pure: no I/O, no Slurm, no Ray.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from types import MappingProxyType
from typing import Any

from .. import defaults
from ..errors import ConfigError
from .slurm_values import check_hostlist, parse_memory_mb, parse_signal, parse_slurm_time

# --------------------------------------------------------------------------
# Field-level checks. Each returns the normalised value or raises ConfigError.
# Patterns are matched with fullmatch: with re.match, '$' would let one
# trailing newline through, which would end an #SBATCH line early.

_NAME = re.compile(r"[A-Za-z0-9_.\-]+")
_NAME_LIST = re.compile(r"[A-Za-z0-9_.\-]+(,[A-Za-z0-9_.\-]+)*")
_CONSTRAINT = re.compile(r"[A-Za-z0-9_.:&|*\[\]()!,\-]+")
_LONG_OPTION = re.compile(r"--([a-z][a-z0-9\-]*)(?:=(.*))?", re.DOTALL)


def _check_int(name: str, value: Any, minimum: int) -> int | None:
    if value is None:
        return None
    # bool is an int subclass; True nodes is a bug, not a request for one node.
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(name, value, "must be a whole number")
    if value < minimum:
        raise ConfigError(name, value, f"must be at least {minimum}")
    return value


def _check_pattern(name: str, value: Any, pattern: re.Pattern[str], what: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not pattern.fullmatch(value):
        raise ConfigError(name, value, f"must be {what}")
    return value


def _check_time(name: str, value: Any) -> str | None:
    if value is None:
        return None
    try:
        parse_slurm_time(value)
    except ValueError as exc:
        raise ConfigError(name, value, str(exc)) from None
    return value.strip()


def _check_memory(name: str, value: Any) -> str | None:
    if value is None:
        return None
    try:
        parse_memory_mb(value)
    except ValueError as exc:
        raise ConfigError(name, value, str(exc)) from None
    return value.strip().upper()


def _check_signal(name: str, value: Any) -> str | None:
    if value is None:
        return None
    try:
        return parse_signal(value).sbatch_value()
    except ValueError as exc:
        raise ConfigError(name, value, str(exc)) from None


# sbatch options that the renderer writes itself. A directive that sets one of
# them again (or an abbreviation of one: sbatch accepts any unique prefix, so
# --sig=... means --signal=...) would silently override what the session
# relies on, so it is refused.
MANAGED_SBATCH_OPTIONS = frozenset({
    "job-name", "partition", "nodes", "ntasks", "ntasks-per-node", "gpus-per-node", "gpus",
    "gpus-per-task", "gpus-per-socket", "gres", "cpus-per-task", "cpus-per-gpu", "mem",
    "mem-per-cpu", "mem-per-gpu", "time", "time-min", "signal", "nodelist", "exclude", "qos",
    "account", "reservation", "constraint", "output", "error", "input", "chdir", "export",
    "export-file", "parsable", "test-only", "wrap", "array", "nodefile", "open-mode",
    "get-user-env", "wait", "batch", "cluster", "clusters",
})


def _long_options(name: str, value: Any, example: str,
                  shape: str) -> list[tuple[str, str, str, str | None]]:
    """A list of long options, each ``--name`` or ``--name=value``, as
    ``(where, item, option, argument)``. The list and item checks both
    option lists share; what each allows of an option is its caller's."""
    if value is None:
        return []
    if isinstance(value, str) or not isinstance(value, (list, tuple)):
        raise ConfigError(name, value, f"must be a list {example}")
    out = []
    for index, item in enumerate(value):
        where = f"{name}[{index}]"
        if not isinstance(item, str):
            raise ConfigError(where, item, "must be a string")
        match = _LONG_OPTION.fullmatch(item)
        if not match:
            raise ConfigError(where, item, shape)
        out.append((where, item, match.group(1), match.group(2)))
    return out


def _check_sbatch_directives(name: str, value: Any) -> tuple[str, ...]:
    checked = []
    for where, item, option, argument in _long_options(name, value, "of long options such as ['--requeue']",
                                                       "must be one long option, '--name' or '--name=value'"):
        if argument is not None and (not argument or re.search(r"[\s'\"\\#`$]", argument)):
            raise ConfigError(where, item, "the value must be non-empty, without blanks, quotes, '#', '$', '`' or '\\'")
        clash = sorted(o for o in MANAGED_SBATCH_OPTIONS if o.startswith(option))
        if clash:
            raise ConfigError(where, item, f"--{option} sets (or abbreviates) --{clash[0]}, which the session "
                                           "manages; use the config field instead")
        checked.append(item)
    return tuple(checked)


# Resources the agent or Ray itself owns. A user value would fight with the
# numbers the agent computes (SLURM_CPUS_ON_NODE, gpus_per_node) or break Ray.
RESERVED_RAY_RESOURCES = frozenset({"CPU", "GPU", "memory", "object_store_memory", "dagster_slurm_worker"})


def _check_ray_resources(name: str, value: Any) -> Mapping[str, float]:
    if value is None:
        return MappingProxyType({})
    if not isinstance(value, Mapping):
        raise ConfigError(name, value, "must be a mapping of resource name to amount")
    checked: dict[str, float] = {}
    for key, amount in value.items():
        where = f"{name}[{key!r}]"
        if not isinstance(key, str) or not key.strip():
            raise ConfigError(where, key, "a resource name must be a non-empty string")
        if any(ord(ch) < 32 for ch in key):
            raise ConfigError(where, key, "a resource name must not contain control characters")
        if key in RESERVED_RAY_RESOURCES or key.startswith("node:"):
            raise ConfigError(where, key, "is set by the agent or by Ray; use gpus_per_node, cpus_per_task "
                                          "or ray_start_args for CPUs, GPUs and memory")
        if isinstance(amount, bool) or not isinstance(amount, (int, float)):
            raise ConfigError(where, amount, "the amount must be a number")
        if not math.isfinite(amount) or amount < 0:
            raise ConfigError(where, amount, "the amount must be finite and not negative")
        checked[key] = float(amount)
    return MappingProxyType(checked)


# `ray start` options the agent computes from the allocation, the launcher and
# the port strategy. Everything else may be passed through ray_start_args and
# wins over the agent's defaults (for example --num-cpus or --object-store-memory).
AGENT_OWNED_RAY_OPTIONS = frozenset({
    "address", "head", "block", "temp-dir", "resources", "num-gpus", "node-ip-address", "port",
    "labels", "labels-file", "redis-password", "redis-username", "node-manager-port",
    "object-manager-port", "min-worker-port", "max-worker-port", "worker-port-list",
    "dashboard-agent-listen-port", "dashboard-agent-grpc-port", "runtime-env-agent-port",
    "metrics-export-port", "ray-client-server-port", "dashboard-port", "dashboard-host",
    "include-dashboard", "autoscaling-config", "node-name",
})


def check_ray_start_args(name: str, value: Any) -> tuple[str, ...]:
    checked = []
    for where, item, option, argument in _long_options(
            name, value, "such as ['--num-cpus=8']", "must be '--option' or '--option=value' (one list item per option)"):
        if argument is not None and ("\n" in argument or "\x00" in argument):
            raise ConfigError(where, item, "the value must not contain a newline or NUL")
        if option in AGENT_OWNED_RAY_OPTIONS:
            raise ConfigError(where, item, f"--{option} is set by the agent and cannot be overridden")
        checked.append(item)
    return tuple(checked)


def _check_positive_seconds(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(name, value, "must be a number of seconds")
    if not math.isfinite(value) or value <= 0:
        raise ConfigError(name, value, "must be a finite number of seconds above zero")
    return float(value)


# --------------------------------------------------------------------------
# The configs.

@dataclass(frozen=True)
class SlurmRunAllocationConfig:
    """A Slurm allocation: the run's head, or the shape of a worker allocation.

    Every field is optional; unset fields are filled by inheritance or by the
    head defaults (:func:`resolve_head_config`).
    """

    partition: str | None = None
    num_nodes: int | None = None
    gpus_per_node: int | None = None
    cpus_per_task: int | None = None
    mem: str | None = None
    mem_per_cpu: str | None = None
    time_limit: str | None = None
    time_min: str | None = None
    signal_before_timeout: str | None = None
    nodelist: str | None = None
    exclude: str | None = None
    qos: str | None = None
    account: str | None = None
    reservation: str | None = None
    constraint: str | None = None
    extra_sbatch_directives: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        set_ = lambda n, v: object.__setattr__(self, n, v)  # noqa: E731 - frozen dataclass
        set_("partition", _check_pattern("partition", self.partition, _NAME_LIST,
                                         "a partition name (or a comma-separated list)"))
        set_("num_nodes", _check_int("num_nodes", self.num_nodes, 1))
        set_("gpus_per_node", _check_int("gpus_per_node", self.gpus_per_node, 0))
        set_("cpus_per_task", _check_int("cpus_per_task", self.cpus_per_task, 1))
        set_("mem", _check_memory("mem", self.mem))
        set_("mem_per_cpu", _check_memory("mem_per_cpu", self.mem_per_cpu))
        if self.mem is not None and self.mem_per_cpu is not None:
            raise ConfigError("mem_per_cpu", self.mem_per_cpu, "mem and mem_per_cpu are exclusive; set one")
        set_("time_limit", _check_time("time_limit", self.time_limit))
        set_("time_min", _check_time("time_min", self.time_min))
        if self.time_limit is not None and self.time_min is not None:
            limit, minimum = parse_slurm_time(self.time_limit), parse_slurm_time(self.time_min)
            if limit is not None and (minimum is None or minimum > limit):
                raise ConfigError("time_min", self.time_min, f"must not exceed time_limit={self.time_limit!r}")
        set_("signal_before_timeout", _check_signal("signal_before_timeout", self.signal_before_timeout))
        set_("nodelist", None if self.nodelist is None else check_hostlist(self.nodelist, "nodelist"))
        set_("exclude", None if self.exclude is None else check_hostlist(self.exclude, "exclude"))
        set_("qos", _check_pattern("qos", self.qos, _NAME, "a QoS name"))
        set_("account", _check_pattern("account", self.account, _NAME, "an account name"))
        set_("reservation", _check_pattern("reservation", self.reservation, _NAME, "a reservation name"))
        set_("constraint", _check_pattern("constraint", self.constraint, _CONSTRAINT,
                                          "a Slurm constraint expression without blanks"))
        set_("extra_sbatch_directives",
             _check_sbatch_directives("extra_sbatch_directives", self.extra_sbatch_directives))

    # Helpers used by the renderer, the agent and the coordinator.
    def time_limit_seconds(self) -> int | None:
        return None if self.time_limit is None else parse_slurm_time(self.time_limit)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (session files store configs this way)."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, Mapping):
                value = dict(value)
            elif isinstance(value, tuple):
                value = list(value)
            out[f.name] = value
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "SlurmRunAllocationConfig":
        """Build from :meth:`to_dict` output; unknown keys are an error."""
        if not isinstance(data, Mapping):
            raise ConfigError(cls.__name__, data, "must be a mapping")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(unknown[0], data[unknown[0]], f"is not a field of {cls.__name__}")
        return cls(**dict(data))


@dataclass(frozen=True)
class SlurmWorkerAllocationConfig(SlurmRunAllocationConfig):
    """A worker allocation: Slurm fields plus the Ray settings of its nodes.

    ``ray_resources``, ``ray_start_args`` and ``rejoin_timeout`` belong to this
    one submission and are never inherited: a label such as ``accelerator:a40``
    must not follow a request to another partition.
    """

    ray_resources: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))
    ray_start_args: tuple[str, ...] = ()
    rejoin_timeout: float = defaults.REJOIN_TIMEOUT

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "ray_resources", _check_ray_resources("ray_resources", self.ray_resources))
        object.__setattr__(self, "ray_start_args", check_ray_start_args("ray_start_args", self.ray_start_args))
        object.__setattr__(self, "rejoin_timeout", _check_positive_seconds("rejoin_timeout", self.rejoin_timeout))


# --------------------------------------------------------------------------
# Inheritance and defaults: pure functions, table-tested in tests/test_config.py.

SLURM_FIELDS = tuple(f.name for f in fields(SlurmRunAllocationConfig))
# Fields that describe one submission only.
NEVER_INHERITED = frozenset({"nodelist", "extra_sbatch_directives"})
MEMORY_FIELDS = ("mem", "mem_per_cpu")

HEAD_DEFAULTS = {"num_nodes": 1, "cpus_per_task": 2, "mem": "8G", "gpus_per_node": 0}


def inherit_worker_config(
    config: SlurmWorkerAllocationConfig,
    first_worker: SlurmRunAllocationConfig | None,
    head: SlurmRunAllocationConfig | None,
) -> SlurmWorkerAllocationConfig:
    """Fill the unset Slurm fields of ``config``.

    The parent is the session's first worker allocation, or the head
    allocation when the session has no worker yet. ``nodelist`` and
    ``extra_sbatch_directives`` are never taken from the parent, nor are the
    Ray settings (they are not Slurm fields). Memory is one setting with two
    forms: if ``config`` sets ``mem`` or ``mem_per_cpu``, neither form is
    inherited; otherwise both come from the parent.
    """
    parent = first_worker if first_worker is not None else head
    if parent is None:
        return config
    updates: dict[str, Any] = {}
    for name in SLURM_FIELDS:
        if name in NEVER_INHERITED or name in MEMORY_FIELDS:
            continue
        if getattr(config, name) is None and getattr(parent, name) is not None:
            updates[name] = getattr(parent, name)
    if config.mem is None and config.mem_per_cpu is None:
        updates["mem"] = parent.mem
        updates["mem_per_cpu"] = parent.mem_per_cpu
    return replace(config, **updates)


def resolve_head_config(config: SlurmRunAllocationConfig) -> SlurmRunAllocationConfig:
    """Validate a head allocation and apply the head defaults.

    The queue's defaults describe compute nodes, so the head does not use
    them: it needs an explicit partition and time limit, and defaults to one
    node, 2 CPUs, 8 GB and no GPUs. Accounts, QoS and reservations are left to
    the queue when unset.
    """
    if config.partition is None:
        raise ConfigError("partition", None, "the head allocation needs an explicit partition")
    if config.time_limit is None:
        raise ConfigError("time_limit", None, "the head allocation needs an explicit time_limit "
                                              "that covers the whole run")
    updates = {k: v for k, v in HEAD_DEFAULTS.items() if getattr(config, k) is None}
    if config.mem_per_cpu is not None:
        updates.pop("mem", None)
    return replace(config, **updates)


def resolve_separate_head_config(config: SlurmRunAllocationConfig) -> SlurmRunAllocationConfig:
    """Validate a separate, head-only allocation (``ray_head_only``) and apply the head defaults.

    Such an allocation runs one head agent on each of its nodes, and every
    one of them would start a Ray head of its own; only one of them could be
    the run's head, and the others would hold nodes that no Ray worker uses.
    So it has exactly one node; compute is added with worker allocations.
    """
    if config.num_nodes not in (None, 1):
        raise ConfigError("num_nodes", config.num_nodes,
                          "a separate head allocation (ray_head_only) has exactly one node; "
                          "add compute nodes with worker allocations")
    return resolve_head_config(config)


#: Below this, a worker allocation may give up on the session before an
#: election can reach it (see :func:`rejoin_timeout_warning`).
MIN_SAFE_REJOIN_TIMEOUT = 300.0


def rejoin_timeout_warning(config: SlurmWorkerAllocationConfig) -> str | None:
    """The warning for a worker allocation whose ``rejoin_timeout`` is short, or None.

    A worker allocation that sees no live head releases itself after
    ``rejoin_timeout``. An election can take minutes to reach it: the claim
    of an elector that died holds the next election off for its whole
    period. A worker allocation that leaves sooner cannot be elected to host
    the head, and its nodes are lost to the run. Allowed, but said.
    """
    if config.rejoin_timeout >= MIN_SAFE_REJOIN_TIMEOUT:
        return None
    return (f"rejoin_timeout={config.rejoin_timeout:g}s is under {MIN_SAFE_REJOIN_TIMEOUT:g}s: this worker "
            f"allocation may release itself before an election reaches it (an elector that died blocks the "
            f"next election for its claim period), and then it can neither host the head nor rejoin; "
            f"keep it at {MIN_SAFE_REJOIN_TIMEOUT:g}s or more unless idle nodes are costly")
