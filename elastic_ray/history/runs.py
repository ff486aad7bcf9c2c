"""A run's history from its events: allocations, node intervals, head periods, elections, payloads.

:func:`build` is the one reader every view shares (the timeline, the usage
figures), so they agree on what happened. It works on whatever the log
still holds: the event log is bounded and can lose its oldest file, a
writer can die before its line, and clocks of different hosts differ a
little. So it never raises on odd input: an event that names no job where
one is needed is ignored, a detail of the wrong type reads as unknown, and
a field no event told about stays ``None``. Events are taken in time order
(a stable sort: lines of one writer keep their order on a tie).

An interval still open at ``now`` (a node that has not left, a head still
serving, a payload still running) is closed at ``now`` and marked ``open``;
an allocation's ``ended_at`` stays ``None`` while it lives, since its end
is a fact, not a bound.

Pure: a function of the events and ``now``, touching no file or clock.
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ..protocol.disk.events import Event, EventKind


class Role(str, enum.Enum):
    HEAD = "head"
    WORKER = "worker"

    def __str__(self) -> str:
        return self.value


class Ending(str, enum.Enum):
    """How an allocation ended: as asked (``removed``) or on its own (``failed``)."""

    REMOVED = "removed"
    FAILED = "failed"

    def __str__(self) -> str:
        return self.value


class HeadChange(str, enum.Enum):
    """How a job became the run's head."""

    FIRST = "first"          # the run's first head allocation
    ELECTED = "elected"      # an election named it
    MOVED = "moved"          # ``ray_head`` was seen to name it (no election event: a standby, or a lost line)
    EARLIER = "earlier"      # only known as the ``previous`` head of a later change

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Allocation:
    """One Slurm job of the run. ``started_at`` is when its first node's agent began."""

    job: str
    role: Role | None = None
    partition: str | None = None
    nodes_requested: int | None = None
    gpus_per_node: int | None = None
    submitted_at: float | None = None
    started_at: float | None = None
    ended_at: float | None = None
    ended_how: Ending | None = None
    end_state: str | None = None        # the scheduler's state it ended in (CANCELLED, NODE_FAIL, …)
    end_reason: str | None = None
    replaces: str | None = None         # the job this one was submitted in place of

    @property
    def live(self) -> bool:
        return self.ended_at is None


@dataclass(frozen=True)
class NodeInterval:
    """One node of one allocation, from its agent's start to its leaving.

    ``left_at`` is ``now`` while the node is still there (``open``); a node
    whose allocation ended without its own ``node_left`` line left when the
    allocation ended (``left_reason`` None).
    """

    job: str
    node: str
    started_at: float | None = None
    joined_at: float | None = None
    draining_at: float | None = None
    left_at: float | None = None
    left_reason: str | None = None
    left_state: str | None = None       # the agent's final state: LEFT, RELEASED, FAILED
    open: bool = False
    gpu_idle_seconds: float | None = None   # measured by the agent (node_left), None when it was not


@dataclass(frozen=True)
class HeadPeriod:
    """``job`` hosted the run's head from ``since`` to ``until`` (``now`` while ``open``)."""

    job: str
    since: float | None
    until: float | None
    how: HeadChange
    open: bool = False


@dataclass(frozen=True)
class Election:
    started_at: float | None = None
    won_at: float | None = None
    winner: str | None = None
    previous: str | None = None         # the head that was lost
    reason: str | None = None


@dataclass(frozen=True)
class PayloadRun:
    name: str | None
    run_id: str | None
    started_at: float | None = None
    finished_at: float | None = None    # ``now`` while ``open``
    ok: bool | None = None
    open: bool = False


@dataclass(frozen=True)
class RunHistory:
    """Everything :func:`build` read, in time order within each kind."""

    now: float
    events: tuple[Event, ...] = ()
    allocations: tuple[Allocation, ...] = ()
    nodes: tuple[NodeInterval, ...] = ()
    head_periods: tuple[HeadPeriod, ...] = ()
    elections: tuple[Election, ...] = ()
    payloads: tuple[PayloadRun, ...] = ()
    session_id: str | None = None
    created_at: float | None = None
    ended_at: float | None = None

    @property
    def first_at(self) -> float | None:
        return self.events[0].at if self.events else None

    def allocation(self, job: str) -> Allocation | None:
        return next((a for a in self.allocations if a.job == job), None)

    def nodes_of(self, job: str) -> tuple[NodeInterval, ...]:
        return self._nodes_by_job.get(job, ())

    @functools.cached_property
    def _nodes_by_job(self) -> dict[str, tuple[NodeInterval, ...]]:
        # Built once per history: a run of thousands of allocations is asked job by job.
        by_job: dict[str, list[NodeInterval]] = {}
        for interval in self.nodes:
            by_job.setdefault(interval.job, []).append(interval)
        return {job: tuple(intervals) for job, intervals in by_job.items()}


# =============================================================== reading details

def _text(details: Mapping[str, Any], key: str) -> str | None:
    value = details.get(key)
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return str(int(value)) if float(value).is_integer() else None
    return value if isinstance(value, str) and value else None


def _count(details: Mapping[str, Any], key: str) -> int | None:
    """A non-negative whole number, given as one (or as its digits); anything else is unknown."""
    value = details.get(key)
    if isinstance(value, bool):
        return None
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value.strip())
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return value if isinstance(value, int) and value >= 0 else None


def _role(value: str | None) -> Role | None:
    return {"head": Role.HEAD, "worker": Role.WORKER}.get(value or "")


def _earliest(a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else min(a, b)


# =============================================================== the builder

@dataclass
class _Builder:
    now: float
    allocations: dict[str, Allocation] = field(default_factory=dict)
    nodes: list[NodeInterval] = field(default_factory=list)
    current: dict[tuple[str, str], int] = field(default_factory=dict)   # (job, node) -> index of its open interval
    # (job, node) -> the interval its allocation's end closed: the node's own late word still lands there
    closed_by_end: dict[tuple[str, str], int] = field(default_factory=dict)
    heads: list[HeadPeriod] = field(default_factory=list)
    elections: list[Election] = field(default_factory=list)
    payloads: list[PayloadRun] = field(default_factory=list)
    session_id: str | None = None
    created_at: float | None = None
    ended_at: float | None = None

    def allocation(self, job: str) -> Allocation:
        if job not in self.allocations:
            self.allocations[job] = Allocation(job=job)
        return self.allocations[job]

    def update(self, job: str, **fields: Any) -> None:
        self.allocations[job] = replace(self.allocation(job), **fields)

    def interval(self, job: str, node: str, at: float) -> int:
        """The node's open interval, a new one when it has none (its start line may be lost)."""
        index = self.current.get((job, node))
        if index is None:
            self.nodes.append(NodeInterval(job=job, node=node))
            index = self.current[(job, node)] = len(self.nodes) - 1
            self.update(job, started_at=_earliest(self.allocation(job).started_at, at))
        return index

    def stay(self, job: str, node: str, at: float) -> int:
        """The node's open interval or, once its allocation's end closed it, that one: a node's own
        drain or join line written after the coordinator saw its job end belongs to the same stay."""
        if (job, node) not in self.current and (job, node) in self.closed_by_end:
            return self.closed_by_end[(job, node)]
        return self.interval(job, node, at)

    def set_node(self, index: int, **fields: Any) -> None:
        self.nodes[index] = replace(self.nodes[index], **fields)

    def close_node(self, job: str, node: str, at: float, **fields: Any) -> None:
        index = self.interval(job, node, at)
        self.set_node(index, left_at=at, **fields)
        del self.current[(job, node)]

    def head_changes_to(self, job: str, at: float, how: HeadChange, previous: str | None) -> None:
        head = self.heads[-1] if self.heads else None
        if head is not None and head.until is None and head.job == job:
            # The same change told twice (an election_won and then its head_moved, or a
            # standby_promoted and then the election_won of the same election): an election
            # named it, whichever line came first.
            if how is HeadChange.ELECTED and head.how is HeadChange.MOVED:
                self.heads[-1] = replace(head, how=HeadChange.ELECTED)
            return
        if head is None and previous and previous != job:
            prior = self.allocations.get(previous)
            since = None if prior is None else prior.submitted_at or prior.started_at
            self.heads.append(HeadPeriod(job=previous, since=since, until=None, how=HeadChange.EARLIER))
        if self.heads and self.heads[-1].until is None:
            last = self.heads[-1]
            gone = self.allocations.get(last.job)
            ended = None if gone is None else gone.ended_at
            until = ended if ended is not None and ended <= at and (last.since is None or ended >= last.since) else at
            self.heads[-1] = replace(last, until=until)
        self.heads.append(HeadPeriod(job=job, since=at, until=None, how=how))

    # ------------------------------------------------------------------ one event

    def take(self, event: Event) -> None:
        kind, job, node, details, at = event.kind, event.job, event.node, event.details, event.at
        if kind is EventKind.SESSION_CREATED:
            self.session_id = _text(details, "session_id") or self.session_id
            self.created_at = _earliest(self.created_at, at)
        elif kind is EventKind.SESSION_ENDED:
            self.ended_at = at
        elif kind in (EventKind.PAYLOAD_STARTED, EventKind.PAYLOAD_FINISHED):
            self.payload(event)
        elif kind is EventKind.ELECTION_STARTED:
            self.elections.append(Election(started_at=at, previous=_text(details, "previous"), reason=event.reason))
        elif kind in (EventKind.ELECTION_WON, EventKind.HEAD_MOVED, EventKind.STANDBY_PROMOTED):
            if job is None:
                return
            previous = _text(details, "previous")
            if kind is EventKind.ELECTION_WON:
                self.won(job, at, previous)
            self.head_changes_to(job, at, HeadChange.ELECTED if kind is EventKind.ELECTION_WON else HeadChange.MOVED,
                                 previous)
        elif job is not None:
            self.job_event(event, job, node, details, at)

    def job_event(self, event: Event, job: str, node: str | None, details: Mapping[str, Any], at: float) -> None:
        kind = event.kind
        if kind is EventKind.SUBMITTED:
            before = self.allocation(job)
            role = _role(_text(details, "role")) or before.role
            self.update(job, role=role, partition=_text(details, "partition") or before.partition,
                        nodes_requested=_count(details, "nodes"), gpus_per_node=_count(details, "gpus_per_node"),
                        submitted_at=_earliest(before.submitted_at, at),
                        replaces=_text(details, "replaces") or before.replaces)
            if role is Role.HEAD and not self.heads:
                self.heads.append(HeadPeriod(job=job, since=at, until=None, how=HeadChange.FIRST))
        elif kind is EventKind.RESUBMITTED:
            self.update(job, replaces=_text(details, "replaces") or self.allocation(job).replaces)
        elif kind is EventKind.STARTED and node is not None:
            index = self.interval(job, node, at)
            self.set_node(index, started_at=_earliest(self.nodes[index].started_at, at))
            if self.allocation(job).role is None:
                self.update(job, role=_role(_text(details, "role")))
            if self.allocation(job).role is Role.HEAD and not self.heads:     # its submission line is lost
                self.heads.append(HeadPeriod(job=job, since=at, until=None, how=HeadChange.FIRST))
        elif kind is EventKind.NODE_JOINED and node is not None:
            index = self.stay(job, node, at)
            if self.nodes[index].joined_at is None:
                self.set_node(index, joined_at=at)
        elif kind is EventKind.DRAIN_REQUESTED:
            targets = [node] if node is not None else [n for (j, n) in self.current if j == job]
            for target in targets:
                index = self.stay(job, target, at)
                if self.nodes[index].draining_at is None:
                    self.set_node(index, draining_at=at)
        elif kind is EventKind.NODE_LEFT and node is not None:
            idle = details.get("gpu_idle_seconds")
            left = dict(left_reason=event.reason, left_state=_text(details, "state"),
                        gpu_idle_seconds=float(idle) if isinstance(idle, (int, float))
                        and not isinstance(idle, bool) and idle >= 0 else None)
            late = self.closed_by_end.pop((job, node), None) if (job, node) not in self.current else None
            if late is not None:
                # The coordinator saw the job end (COMPLETING) a moment before the agent said it left:
                # the same stay, ended by the agent's own line, not a second one with no start.
                self.set_node(late, left_at=max(self.nodes[late].left_at or at, at), **left)
            else:
                self.close_node(job, node, at, **left)
        elif kind in (EventKind.REMOVED, EventKind.FAILED):
            if self.allocation(job).ended_at is None:
                self.update(job, ended_at=at, ended_how=Ending.REMOVED if kind is EventKind.REMOVED else Ending.FAILED,
                            end_state=_text(details, "state"), end_reason=event.reason)
            for (j, n) in [key for key in self.current if key[0] == job]:
                self.closed_by_end[(j, n)] = self.current[(j, n)]
                self.close_node(j, n, at)
        # pending, drain_finished, standby_placed: on the event list, no interval of their own

    def won(self, job: str, at: float, previous: str | None) -> None:
        for index in range(len(self.elections) - 1, -1, -1):
            election = self.elections[index]
            if election.won_at is None:
                self.elections[index] = replace(election, won_at=at, winner=job,
                                                previous=election.previous or previous)
                return
        self.elections.append(Election(won_at=at, winner=job, previous=previous))     # its start line is lost

    def payload(self, event: Event) -> None:
        name, run_id = _text(event.details, "name"), _text(event.details, "run_id")
        if event.kind is EventKind.PAYLOAD_STARTED:
            self.payloads.append(PayloadRun(name=name, run_id=run_id, started_at=event.at))
            return
        ok = event.details.get("ok")
        ok = ok if isinstance(ok, bool) else None
        for index in range(len(self.payloads) - 1, -1, -1):
            run = self.payloads[index]
            same = run.run_id == run_id if (run.run_id or run_id) else run.name == name
            if same and run.finished_at is None:
                self.payloads[index] = replace(run, finished_at=event.at, ok=ok)
                return
        self.payloads.append(PayloadRun(name=name, run_id=run_id, finished_at=event.at, ok=ok))

    # ------------------------------------------------------------------ the end

    def finish(self, events: tuple[Event, ...]) -> RunHistory:
        end = self.now if self.ended_at is None else self.ended_at
        for (job, node), index in list(self.current.items()):
            begin = self.nodes[index].started_at or self.nodes[index].joined_at
            ended = self.allocations[job].ended_at      # a start line after its job's end (clocks differ)
            if ended is not None:
                self.set_node(index, left_at=max(ended, begin or ended))
            else:
                self.set_node(index, left_at=max(end, begin or end), open=self.ended_at is None)
        heads = []
        for index, head in enumerate(self.heads):
            if head.until is not None:
                heads.append(head)
                continue
            gone = self.allocations.get(head.job)
            if gone is not None and gone.ended_at is not None and (head.since is None or gone.ended_at >= head.since):
                heads.append(replace(head, until=gone.ended_at))
            else:
                heads.append(replace(head, until=end, open=self.ended_at is None))
        payloads = [replace(p, finished_at=end, open=self.ended_at is None) if p.finished_at is None and
                    p.started_at is not None else p for p in self.payloads]
        order = sorted(self.allocations.values(),
                       key=lambda a: (a.submitted_at if a.submitted_at is not None else
                                      a.started_at if a.started_at is not None else float("inf")))
        return RunHistory(now=self.now, events=events, allocations=tuple(order), nodes=tuple(self.nodes),
                          head_periods=tuple(heads), elections=tuple(self.elections), payloads=tuple(payloads),
                          session_id=self.session_id, created_at=self.created_at, ended_at=self.ended_at)


def build(events: Sequence[Event], now: float) -> RunHistory:
    """The run's history as the events tell it, open intervals closed at ``now``."""
    ordered = tuple(sorted((e for e in events if isinstance(e, Event)), key=lambda e: e.at))
    builder = _Builder(now=now)
    for event in ordered:
        builder.take(event)
    return builder.finish(ordered)
