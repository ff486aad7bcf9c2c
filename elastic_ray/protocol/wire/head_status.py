"""Whether a head agent's ``status`` answer says it serves the run's head.

Shared by the worker agents (``agent.head.head_watch``) and the coordinator's
``HeadWatch``: both ask a newly found head directly instead of waiting for
its first heartbeat (up to a beat interval, 1 s, plus the subscription's own
set-up), and both must read the answer the same way.
"""

from __future__ import annotations

from typing import Any

from ..disk.records import AgentState, HostedHeadState


def head_serves(status: dict[str, Any]) -> bool:
    """Does a head agent's ``status`` answer say it serves a head (its own, or a hosted one)?"""
    return ((status.get("role") == "head" and status.get("state") in (AgentState.JOINED, AgentState.DRAINING))
            or (status.get("hosted_head") or {}).get("state") == HostedHeadState.READY)


def head_draining(status: dict[str, Any]) -> bool:
    """The serving head's agent is phasing out (its own drain, or the hosting node's)."""
    return status.get("state") == AgentState.DRAINING
