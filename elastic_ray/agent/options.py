"""What an agent is started with: its command-line options, and the allocation
config its node belongs to."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..atomic import read_json
from ..config import SlurmRunAllocationConfig, SlurmWorkerAllocationConfig
from ..protocol.disk.records import SessionInfo


@dataclass(frozen=True)
class AgentOptions:
    session: Path
    job_id: str
    role: str                      # "head" or "worker"
    node: str                      # Slurm node name
    node_ip: str
    node_index: int = 0            # SLURM_NODEID: node 0 may host an elected head
    spec: Path | None = None       # the worker allocation's config (JSON)
    poll_interval: float = 1.0     # how often the ray_head pointer is read
    heartbeat_interval: float = 1.0  # two beats per head_lost_after: see docs/architecture.md, "The control channel"
    head_lost_after: float = 2.0   # silence after which a head counts as lost
    backoff_base: float = 2.0
    backoff_max: float = 60.0
    start_timeout: float = 120.0
    head_drain_lead: float = 300.0  # a head without a pre-walltime signal drains this long before its walltime
    rejoin_order: str = "host-first"  # who restarts Ray first after the head moved: agent.head.rejoin_order


def hosts_head_at_start(options: AgentOptions) -> bool:
    """Does this node host the run's head from the start? Pure apart from
    reading the spec file.

    In the default layout the run's first allocation is a worker allocation
    whose spec says ``"host_head": true``: its first node starts a head-only
    control plane next to its own Ray worker at once, so the allocation both
    hosts the head and computes. No coordinator has to be around to ask.
    """
    if options.role != "worker" or options.node_index != 0 or options.spec is None:
        return False
    data = read_json(options.spec)
    return isinstance(data, dict) and data.get("host_head") is True


def load_allocation(options: AgentOptions, info: SessionInfo) -> SlurmRunAllocationConfig:
    """The head's run config, or the worker allocation's (its spec file, else the session's)."""
    if options.role == "head":
        return SlurmRunAllocationConfig.from_dict(info.head)
    if options.spec is not None:
        data = read_json(options.spec)
        return SlurmWorkerAllocationConfig.from_dict(data.get("config", data))
    if info.worker_allocation is not None:
        return SlurmWorkerAllocationConfig.from_dict(info.worker_allocation)
    return SlurmWorkerAllocationConfig()
