"""When an agent leaves because Slurm no longer runs its job here: pure, table-tested.

Why this exists: when a node's slurmd dies, Slurm marks the node DOWN after
``SlurmdTimeout`` and requeues the job (or ends it), but nobody on the node
tells the job's own processes. slurmstepd, the agent and its Ray node keep
running and serving work for a job that Slurm shows as PENDING; when slurmd
comes back it kills them with SIGKILL, which no process can log.

The agent must not learn this by asking slurmctld now and then: hundreds of
agents polling ``squeue`` would load the controller more than the session
itself may (about one query per 10 s). So it watches the one thing it can see
for free, whether its own node's slurmd still listens, and asks the scheduler
about its job only while slurmd is gone:

* not before slurmd has been gone ``SlurmdTimeout`` seconds (Slurm cannot
  have requeued the job before it marks the node down; a slurmd restart
  during maintenance therefore costs the controller nothing), and at least
  ``ASK_GRACE`` seconds;
* then again after 10, 20, 30 and every 60 s while slurmd stays gone.

What the answer means is :func:`verdict`; when to look and when to ask is
:func:`plan`; the ``slurm.conf`` facts both need are :func:`read_slurmd_conf`.
The effects (the listener probe, the lookup thread) are ``agent.slurm.slurmd_watch``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ... import defaults
from ...config.slurm_values import expand_hostlist
from ...scheduler.base import JobInfo, JobState

#: Slurm's defaults (slurm.conf(5)): slurmd's port, and how long slurmctld
#: waits for a silent slurmd before it sets the node DOWN.
DEFAULT_SLURMD_PORT = 6818
DEFAULT_SLURMD_TIMEOUT = 300.0
#: Seconds between two looks at the local slurmd while it answers
#: (``ELASTIC_AGENT_SLURMD_CHECK``; 0 turns the check off).
DEFAULT_CHECK_INTERVAL = defaults.SLURMD_CHECK_INTERVAL
#: slurmd must be gone at least this long before the scheduler is asked: a
#: restarted slurmd listens again within a second or two.
ASK_GRACE = 10.0
#: Delays between lookups while slurmd stays gone; the last one repeats.
ASK_DELAYS = (10.0, 20.0, 30.0, 60.0)


@dataclass(frozen=True)
class SlurmdConf:
    """What the agent needs from ``slurm.conf`` about its node's slurmd."""

    port: int = DEFAULT_SLURMD_PORT
    slurmd_timeout: float = DEFAULT_SLURMD_TIMEOUT


_TOKEN = re.compile(r"(\w+)=(\S+)")


def read_slurmd_conf(text: str, node: str) -> SlurmdConf:
    """The slurmd port and ``SlurmdTimeout`` for ``node`` from slurm.conf's text.

    The port is the node's own ``Port=`` (sites with several slurmds on one
    host), else that of a ``NodeName=DEFAULT`` line before it, else
    ``SlurmdPort``, else 6818. Keys are case-insensitive, as Slurm reads
    them; a value that is not a number keeps the default (the check is a
    best effort and must not stop an agent). ``Include`` lines are not
    followed: a site that keeps these keys elsewhere sets
    ``ELASTIC_AGENT_SLURMD_PORT``.
    """
    slurmd_port: int | None = None
    timeout: float | None = None
    default_port: int | None = None
    node_port: int | None = None
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        tokens = {key.lower(): value for key, value in _TOKEN.findall(line)}
        if "nodename" in tokens:
            port = _int(tokens.get("port"))
            names = tokens["nodename"]
            if names.upper() == "DEFAULT":
                default_port = port if port is not None else default_port
            elif node_port is None and node in _names(names):
                node_port = port if port is not None else default_port
            continue
        if "slurmdport" in tokens:
            slurmd_port = _int(tokens["slurmdport"])
        if "slurmdtimeout" in tokens:
            value = _int(tokens["slurmdtimeout"])
            timeout = float(value) if value is not None else timeout
    port = node_port or default_port or slurmd_port or DEFAULT_SLURMD_PORT
    return SlurmdConf(port=port, slurmd_timeout=DEFAULT_SLURMD_TIMEOUT if timeout is None else timeout)


def _int(value: str | None) -> int | None:
    if value is None or not value.isdigit():
        return None
    return int(value)


def _names(hostlist: str) -> tuple[str, ...]:
    try:
        return expand_hostlist(hostlist)
    except ValueError:
        return ()


@dataclass(frozen=True)
class Plan:
    """``ask``: look the job up in the scheduler now; ``next_check_in``:
    seconds until the next look at slurmd."""

    ask: bool
    next_check_in: float


def plan(slurmd_up: bool, down_for: float, asked: int, interval: float, slurmd_timeout: float) -> Plan:
    """What to do after one look at the local slurmd.

    ``down_for``: seconds since the first look that found slurmd gone in this
    outage (0 when it answered); ``asked``: lookups already made in it.
    While slurmd answers, look again after ``interval``. While it is gone,
    look at least as often (to notice it coming back) and ask once
    ``down_for`` reached ``max(ASK_GRACE, slurmd_timeout)``, then after each
    of :data:`ASK_DELAYS`. A ``slurmd_timeout`` of 0 (Slurm never sets a
    silent node DOWN) leaves only the grace.
    """
    if slurmd_up:
        return Plan(False, interval)
    first = max(ASK_GRACE, slurmd_timeout)
    if down_for < first:
        return Plan(False, min(interval, first - down_for))
    return Plan(True, ASK_DELAYS[min(asked, len(ASK_DELAYS) - 1)])


@dataclass(frozen=True)
class Verdict:
    """``leave``: Slurm no longer runs the job on this node; ``reason``: one
    sentence for the log and for the node's final state."""

    leave: bool
    reason: str


def verdict(job_id: str, node: str, info: JobInfo | None) -> Verdict:
    """What the scheduler's answer about this agent's job means for it.

    ``info`` None: the scheduler did not answer (slurmctld unreachable too,
    or the lookup failed): stay, since leaving on no answer would empty a
    node whose job may be fine. RUNNING (or SUSPENDED) with this node among
    its nodes: Slurm still counts on this node, stay. Anything else means
    the job no longer runs here: PENDING (requeued after the node went
    down), ending or ended, unknown, or running on other nodes.
    """
    if info is None:
        return Verdict(False, f"slurmd on {node} does not answer and the scheduler did not say how job "
                              f"{job_id} is; still serving")
    state = info.state
    here = not info.nodes or node in info.nodes
    if state in (JobState.RUNNING, JobState.SUSPENDED) and here:
        return Verdict(False, f"job {job_id} is still {state.value} on {node} in Slurm although slurmd there "
                              "does not answer; still serving")
    if state in (JobState.RUNNING, JobState.SUSPENDED):
        where = ",".join(info.nodes)
        return Verdict(True, f"job {job_id} is {state.value} in Slurm on {where}, not on {node}; leaving")
    if state is JobState.PENDING:
        why = f", reason {info.reason}" if info.reason and info.reason not in ("None", "(null)") else ""
        return Verdict(True, f"job {job_id} is PENDING in Slurm (requeued while slurmd on {node} was gone{why}); "
                             "leaving")
    if state is JobState.ENDED_UNKNOWN:
        return Verdict(True, f"job {job_id} is no longer known to Slurm (it ended); leaving")
    return Verdict(True, f"job {job_id} is {state.value} in Slurm; leaving")


__all__ = ["ASK_DELAYS", "ASK_GRACE", "DEFAULT_CHECK_INTERVAL", "DEFAULT_SLURMD_PORT", "DEFAULT_SLURMD_TIMEOUT",
           "Plan", "SlurmdConf", "Verdict", "plan", "read_slurmd_conf", "verdict"]
