"""When a head drains itself ahead of its walltime: pure, table-tested.

The seed: *a head without a pre-walltime signal is drained 5 minutes before
its walltime*, and a head with one hands over when the signal arrives. The
drain is the very same as one that a signal or ``request_drain()`` starts:
the heartbeat says draining, payload drivers get SIGTERM, the session
elects, and the agent stays until the head has moved.

The head's own agent decides, not a coordinator: it learns its job's end
time from the scheduler (as it does for a signal), so the hand-over starts
on time even when no supervisor or payload step is alive to notice it. The
coordinator only reacts to what the heartbeat says.

Who counts as "the head" here: the agent of a separate head allocation that
``ray_head`` names, and, in the default layout or after an election, the
first node of a worker allocation that hosts the run's head. Only that agent
drains early; the other nodes of such a worker allocation are ordinary
workers and keep computing until their own walltime, as workers do.
"""

from __future__ import annotations

from dataclasses import dataclass

from ... import defaults
from ...scheduler.base import JobState
from ..machine import DrainRequested, drain_deadline_for_signal

#: How long before its walltime a head without a pre-walltime signal is
#: drained (the seed's five minutes). Agents take it from
#: ``ELASTIC_AGENT_HEAD_DRAIN_LEAD``, so a test can shorten it.
DEFAULT_HEAD_DRAIN_LEAD = defaults.HEAD_DRAIN_LEAD


@dataclass(frozen=True)
class WalltimeFacts:
    """What the agent knows at one moment; every field is observed, none decided.

    ``serves_head``: ``ray_head`` names this agent's job and this agent runs
    that head (a head allocation's agent, or the worker agent whose hosted
    head is ready). ``joined``: the agent's node is JOINED, i.e. neither
    starting nor already draining or leaving. ``has_signal``: the allocation
    asked Slurm for a pre-walltime signal (``signal_before_timeout``).
    ``end_time``: the job's planned end, None when unlimited or not known yet.
    """

    now: float
    serves_head: bool
    joined: bool
    has_signal: bool
    end_time: float | None
    lead: float = DEFAULT_HEAD_DRAIN_LEAD


def serves_head(role: str, own_job: str, pointer: str | None, hosted_ready: bool) -> bool:
    """Does this agent run the session's current head? A head allocation's
    agent does while ``ray_head`` names its job (a successor waiting to be
    elected does not yet); a worker agent only while it hosts that head,
    which only the first node of the named worker allocation does."""
    if pointer != own_job:
        return False
    return role == "head" or hosted_ready


def walltime_drain(f: WalltimeFacts) -> DrainRequested | None:
    """The drain to start now, or None.

    None when the agent does not serve the head, is not JOINED (a drain is
    already under way, or the head is not up), has a pre-walltime signal
    (that signal is its hand-over, and draining earlier would move the head
    minutes before it must), or its end is unknown or further away than
    ``lead``. The deadline is the one a pre-walltime signal would get: until
    shortly before the end, so the old head serves until the new one is up.
    """
    if not (f.serves_head and f.joined) or f.has_signal or f.end_time is None:
        return None
    left = f.end_time - f.now
    if left > f.lead:
        return None
    deadline = drain_deadline_for_signal(f.now, JobState.RUNNING, f.end_time)
    return DrainRequested(f.now, deadline, f"walltime in {max(0.0, left):.0f}s and no pre-walltime signal "
                                           f"(head drained {f.lead:.0f}s ahead)")


__all__ = ["DEFAULT_HEAD_DRAIN_LEAD", "WalltimeFacts", "serves_head", "walltime_drain"]
