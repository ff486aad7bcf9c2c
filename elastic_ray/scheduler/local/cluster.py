"""The emulated cluster of the local scheduler, and every decision about its capacity.

Pure: no files, no processes, no clock. The local scheduler's per-job
supervisors, ``submit`` and ``test_only`` all ask these functions the same
questions (is this request possible at all, does it fit what is free now,
when would it fit), so the answers are consistent across processes and can
be tested exhaustively without starting anything.

The model follows the Slurm lab (``integration/labctl/``): nodes with CPUs,
memory and GPUs, grouped in partitions, ``select/cons_tres`` with
``CR_CPU_Memory`` (CPUs, memory and GPUs are consumable; several jobs share a
node while they fit), one task per node, ``DefMemPerCPU``. What Slurm does and
we do not: QoS, accounts, reservations, constraints and ``time_min`` are
accepted and ignored; there are no node weights or features.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ...config import SlurmRunAllocationConfig
from ...config.slurm_values import parse_memory_mb

# What Slurm says when a request can never run; code above the scheduler may
# look for it in the message, so both backends use the same words.
NOT_AVAILABLE = "Requested node configuration is not available"
INVALID_PARTITION = "invalid partition name specified"


# --------------------------------------------------------------------------
# Host lists ("cpu-[1-2],gpua-1"), as Slurm writes them in SLURM_JOB_NODELIST.

_HOST_NUMBER = re.compile(r"^(.*?)(\d+)$")
_BRACKET = re.compile(r"^(.*?)\[([^\]]+)\](.*)$")


def expand_hostlist(text: str) -> list[str]:
    """``"cpu-[1-2,4],gpua-1"`` -> ``["cpu-1", "cpu-2", "cpu-4", "gpua-1"]``.

    One bracket group per host expression, which is all Slurm writes for the
    names used here. Zero padding (``n[01-03]``) is kept. Raises ValueError.
    """
    hosts: list[str] = []
    for expr in _split_top_level(text.strip()):
        if not expr:
            raise ValueError(f"empty host name in {text!r}")
        match = _BRACKET.match(expr)
        if not match:
            if any(ch in expr for ch in "[]"):
                raise ValueError(f"unbalanced brackets in {text!r}")
            hosts.append(expr)
            continue
        prefix, ranges, suffix = match.groups()
        if any(ch in prefix + suffix for ch in "[]"):
            raise ValueError(f"only one bracket group per host is supported: {expr!r}")
        for part in ranges.split(","):
            low, _, high = part.partition("-")
            if not low.isdigit() or (high and not high.isdigit()):
                raise ValueError(f"bad range {part!r} in {text!r}")
            width = len(low) if low.startswith("0") else 0
            first, last = int(low), int(high or low)
            if last < first:
                raise ValueError(f"descending range {part!r} in {text!r}")
            hosts.extend(f"{prefix}{n:0{width}d}{suffix}" for n in range(first, last + 1))
    return hosts


def _split_top_level(text: str) -> list[str]:
    """Split on commas that are not inside brackets."""
    parts, depth, current = [], 0, []
    for ch in text:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
    parts.append("".join(current))
    return parts


def compress_hostlist(hosts: Sequence[str]) -> str:
    """Inverse of :func:`expand_hostlist`: ``["cpu-1", "cpu-2"]`` -> ``"cpu-[1-2]"``.

    Slurm hands jobs the compressed form, so the local scheduler does too:
    code that only copes with ``a,b`` is caught on a laptop, not on the cluster.
    Order of first appearance of each prefix is kept.
    """
    groups: dict[tuple[str, int], list[int]] = {}
    order: list[tuple[str, Any]] = []
    for host in hosts:
        match = _HOST_NUMBER.match(host)
        if not match:
            order.append(("plain", host))
            continue
        prefix, digits = match.groups()
        width = len(digits) if digits.startswith("0") and len(digits) > 1 else 0
        key = (prefix, width)
        if key not in groups:
            groups[key] = []
            order.append(("group", key))
        groups[key].append(int(digits))
    out = []
    for kind, item in order:
        if kind == "plain":
            out.append(item)
            continue
        prefix, width = item
        numbers = sorted(set(groups[item]))
        if len(numbers) == 1:
            out.append(f"{prefix}{numbers[0]:0{width}d}")
            continue
        ranges, start, prev = [], numbers[0], numbers[0]
        for n in numbers[1:] + [None]:
            if n is not None and n == prev + 1:
                prev = n
                continue
            ranges.append(f"{start:0{width}d}" if start == prev else f"{start:0{width}d}-{prev:0{width}d}")
            if n is not None:
                start = prev = n
        out.append(f"{prefix}[{','.join(ranges)}]")
    return ",".join(out)


# --------------------------------------------------------------------------
# The cluster description.

@dataclass(frozen=True)
class LocalNode:
    """One emulated node: a name, a loopback address and its capacity."""

    name: str
    address: str
    partition: str
    cpus: int = 4
    mem_mb: int = 8192
    gpus: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "address": self.address, "partition": self.partition,
                "cpus": self.cpus, "mem_mb": self.mem_mb, "gpus": self.gpus}


@dataclass(frozen=True)
class LocalCluster:
    """The emulated nodes and the few slurm.conf knobs the emulation honours.

    ``kill_wait`` is Slurm's KillWait: seconds between TERM and KILL when a
    job is cancelled or times out. ``sched_interval`` is how often a pending
    job looks for room (a job that ends also wakes the pending ones at once).
    ``startup_grace`` is how long a job record may exist without a registered
    supervisor before it is declared failed (the submitter died mid-submit).
    """

    nodes: tuple[LocalNode, ...]
    default_partition: str
    kill_wait: float = 5.0
    def_mem_per_cpu_mb: int = 256
    sched_interval: float = 0.2
    startup_grace: float = 30.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "nodes", tuple(self.nodes))
        if not self.nodes:
            raise ValueError("nodes: a cluster needs at least one node")
        names = [n.name for n in self.nodes]
        if len(set(names)) != len(names):
            raise ValueError(f"nodes: duplicate node names in {names}")
        addresses = [n.address for n in self.nodes]
        if len(set(addresses)) != len(addresses):
            raise ValueError(f"nodes: duplicate addresses in {addresses}")
        for node in self.nodes:
            if not re.match(r"^[A-Za-z][A-Za-z0-9_\-]*$", node.name):
                raise ValueError(f"nodes: bad node name {node.name!r}")
            if node.cpus < 1 or node.mem_mb < 1 or node.gpus < 0:
                raise ValueError(f"nodes: {node.name} needs cpus >= 1, mem_mb >= 1 and gpus >= 0")
        if self.default_partition not in self.partitions:
            raise ValueError(f"default_partition: {self.default_partition!r} has no nodes")
        for name in ("kill_wait", "sched_interval", "startup_grace"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise ValueError(f"{name}: must be a finite number of seconds, not {value!r}")
        if self.def_mem_per_cpu_mb < 1:
            raise ValueError("def_mem_per_cpu_mb: must be at least 1")

    @property
    def partitions(self) -> dict[str, tuple[LocalNode, ...]]:
        """Partition name -> its nodes, in the order the nodes were given."""
        out: dict[str, list[LocalNode]] = {}
        for node in self.nodes:
            out.setdefault(node.partition, []).append(node)
        return {name: tuple(nodes) for name, nodes in out.items()}

    def node(self, name: str) -> LocalNode:
        for node in self.nodes:
            if node.name == name:
                return node
        raise KeyError(name)

    @classmethod
    def default(cls, **knobs: Any) -> "LocalCluster":
        """The lab's layout (``integration/lab up 4``) on loopback addresses.

        Same names, partitions, CPUs, memory and GPU counts as the Slurm lab,
        so a test written against one runs unchanged against the other.
        """
        nodes = (
            LocalNode("cpu-1", "127.0.0.11", "cpu"),
            LocalNode("cpu-2", "127.0.0.12", "cpu"),
            LocalNode("gpua-1", "127.0.0.13", "gpu-a", gpus=4),
            LocalNode("gpub-1", "127.0.0.14", "gpu-b", gpus=2),
        )
        return cls(nodes=nodes, default_partition="cpu", **knobs)

    def to_dict(self) -> dict[str, Any]:
        return {
            "nodes": [n.to_dict() for n in self.nodes],
            "default_partition": self.default_partition,
            "kill_wait": self.kill_wait,
            "def_mem_per_cpu_mb": self.def_mem_per_cpu_mb,
            "sched_interval": self.sched_interval,
            "startup_grace": self.startup_grace,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "LocalCluster":
        """Validate a stored description; raises ValueError naming the problem."""
        if not isinstance(data, Mapping):
            raise ValueError("the cluster description must be an object")
        try:
            nodes = tuple(
                LocalNode(name=_typed(n, "name", str), address=_typed(n, "address", str),
                          partition=_typed(n, "partition", str), cpus=_typed(n, "cpus", int),
                          mem_mb=_typed(n, "mem_mb", int), gpus=_typed(n, "gpus", int))
                for n in data["nodes"]
            )
            return cls(nodes=nodes, default_partition=_typed(data, "default_partition", str),
                       kill_wait=float(_typed(data, "kill_wait", (int, float))),
                       def_mem_per_cpu_mb=_typed(data, "def_mem_per_cpu_mb", int),
                       sched_interval=float(_typed(data, "sched_interval", (int, float))),
                       startup_grace=float(_typed(data, "startup_grace", (int, float))))
        except (KeyError, TypeError) as exc:
            raise ValueError(f"bad cluster description: {exc!r}") from None


def _typed(data: Any, key: str, kinds: type | tuple[type, ...]) -> Any:
    if not isinstance(data, Mapping):
        raise ValueError(f"expected an object around {key!r}")
    value = data[key]
    if isinstance(value, bool) or not isinstance(value, kinds):
        raise ValueError(f"{key!r} has the wrong type ({type(value).__name__})")
    return value


# --------------------------------------------------------------------------
# Requests, holdings and placement.

@dataclass(frozen=True)
class ResourceRequest:
    """What one job asks of every node it gets (one task per node).

    ``mem_mb`` is per node; None means DefMemPerCPU x CPUs and 0 means "all
    of the node's memory" (sbatch's ``--mem=0``).
    """

    num_nodes: int = 1
    cpus: int = 1
    gpus: int = 0
    mem_mb: int | None = None
    partitions: tuple[str, ...] = ()  # empty: the default partition
    nodelist: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"num_nodes": self.num_nodes, "cpus": self.cpus, "gpus": self.gpus, "mem_mb": self.mem_mb,
                "partitions": list(self.partitions), "nodelist": list(self.nodelist),
                "exclude": list(self.exclude)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "ResourceRequest":
        mem = data.get("mem_mb")
        if mem is not None and (isinstance(mem, bool) or not isinstance(mem, int)):
            raise ValueError("request.mem_mb must be an integer or null")
        out = cls(num_nodes=_typed(data, "num_nodes", int), cpus=_typed(data, "cpus", int),
                  gpus=_typed(data, "gpus", int), mem_mb=mem,
                  partitions=tuple(_str_list(data, "partitions")),
                  nodelist=tuple(_str_list(data, "nodelist")), exclude=tuple(_str_list(data, "exclude")))
        if out.num_nodes < 1 or out.cpus < 1 or out.gpus < 0 or (out.mem_mb is not None and out.mem_mb < 0):
            raise ValueError("request: counts out of range")
        return out


def _str_list(data: Mapping[str, Any], key: str) -> list[str]:
    value = data.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"request.{key} must be a list of strings")
    return value


def request_from_allocation(config: SlurmRunAllocationConfig) -> ResourceRequest:
    """Translate an allocation config into what the emulated nodes must hold.

    The config was validated when it was built, so this only converts units.
    """
    cpus = config.cpus_per_task or 1
    if config.mem is not None:
        mem_mb: int | None = math.ceil(parse_memory_mb(config.mem))
    elif config.mem_per_cpu is not None:
        mem_mb = math.ceil(parse_memory_mb(config.mem_per_cpu)) * cpus
        # --mem-per-cpu=0 also means "all memory", like --mem=0.
    else:
        mem_mb = None
    return ResourceRequest(
        num_nodes=config.num_nodes or 1,
        cpus=cpus,
        gpus=config.gpus_per_node or 0,
        mem_mb=mem_mb,
        partitions=tuple(config.partition.split(",")) if config.partition else (),
        nodelist=tuple(expand_hostlist(config.nodelist)) if config.nodelist else (),
        exclude=tuple(expand_hostlist(config.exclude)) if config.exclude else (),
    )


@dataclass(frozen=True)
class Holding:
    """What one job holds on one node: CPUs, memory and specific GPU indices."""

    node: str
    cpus: int
    mem_mb: int
    gpus: tuple[int, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"node": self.node, "cpus": self.cpus, "mem_mb": self.mem_mb, "gpus": list(self.gpus)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Holding":
        gpus = data.get("gpus", [])
        if not isinstance(gpus, list) or not all(isinstance(g, int) and not isinstance(g, bool) for g in gpus):
            raise ValueError("holding.gpus must be a list of integers")
        return cls(node=_typed(data, "node", str), cpus=_typed(data, "cpus", int),
                   mem_mb=_typed(data, "mem_mb", int), gpus=tuple(gpus))


@dataclass(frozen=True)
class Placement:
    """Where a job runs: one partition, one holding per node (first node first)."""

    partition: str
    holdings: tuple[Holding, ...]

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(h.node for h in self.holdings)


@dataclass(frozen=True)
class NodeFree:
    """What is still free on one node."""

    cpus: int
    mem_mb: int
    gpus: tuple[int, ...] = field(default=())


def free_resources(cluster: LocalCluster, holdings: Iterable[Holding]) -> dict[str, NodeFree]:
    """Each node's capacity minus what ``holdings`` take.

    Holdings on nodes the cluster does not know (a record from an older
    description) are ignored rather than trusted.
    """
    used_cpus: dict[str, int] = {}
    used_mem: dict[str, int] = {}
    used_gpus: dict[str, set[int]] = {}
    for h in holdings:
        used_cpus[h.node] = used_cpus.get(h.node, 0) + h.cpus
        used_mem[h.node] = used_mem.get(h.node, 0) + h.mem_mb
        used_gpus.setdefault(h.node, set()).update(h.gpus)
    return {
        n.name: NodeFree(cpus=n.cpus - used_cpus.get(n.name, 0), mem_mb=n.mem_mb - used_mem.get(n.name, 0),
                         gpus=tuple(i for i in range(n.gpus) if i not in used_gpus.get(n.name, set())))
        for n in cluster.nodes
    }


def mem_for(request: ResourceRequest, node: LocalNode, def_mem_per_cpu_mb: int) -> int:
    """Memory the request takes on ``node`` (``0`` means the whole node)."""
    if request.mem_mb is None:
        return def_mem_per_cpu_mb * request.cpus
    if request.mem_mb == 0:
        return node.mem_mb
    return request.mem_mb


def _partitions_of(request: ResourceRequest, cluster: LocalCluster) -> tuple[str, ...]:
    return request.partitions or (cluster.default_partition,)


def place(request: ResourceRequest, cluster: LocalCluster, free: Mapping[str, NodeFree]) -> Placement | None:
    """The first placement that fits ``free``, or None.

    Partitions are tried in the order given (Slurm picks the one where the
    job starts first; "now" is the only time we know). Nodes are taken in
    cluster order, the nodelist's nodes first, lowest free GPU indices first,
    which is what Slurm does on identical nodes without weights.
    """
    for partition in _partitions_of(request, cluster):
        members = cluster.partitions.get(partition)
        if not members:
            continue
        names = {n.name for n in members}
        if not set(request.nodelist) <= names:
            continue
        # Slurm grows the node count to cover every node named in the nodelist.
        wanted = max(request.num_nodes, len(set(request.nodelist)))
        if set(request.nodelist) & set(request.exclude):
            continue
        required = [n for n in members if n.name in request.nodelist]
        ordered = required + [n for n in members if n.name not in request.nodelist
                              and n.name not in request.exclude]
        chosen: list[Holding] = []
        for index, node in enumerate(ordered):
            mem = mem_for(request, node, cluster.def_mem_per_cpu_mb)
            room = free.get(node.name)
            fits = (room is not None and room.cpus >= request.cpus and room.mem_mb >= mem
                    and len(room.gpus) >= request.gpus)
            if fits:
                chosen.append(Holding(node.name, request.cpus, mem, tuple(room.gpus[:request.gpus])))
            elif index < len(required):
                break  # a required node is busy: this partition cannot place the job now
            if len(chosen) == wanted:
                return Placement(partition, tuple(chosen))
    return None


def infeasible_reason(request: ResourceRequest, cluster: LocalCluster) -> str | None:
    """Why ``request`` can never run on ``cluster``, or None if an idle cluster takes it.

    Submission refuses such a request at once, like sbatch, instead of
    leaving a job pending forever.
    """
    unknown = [p for p in _partitions_of(request, cluster) if p not in cluster.partitions]
    if unknown:
        return f"{INVALID_PARTITION}: {','.join(unknown)}"
    if place(request, cluster, free_resources(cluster, ())) is not None:
        return None
    return (f"{NOT_AVAILABLE}: {request.num_nodes} node(s) with {request.cpus} CPU(s), "
            f"{request.gpus} GPU(s) and {request.mem_mb if request.mem_mb is not None else 'default'} MB "
            f"in partition {','.join(_partitions_of(request, cluster))}")


def schedule(cluster: LocalCluster, held: Iterable[Holding],
             pending: Sequence[tuple[str, ResourceRequest]]) -> tuple[dict[str, Placement], dict[str, str]]:
    """Which pending jobs start now, and why the others wait.

    ``pending`` is in priority order (submission order). Each job that fits
    what is left takes its place; a job that does not fit does not block the
    ones behind it (a backfill without reservations: simple, and enough for
    an emulator; a big job can wait behind a stream of small ones). The
    reason is Slurm's: "Resources" when the job does not fit the free nodes
    at all, "Priority" when it would, but earlier jobs took the room first.
    """
    free_now = free_resources(cluster, held)
    holdings = list(held)
    started: dict[str, Placement] = {}
    reasons: dict[str, str] = {}
    for job_id, request in pending:
        placement = place(request, cluster, free_resources(cluster, holdings))
        if placement is not None:
            started[job_id] = placement
            holdings.extend(placement.holdings)
        elif place(request, cluster, free_now) is not None:
            reasons[job_id] = "Priority"
        else:
            reasons[job_id] = "Resources"
    return started, reasons


def predict_start(request: ResourceRequest, cluster: LocalCluster,
                  running: Sequence[tuple[float | None, Sequence[Holding]]], now: float) -> float:
    """When ``request`` would start: now if it fits, else the earliest end time
    of running jobs after which it fits.

    An estimate like Slurm's: jobs are assumed to run to their time limit,
    and pending jobs ahead in the queue are ignored. ``running`` holds each
    running job's planned end (None: unlimited) and holdings. Returns
    ``math.inf`` when only jobs without a time limit could make room.
    Call :func:`infeasible_reason` first; an impossible request gets inf.
    """
    holdings = [list(h) for _, h in running]
    if place(request, cluster, free_resources(cluster, (h for hs in holdings for h in hs))) is not None:
        return now
    ends = sorted(((end, i) for i, (end, _) in enumerate(running) if end is not None), key=lambda t: t[0])
    released: set[int] = set()
    for end, index in ends:
        released.add(index)
        left = (h for i, hs in enumerate(holdings) if i not in released for h in hs)
        if place(request, cluster, free_resources(cluster, left)) is not None:
            return max(now, end)
    return math.inf
