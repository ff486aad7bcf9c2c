"""One line of a session's event log (``events.jsonl``): what happened, when, where, why.

The log is the run's history; the other records are its state. Every writer
(the coordinator, each agent, the CLI) appends one :class:`Event` a line, and
readers (``session events``, the timeline, the usage figures) decode them
back. This module is the line format and nothing else.

Pure: it encodes and decodes, and touches no file (``event_log`` does).

The format, version 1, one JSON object a line::

    {"v": 1, "at": 1764620000.123, "kind": "node_joined", "by": "agent",
     "job": "1234", "node": "gpu07", "reason": "raylet registered",
     "details": {"ray_node_id": "…"}}

``job``, ``node`` and ``reason`` may be absent; ``details`` holds flat
scalar fields only (str, int, float, bool, None). What each kind carries
(readers must accept a missing detail: older writers lack newer ones):

=================  ====  =====  ==========================  ====================================================
kind               job   node   reason                      details
=================  ====  =====  ==========================  ====================================================
session_created    -     -      -                           session_id, name, scheduler, layout
submitted          yes   -      -                           role (head/worker), spec_id, partition, nodes,
                                                            gpus_per_node, cpus_per_task
pending            yes   -      the scheduler's reason      -
started            yes   yes    -                           role, pid
node_joined        yes   yes    how the join was seen       ray_node_id, head_job, hosted (a hosted head's node)
node_left          yes   yes    why the agent ended         state (LEFT/RELEASED/FAILED), exit_code
drain_requested    yes   (yes)  signal, request or deadline -
drain_finished     yes   yes    -                           -
removed            yes   -      how it ended                state (a JobState)
failed             yes   -      how it ended unasked        state, resubmit (bool)
resubmitted        yes   -      -                           replaces (the failed job)
election_started   -     -      why                         previous (the lost head's job)
election_won       yes   -      -                           previous
head_moved         yes   -      -                           previous
standby_placed     yes   -      -                           -
standby_promoted   yes   -      -                           previous
scaler_decision    (yes) -      the decision's reason       action (submit/cancel/drain/wait), pool, partition,
                                                            raced, replaces (submit), unserved (wait)
autoscale_policy   -     -      set, or stopped             pools, min_allocations, max_nodes, idle_timeout
autoscale_lease    -     -      taken, taken over, released holder, previous (the holder before)
payload_started    -     -      -                           name, run_id
payload_finished   -     -      -                           name, run_id, ok
session_ended      -     -      -                           -
=================  ====  =====  ==========================  ==================================================== Readers skip a line they
cannot decode (a torn last line, a damaged one) and count it, and skip a
line of a newer version or of a kind they do not know: an older reader of a
newer run's log still shows everything it understands.
"""

from __future__ import annotations

import enum
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

EVENTS_VERSION = 1
MAX_LINE_BYTES = 2048       # one write() each; small enough for any filesystem's append to keep whole
MAX_REASON_CHARS = 300
MAX_DETAIL_CHARS = 200
MAX_DETAILS = 16

Scalar = str | int | float | bool | None


class EventKind(str, enum.Enum):
    """What happened. The value is what the line says."""

    SESSION_CREATED = "session_created"
    SUBMITTED = "submitted"                  # a job was handed to the scheduler (head or worker allocation)
    PENDING = "pending"                      # the scheduler holds it; ``reason`` says why (Slurm's Reason)
    STARTED = "started"                      # an agent began on one of the job's nodes
    NODE_JOINED = "node_joined"              # that node's Ray joined the run's head
    NODE_LEFT = "node_left"                  # that node's agent ended; ``reason`` says how
    DRAIN_REQUESTED = "drain_requested"      # someone asked the job (or a node) to drain
    DRAIN_FINISHED = "drain_finished"        # a node finished draining
    REMOVED = "removed"                      # the job is gone, as asked
    FAILED = "failed"                        # the job ended unasked (``reason``: its state)
    RESUBMITTED = "resubmitted"              # a replacement was submitted for a failed job
    ELECTION_STARTED = "election_started"
    ELECTION_WON = "election_won"            # ``job``: the new head
    ELECTION_FAILED = "election_failed"      # no head could be had (``reason``: what was missing)
    HEAD_MOVED = "head_moved"                # ``ray_head`` names a new job (``details.previous``)
    STANDBY_PLACED = "standby_placed"
    STANDBY_PROMOTED = "standby_promoted"
    SCALER_DECISION = "scaler_decision"      # one choice of the autoscaler, with its reason (issue 23)
    AUTOSCALE_POLICY = "autoscale_policy"    # a policy was set, or scaling stopped
    AUTOSCALE_LEASE = "autoscale_lease"      # a process began (or stopped) running the autoscaler
    OOM_KILLED = "oom_killed"                # the OOM killer ended processes of the job on a node (``kills``, ``new``)
    PAYLOAD_STARTED = "payload_started"      # a driver or Dagster step began on the run
    PAYLOAD_FINISHED = "payload_finished"
    SESSION_ENDED = "session_ended"

    def __str__(self) -> str:
        return self.value


_KINDS = {kind.value: kind for kind in EventKind}


class EventSource(str, enum.Enum):
    """Which kind of process wrote the line."""

    COORDINATOR = "coordinator"
    AGENT = "agent"
    CLI = "cli"
    DAGSTER = "dagster"

    def __str__(self) -> str:
        return self.value


_SOURCES = {source.value: source for source in EventSource}


@dataclass(frozen=True)
class Event:
    """One thing that happened to a run. ``at`` is Unix time in seconds."""

    at: float
    kind: EventKind
    by: EventSource
    job: str | None = None
    node: str | None = None
    reason: str | None = None
    details: Mapping[str, Scalar] = field(default_factory=lambda: MappingProxyType({}))

    def __post_init__(self) -> None:
        if not isinstance(self.at, (int, float)) or isinstance(self.at, bool) or not math.isfinite(self.at):
            raise ValueError(f"event at: {self.at!r} is not a finite time in seconds")
        if not isinstance(self.kind, EventKind):
            raise ValueError(f"event kind: {self.kind!r} is not an EventKind")
        if not isinstance(self.by, EventSource):
            raise ValueError(f"event by: {self.by!r} is not an EventSource")
        for name in ("job", "node", "reason"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                raise ValueError(f"event {name}: {value!r} is not a string")
        object.__setattr__(self, "details", MappingProxyType(dict(_clean_details(self.details))))

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"v": EVENTS_VERSION, "at": round(float(self.at), 3), "kind": self.kind.value,
                               "by": self.by.value}
        for name in ("job", "node"):
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        if self.reason is not None:
            out["reason"] = _clip(self.reason, MAX_REASON_CHARS)
        if self.details:
            out["details"] = dict(self.details)
        return out


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _clean_details(details: Mapping[str, Any]) -> list[tuple[str, Scalar]]:
    if not isinstance(details, Mapping):
        raise ValueError(f"event details: {type(details).__name__} is not a mapping")
    out: list[tuple[str, Scalar]] = []
    for key, value in details.items():
        if not isinstance(key, str) or not key:
            raise ValueError(f"event details: key {key!r} is not a non-empty string")
        if isinstance(value, float) and not math.isfinite(value):
            value = None
        elif isinstance(value, str):
            value = _clip(value, MAX_DETAIL_CHARS)
        elif isinstance(value, enum.Enum):
            value = str(value.value)
        elif value is not None and not isinstance(value, (bool, int, float)):
            raise ValueError(f"event details[{key!r}]: {type(value).__name__} is not a str, number, bool or None")
        out.append((key, value))
    return out[:MAX_DETAILS]


def encode(event: Event) -> bytes:
    """The event as one line, newline included, of at most :data:`MAX_LINE_BYTES`.

    A line that would be longer loses its details first, then its reason is
    cut: the line is always written whole, in one append.
    """
    data = event.to_dict()
    line = json.dumps(data, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode() + b"\n"
    if len(line) <= MAX_LINE_BYTES:
        return line
    data.pop("details", None)
    data["truncated"] = True
    line = json.dumps(data, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"
    if len(line) > MAX_LINE_BYTES:
        data["reason"] = _clip(str(data.get("reason", "")), 80)
        line = json.dumps(data, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"
    return line


class Skipped(str, enum.Enum):
    """Why a line was not decoded into an event."""

    DAMAGED = "damaged"          # not a JSON object of this format (a torn last line, say)
    NEWER = "newer"              # written by a newer elastic-ray
    UNKNOWN_KIND = "unknown_kind"


def decode(line: bytes | str) -> Event | Skipped:
    """One line back into an :class:`Event`, or why it was skipped."""
    try:
        data = json.loads(line)
    except (ValueError, UnicodeDecodeError):
        return Skipped.DAMAGED
    if not isinstance(data, dict):
        return Skipped.DAMAGED
    version = data.get("v")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        return Skipped.DAMAGED
    if version > EVENTS_VERSION:
        return Skipped.NEWER
    kind = _KINDS.get(data.get("kind"))  # type: ignore[arg-type]
    if kind is None:
        return Skipped.UNKNOWN_KIND if isinstance(data.get("kind"), str) else Skipped.DAMAGED
    by = _SOURCES.get(data.get("by"))  # type: ignore[arg-type]
    if by is None:
        return Skipped.DAMAGED
    details = data.get("details", {})
    try:
        return Event(at=data.get("at"), kind=kind, by=by, job=data.get("job"), node=data.get("node"),  # type: ignore[arg-type]
                     reason=data.get("reason"), details=details if isinstance(details, dict) else {})
    except ValueError:
        return Skipped.DAMAGED


def describe(event: Event) -> str:
    """One human line: ``<kind> job=<job> node=<node> <reason> k=v …`` (no time)."""
    parts = [event.kind.value]
    if event.job is not None:
        parts.append(f"job={event.job}")
    if event.node is not None:
        parts.append(f"node={event.node}")
    if event.reason:
        parts.append(repr(event.reason) if " " in event.reason else event.reason)
    parts.extend(f"{k}={v}" for k, v in event.details.items())
    return " ".join(parts)
