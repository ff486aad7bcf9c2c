"""What an agent is started with: its command-line options, and the allocation
config its node belongs to."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .. import defaults, knobs
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
    # What each one means: elastic_ray.defaults (`elastic-agent run` takes the same defaults from there).
    poll_interval: float = defaults.POLL_INTERVAL
    heartbeat_interval: float = defaults.HEARTBEAT_INTERVAL
    head_lost_after: float = defaults.HEAD_LOST_AFTER
    backoff_base: float = defaults.BACKOFF_BASE
    backoff_max: float = defaults.BACKOFF_MAX
    start_timeout: float = defaults.START_TIMEOUT
    head_drain_lead: float = defaults.HEAD_DRAIN_LEAD
    rejoin_order: str = str(knobs.REJOIN_ORDER.default)   # who restarts Ray first after a move: agent.head.rejoin_order


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
