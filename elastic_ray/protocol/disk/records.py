"""Typed records stored in the session directory, validated on every read.

Each record has ``to_dict`` (what we write) and ``from_dict`` (what we accept):
``from_dict`` raises ``ValueError`` naming the bad key, and the session
directory turns that into ``CorruptFileError`` with the file's path. A reader
therefore either gets a well-formed record or a clear report, never a
``KeyError`` deep inside the coordinator.

Why one module of about 600 lines: it is the whole on-disk format of a
session, read by agents of one version and coordinators of another. Keeping
every record, the one field reader (``_get``) and the one version rule
together means a reviewer sees in one file everything a change to the wire
format touches, and no record can drift from the shared checks.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

from ... import knobs

# Job ids and names follow the one Slurm vocabulary (config/slurm_values.py);
# re-exported here for the session directory and the CLI, which read records.
from ...config.slurm_values import check_job_id, check_job_name, is_job_id  # noqa: F401
# Defined in errors (its docstring says why); ``X as X`` keeps it importable from here, for type checkers too.
from ...errors import NewerProtocolError as NewerProtocolError

PROTOCOL_VERSION = 1


def _get(data: Mapping[str, Any], key: str, kinds: type | tuple[type, ...], *, optional: bool = False) -> Any:
    if not isinstance(data, Mapping):
        raise ValueError(f"expected an object, got {type(data).__name__}")
    if key not in data:
        if optional:
            return None
        raise ValueError(f"missing key {key!r}")
    value = data[key]
    if value is None and optional:
        return None
    if isinstance(value, bool) and bool not in (kinds if isinstance(kinds, tuple) else (kinds,)):
        raise ValueError(f"{key!r} must not be a boolean")
    if not isinstance(value, kinds):
        raise ValueError(f"{key!r} has type {type(value).__name__}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{key!r} must be finite")
    return value


# ---------------------------------------------------------------- session.json

@dataclass(frozen=True)
class SessionInfo:
    """session.json: written once when the session is created, never changed.

    ``head`` and ``worker_allocation`` are config dicts (see
    ``SlurmRunAllocationConfig.to_dict``); ``launcher`` is the launcher's
    settings; ``scheduler`` says which backend ({"kind": "slurm"} or
    {"kind": "local", "state_dir": ...}). ``user`` is who submits the
    session's jobs: queries and cancels are limited to that user's jobs
    (None in sessions created before it was recorded: the process's user).
    ``agent_env`` is the creating process's ``ELASTIC_AGENT_*`` variables,
    which every job of the session forwards to its nodes, whoever submits
    it (None in sessions created before it was recorded: the submitting
    process's own).
    """

    session_id: str
    job_name: str
    created_at: float
    scheduler: Mapping[str, Any]
    head: Mapping[str, Any]
    ray_head_only: bool = True
    worker_allocation: Mapping[str, Any] | None = None
    launcher: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    protocol_version: int = PROTOCOL_VERSION
    user: str | None = None
    agent_env: Mapping[str, str] | None = None

    def __post_init__(self) -> None:
        if self.agent_env is not None:
            object.__setattr__(self, "agent_env", MappingProxyType(_check_agent_env(self.agent_env)))

    def to_dict(self) -> dict[str, Any]:
        data = {
            "protocol_version": self.protocol_version,
            "session_id": self.session_id,
            "job_name": self.job_name,
            "created_at": self.created_at,
            "scheduler": dict(self.scheduler),
            "head": dict(self.head),
            "ray_head_only": self.ray_head_only,
            "worker_allocation": None if self.worker_allocation is None else dict(self.worker_allocation),
            "launcher": dict(self.launcher),
        }
        if self.user is not None:
            data["user"] = self.user
        if self.agent_env is not None:
            data["agent_env"] = dict(self.agent_env)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "SessionInfo":
        version = check_protocol_version(data)
        scheduler = _get(data, "scheduler", dict)
        if scheduler.get("kind") not in ("slurm", "local"):
            raise ValueError(f"scheduler.kind {scheduler.get('kind')!r} is not 'slurm' or 'local'")
        return cls(
            session_id=_get(data, "session_id", str),
            job_name=check_job_name(_get(data, "job_name", str)),
            created_at=float(_get(data, "created_at", (int, float))),
            scheduler=MappingProxyType(dict(scheduler)),
            head=MappingProxyType(dict(_get(data, "head", dict))),
            ray_head_only=_get(data, "ray_head_only", bool),
            worker_allocation=(None if (w := _get(data, "worker_allocation", dict, optional=True)) is None
                               else MappingProxyType(dict(w))),
            launcher=MappingProxyType(dict(_get(data, "launcher", dict))),
            protocol_version=version,
            # Added compatibly: sessions created before them have no key.
            user=_get(data, "user", str, optional=True) or None,
            agent_env=_get(data, "agent_env", dict, optional=True),
        )


def _check_agent_env(env: Mapping[str, Any]) -> dict[str, str]:
    """``SessionInfo.agent_env``: string values, under ``ELASTIC_AGENT_*`` names only."""
    if not isinstance(env, Mapping):
        raise ValueError(f"'agent_env' has type {type(env).__name__}")
    for name, value in env.items():
        if not isinstance(name, str) or not name.startswith(knobs.AGENT_PREFIX) or not isinstance(value, str):
            raise ValueError(f"agent_env[{name!r}]: must be a string under a {knobs.AGENT_PREFIX}* name")
    return dict(env)


# ---------------------------------------------------------------- allocation.json

class WorkerIntent(str, enum.Enum):
    """What the session means for a worker allocation (not Slurm's state):
    a ``str`` enum, so a caller comparing with the plain strings keeps working."""

    SUBMITTED = "submitted"
    DRAINING = "draining"      # a drain was requested
    REMOVED = "removed"

    def __str__(self) -> str:   # printed and formatted as the plain value, as before
        return self.value


WORKER_STATES = tuple(intent.value for intent in WorkerIntent)


@dataclass(frozen=True)
class AllocationEnding:
    """How a worker allocation's job ended without the session asking for it.

    Recorded once (the first process whose compare-and-swap commits it), so
    every process, a restarted supervisor and the CLI can tell a failed
    allocation from a live one long after the scheduler forgot the job.
    ``state`` is the scheduler's final state (FAILED, NODE_FAIL, ...),
    ``reason`` its reason text, ``nodes`` the nodes the job held.
    """

    state: str
    noticed_at: float
    reason: str = ""
    nodes: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"state": self.state, "reason": self.reason, "noticed_at": self.noticed_at,
                "nodes": list(self.nodes)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "AllocationEnding":
        state = _get(data, "state", str)
        if not state:
            raise ValueError("'state' must not be empty")
        nodes = _get(data, "nodes", list, optional=True) or []
        for i, node in enumerate(nodes):
            if not isinstance(node, str):
                raise ValueError(f"nodes[{i}] has type {type(node).__name__}")
        return cls(state=state, noticed_at=float(_get(data, "noticed_at", (int, float))),
                   reason=_get(data, "reason", str, optional=True) or "", nodes=tuple(nodes))


@dataclass(frozen=True)
class WorkerRecord:
    """One worker allocation as the session remembers it.

    ``state`` is the session's intent, not Slurm's state (ask the scheduler
    for that): submitted, draining (a drain was requested) or removed.
    ``hosts_run_head``: submitted to host the run's head and compute (the
    default layout's first allocation, or a successor shaped like it), not
    added by the user; ``Session.worker_allocations`` leaves it out.

    Added compatibly (written only when set, read as their defaults when
    absent): ``ended``, how the job ended without the session asking;
    ``resubmit_on_failure``, how many more times the session submits the
    same config again when it fails; ``replaces``/``replaced_by``, the
    allocation this one was resubmitted for, and the one resubmitted for it.
    """

    job_id: str
    config: Mapping[str, Any]
    submitted_at: float
    state: WorkerIntent = WorkerIntent.SUBMITTED
    drain_requested_at: float | None = None
    drain_deadline: float | None = None
    head_failures: int = 0
    hosts_run_head: bool = False
    ended: AllocationEnding | None = None
    resubmit_on_failure: int = 0
    replaces: str | None = None
    replaced_by: str | None = None

    def __post_init__(self) -> None:
        # Callers may pass the plain string ("removed"); the record holds the enum.
        object.__setattr__(self, "state", WorkerIntent(self.state))

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "job_id": self.job_id,
            "config": dict(self.config),
            "submitted_at": self.submitted_at,
            "state": self.state.value,
            "drain_requested_at": self.drain_requested_at,
            "drain_deadline": self.drain_deadline,
            "head_failures": self.head_failures,
            "hosts_run_head": self.hosts_run_head,
        }
        if self.ended is not None:
            data["ended"] = self.ended.to_dict()
        if self.resubmit_on_failure:
            data["resubmit_on_failure"] = self.resubmit_on_failure
        if self.replaces is not None:
            data["replaces"] = self.replaces
        if self.replaced_by is not None:
            data["replaced_by"] = self.replaced_by
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "WorkerRecord":
        state = _get(data, "state", str)
        if state not in WORKER_STATES:
            raise ValueError(f"state {state!r} is not one of {WORKER_STATES}")
        failures = _get(data, "head_failures", int)
        if failures < 0:
            raise ValueError("head_failures must not be negative")
        drain_at = _get(data, "drain_requested_at", (int, float), optional=True)
        deadline = _get(data, "drain_deadline", (int, float), optional=True)
        # Added in a compatible way: records written before it have no key.
        hosts_run_head = _get(data, "hosts_run_head", bool, optional=True) or False
        ended = _get(data, "ended", dict, optional=True)
        resubmit = _get(data, "resubmit_on_failure", int, optional=True) or 0
        if resubmit < 0:
            raise ValueError("resubmit_on_failure must not be negative")
        replaces = _get(data, "replaces", str, optional=True)
        replaced_by = _get(data, "replaced_by", str, optional=True)
        return cls(
            job_id=check_job_id(_get(data, "job_id", str)),
            config=MappingProxyType(dict(_get(data, "config", dict))),
            submitted_at=float(_get(data, "submitted_at", (int, float))),
            state=WorkerIntent(state),
            drain_requested_at=None if drain_at is None else float(drain_at),
            drain_deadline=None if deadline is None else float(deadline),
            head_failures=failures,
            hosts_run_head=hosts_run_head,
            ended=None if ended is None else _nested("ended", lambda: AllocationEnding.from_dict(ended)),
            resubmit_on_failure=resubmit,
            replaces=None if replaces is None else check_job_id(replaces, "replaces"),
            replaced_by=None if replaced_by is None else check_job_id(replaced_by, "replaced_by"),
        )


@dataclass(frozen=True)
class ElectionClaim:
    """An election in progress. It expires so that a dead elector blocks the
    next election for a bounded time only."""

    claimant: str
    since: float
    expires: float

    def is_live(self, now: float) -> bool:
        return now < self.expires

    def to_dict(self) -> dict[str, Any]:
        return {"claimant": self.claimant, "since": self.since, "expires": self.expires}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "ElectionClaim":
        since = float(_get(data, "since", (int, float)))
        expires = float(_get(data, "expires", (int, float)))
        if expires < since:
            raise ValueError("expires is before since")
        return cls(claimant=_get(data, "claimant", str), since=since, expires=expires)


@dataclass(frozen=True)
class SubmissionIntent:
    """A submission recorded *before* sbatch runs, keyed by its marker.

    The marker goes to Slurm as the job's comment, so a job that was queued
    although the submitter never learnt its id (sbatch timed out, printed
    something else, the process died) is found by it and adopted or
    cancelled (see ``coordinator.allocations.ownership``). ``config`` is the resolved
    allocation config, ``spec_path`` the worker spec file if any.
    ``failed_at``/``error``: the submitter saw sbatch fail and found no job.
    """

    marker: str
    role: AgentRole
    config: Mapping[str, Any]
    created_at: float
    spec_path: str | None = None
    failed_at: float | None = None
    error: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "role", AgentRole(self.role))

    def to_dict(self) -> dict[str, Any]:
        return {"marker": self.marker, "role": self.role.value, "config": dict(self.config),
                "created_at": self.created_at, "spec_path": self.spec_path,
                "failed_at": self.failed_at, "error": self.error}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "SubmissionIntent":
        role = _get(data, "role", str)
        if role not in AGENT_ROLES:
            raise ValueError(f"'role': {role!r} is not one of {', '.join(AGENT_ROLES)}")
        failed_at = _get(data, "failed_at", (int, float), optional=True)
        return cls(
            marker=_get(data, "marker", str),
            role=AgentRole(role),
            config=MappingProxyType(dict(_get(data, "config", dict))),
            created_at=float(_get(data, "created_at", (int, float))),
            spec_path=_get(data, "spec_path", str, optional=True),
            failed_at=None if failed_at is None else float(failed_at),
            error=_get(data, "error", str, optional=True),
        )


@dataclass(frozen=True)
class AllocationRecord:
    """allocation.json: the session's mutable record.

    ``generation`` grows by one on every write, so a reader can tell that the
    record changed and tests can check that no update was lost.
    """

    generation: int = 0
    head_job: str | None = None
    workers: Mapping[str, WorkerRecord] = field(default_factory=lambda: MappingProxyType({}))
    predecessors: tuple[str, ...] = ()
    election: ElectionClaim | None = None
    successor: str | None = None
    intents: Mapping[str, SubmissionIntent] = field(default_factory=lambda: MappingProxyType({}))
    #: the autoscaler's lease (issue 23): which process runs the session's
    #: autoscaler, until when; the same shape as an election claim
    autoscaler: ElectionClaim | None = None

    def with_worker(self, worker: WorkerRecord) -> "AllocationRecord":
        workers = dict(self.workers)
        workers[worker.job_id] = worker
        return replace(self, workers=MappingProxyType(workers))

    def with_intent(self, intent: SubmissionIntent) -> "AllocationRecord":
        intents = dict(self.intents)
        intents[intent.marker] = intent
        return replace(self, intents=MappingProxyType(intents))

    def without_intents(self, markers: Collection[str]) -> "AllocationRecord":
        if not any(m in self.intents for m in markers):
            return self
        return replace(self, intents=MappingProxyType({m: i for m, i in self.intents.items() if m not in markers}))

    @property
    def recorded_jobs(self) -> frozenset[str]:
        """Every job id the session recorded as its own, whatever its role."""
        ids = set(self.workers) | set(self.predecessors)
        ids.update(j for j in (self.head_job, self.successor) if j)
        return frozenset(ids)

    def to_dict(self) -> dict[str, Any]:
        return {
            "protocol_version": PROTOCOL_VERSION,
            "generation": self.generation,
            "head_job": self.head_job,
            "workers": {job: rec.to_dict() for job, rec in sorted(self.workers.items(), key=lambda kv: int(kv[0]))},
            "predecessors": list(self.predecessors),
            "election": None if self.election is None else self.election.to_dict(),
            "successor": self.successor,
        } | ({"intents": {m: i.to_dict() for m, i in sorted(self.intents.items())}} if self.intents else {}) \
          | ({"autoscaler": self.autoscaler.to_dict()} if self.autoscaler is not None else {})

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "AllocationRecord":
        check_protocol_version(data)
        generation = _get(data, "generation", int)
        if generation < 0:
            raise ValueError("generation must not be negative")
        head = _get(data, "head_job", str, optional=True)
        workers_raw = _get(data, "workers", dict)
        workers: dict[str, WorkerRecord] = {}
        for key, value in workers_raw.items():
            try:
                rec = WorkerRecord.from_dict(value)
            except ValueError as exc:
                raise ValueError(f"workers[{key!r}]: {exc}") from None
            if rec.job_id != key:
                raise ValueError(f"workers[{key!r}] holds job {rec.job_id}")
            workers[key] = rec
        predecessors = _get(data, "predecessors", list)
        election = _get(data, "election", dict, optional=True)
        successor = _get(data, "successor", str, optional=True)
        # Added compatibly: absent in records written before it (and by older writers).
        intents_raw = _get(data, "intents", dict, optional=True) or {}
        intents: dict[str, SubmissionIntent] = {}
        for key, value in intents_raw.items():
            intent = _nested(f"intents[{key!r}]", lambda v=value: SubmissionIntent.from_dict(v))
            if intent.marker != key:
                raise ValueError(f"intents[{key!r}] holds marker {intent.marker!r}")
            intents[key] = intent
        # Added compatibly too: only a session that autoscales writes it.
        lease = _get(data, "autoscaler", dict, optional=True)
        return cls(
            generation=generation,
            head_job=None if head is None else check_job_id(head, "head_job"),
            workers=MappingProxyType(workers),
            predecessors=tuple(check_job_id(p, "predecessors[]") for p in predecessors),
            election=None if election is None else ElectionClaim.from_dict(election),
            successor=None if successor is None else check_job_id(successor, "successor"),
            intents=MappingProxyType(intents),
            autoscaler=None if lease is None else _nested("autoscaler", lambda: ElectionClaim.from_dict(lease)),
        )


# ---------------------------------------------------------------- jobs/<id>/head.json

@dataclass(frozen=True)
class HeadEndpoint:
    """Where a ready Ray head listens. Written once the head answers, so a
    worker never reads a half-started head."""

    job_id: str
    host: str
    address: str  # "ip:port" of the GCS
    ray_version: str
    started_at: float
    ports: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    # The head's kernel (/proc/sys/kernel/random/boot_id): workers on the same
    # kernel share its CPUs and let the hosting node rejoin first
    # (agent.head.rejoin_order). "" from agents that predate it.
    boot_id: str = ""
    # "ip:port" of the head's Ray dashboard; None when the launcher has it
    # off, and in records of agents that predate the field (no key either way).
    dashboard: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out = {
            "job_id": self.job_id, "host": self.host, "address": self.address,
            "ray_version": self.ray_version, "started_at": self.started_at, "ports": dict(self.ports),
        }
        if self.boot_id:
            out["boot_id"] = self.boot_id
        if self.dashboard is not None:
            out["dashboard"] = self.dashboard
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "HeadEndpoint":
        address = _host_port(data, "address")
        dashboard = _host_port(data, "dashboard") if data.get("dashboard") is not None else None
        ports = _get(data, "ports", dict)
        for name, value in ports.items():
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 65536:
                raise ValueError(f"ports[{name!r}] is not a port number")
        return cls(
            job_id=check_job_id(_get(data, "job_id", str)),
            host=_get(data, "host", str),
            address=address,
            ray_version=_get(data, "ray_version", str),
            started_at=float(_get(data, "started_at", (int, float))),
            ports=MappingProxyType(dict(ports)),
            boot_id=_get(data, "boot_id", str) if "boot_id" in data else "",
            dashboard=dashboard,
        )


def _host_port(data: Mapping[str, Any], key: str) -> str:
    """A ``host:port`` string (the host part non-empty, the port 1-65535)."""
    value = _get(data, key, str)
    hostpart, _, port = value.rpartition(":")
    if not hostpart or not (port.isascii() and port.isdigit()) or not 0 < int(port) < 65536:
        raise ValueError(f"{key} {value!r} is not host:port")
    return value


# ---------------------------------------------------------------- protocol versions

def check_protocol_version(data: Mapping[str, Any], *, missing: int | None = None) -> int:
    """The record's protocol version; refuses one newer than this code.

    The version is a major number, an int: session.json and allocation.json
    have carried ``1`` from the start, and changing its form would make every
    existing session unreadable. Readers ignore keys they do not know, so a
    compatible addition keeps the number; only a change an older reader would
    misread raises it. An older or equal version is read (each ``from_dict``
    knows every layout up to ours); a newer one is refused with a message that
    says to upgrade. ``missing`` is the version a record written before it
    carried the field implies; None makes the field required.
    """
    if missing is not None and isinstance(data, Mapping) and "protocol_version" not in data:
        return missing
    version = _get(data, "protocol_version", int)
    if version < 1:
        raise ValueError(f"protocol_version {version} is not a protocol version (the first is 1)")
    if version > PROTOCOL_VERSION:
        raise NewerProtocolError(
            f"protocol_version {version}: written by a newer elastic-ray (protocol {version}); "
            f"this one speaks protocol {PROTOCOL_VERSION}; upgrade elastic-ray here to read it")
    return version


# ---------------------------------------------------------------- jobs/<id>/nodes/<host>.json

class AgentState(str, enum.Enum):
    """An agent's state: the states of its machine (``agent.machine``, which
    uses this enum itself) as it publishes them in its node file and status.

    Defined here because protocol must not import the agent, and both sides
    read it. Adding a state changes the protocol's major version: readers
    decide on it.
    """

    WAITING_FOR_HEAD = "WAITING_FOR_HEAD"
    STARTING = "STARTING"
    JOINED = "JOINED"
    RESTART_BACKOFF = "RESTART_BACKOFF"
    GAVE_UP = "GAVE_UP"            # stays out until the allocation follows another head
    FOLLOWING = "FOLLOWING"        # leaving the old head, joining the new one
    DRAINING = "DRAINING"
    LEFT = "LEFT"                  # terminal: drained or shut down
    RELEASED = "RELEASED"          # terminal: no live head for rejoin_timeout
    FAILED = "FAILED"              # terminal: a head whose Ray stopped

    @property
    def is_terminal(self) -> bool:
        return self in (AgentState.LEFT, AgentState.RELEASED, AgentState.FAILED)


class HostedHeadState(str, enum.Enum):
    """A head hosted on a worker allocation's first node: the states of the
    agent's hosted-head machine (``agent.head.hosted``, which uses this enum
    itself), as its agent reports them."""

    STARTING = "STARTING"
    STANDBY = "STANDBY"      # up but not the run's head: a warm standby (``RayLauncher.standby_head``)
    READY = "READY"
    FAILED = "FAILED"


class AgentRole(str, enum.Enum):
    """What an agent (and the job it belongs to) is for: a ``str`` enum, so a
    caller comparing with ``"head"`` or ``"worker"`` keeps working."""

    HEAD = "head"
    WORKER = "worker"

    def __str__(self) -> str:   # printed and formatted as the plain value, as before
        return self.value


AGENT_ROLES = tuple(role.value for role in AgentRole)


def _enum(data: Mapping[str, Any], key: str, kind: type[enum.Enum]) -> Any:
    value = _get(data, key, str)
    try:
        return kind(value)
    except ValueError:
        raise ValueError(f"{key!r}: {value!r} is not one of {', '.join(m.value for m in kind)}") from None


def _nullable(data: Mapping[str, Any], key: str, kinds: type | tuple[type, ...]) -> Any:
    """A key that must be present but may be null (the agent always writes it)."""
    if isinstance(data, Mapping) and key not in data:
        raise ValueError(f"missing key {key!r}")
    return _get(data, key, kinds, optional=True)


def _nullable_time(data: Mapping[str, Any], key: str) -> float | None:
    value = _nullable(data, key, (int, float))
    return None if value is None else float(value)


def _nullable_pid(data: Mapping[str, Any], key: str) -> int | None:
    value = _nullable(data, key, int)
    if value is not None and value <= 0:
        raise ValueError(f"{key!r} must be a positive process id")
    return value


def _count(data: Mapping[str, Any], key: str) -> int:
    value = _get(data, key, int)
    if value < 0:
        raise ValueError(f"{key!r} must not be negative")
    return value


def _nested(key: str, read: Callable[[], Any]) -> Any:
    """Run ``read`` with ``key`` prefixed to any refusal, so a nested error names its path."""
    try:
        return read()
    except ValueError as exc:
        raise ValueError(f"{key}: {exc}") from None


@dataclass(frozen=True)
class HostedHead:
    """The head an agent hosts for the run next to its own worker Ray.

    ``address`` is set once STANDBY or READY (the GCS), ``reason`` once FAILED; each key
    is written only when set, as the agent always has.
    """

    state: HostedHeadState
    at: float
    address: str | None = None
    reason: str | None = None
    pid: int | None = None        # STANDBY, READY: the PID of its `ray start`
    failures: int | None = None   # FAILED: failed starts since one last came up (None: an older agent)
    worker_pid: int | None = None  # STANDBY: the `ray start` of the worker joined to it, once joined

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"state": self.state.value}
        if self.address is not None:
            data["address"] = self.address
        if self.reason is not None:
            data["reason"] = self.reason
        data["at"] = self.at
        if self.pid is not None:
            data["pid"] = self.pid
        if self.failures is not None:
            data["failures"] = self.failures
        if self.worker_pid is not None:
            data["worker_pid"] = self.worker_pid
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "HostedHead":
        return cls(
            state=_enum(data, "state", HostedHeadState),
            at=float(_get(data, "at", (int, float))),
            address=_get(data, "address", str, optional=True),
            reason=_get(data, "reason", str, optional=True),
            pid=_get(data, "pid", int, optional=True),
            failures=_get(data, "failures", int, optional=True),
            worker_pid=_get(data, "worker_pid", int, optional=True),
        )


@dataclass(frozen=True)
class Transition:
    """One change of an agent's state (``from``/``to`` on the wire)."""

    at: float
    from_state: AgentState
    to_state: AgentState
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {"at": self.at, "from": self.from_state.value, "to": self.to_state.value, "reason": self.reason}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Transition":
        return cls(
            at=float(_get(data, "at", (int, float))),
            from_state=_enum(data, "from", AgentState),
            to_state=_enum(data, "to", AgentState),
            reason=_get(data, "reason", str),
        )


@dataclass(frozen=True)
class RequestCounts:
    """What an agent's control socket accepted and rejected (by reason)."""

    accepted: int = 0
    rejected: int = 0
    rejected_by_reason: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))

    def to_dict(self) -> dict[str, Any]:
        return {"accepted": self.accepted, "rejected": self.rejected,
                "rejected_by_reason": dict(self.rejected_by_reason)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "RequestCounts":
        by_reason = _get(data, "rejected_by_reason", dict)
        for reason, count in by_reason.items():
            if not isinstance(reason, str) or isinstance(count, bool) or not isinstance(count, int) or count < 0:
                raise ValueError(f"rejected_by_reason[{reason!r}] is not a count")
        return cls(accepted=_count(data, "accepted"), rejected=_count(data, "rejected"),
                   rejected_by_reason=MappingProxyType(dict(by_reason)))


@dataclass(frozen=True)
class GpuUsage:
    """What a node's agent measured of its GPUs while its Ray ran (``agent/node/ray_load``):
    GPU-seconds held (every GPU Ray had) and idle (no task or actor held them),
    over ``samples`` looks between ``first_at`` and ``last_at``."""

    held_gpu_seconds: float = 0.0
    idle_gpu_seconds: float = 0.0
    samples: int = 0
    first_at: float | None = None
    last_at: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"held_gpu_seconds": round(self.held_gpu_seconds, 3), "idle_gpu_seconds": round(self.idle_gpu_seconds, 3),
                "samples": self.samples, "first_at": self.first_at, "last_at": self.last_at}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "GpuUsage":
        held, idle = (float(_get(data, k, (int, float))) for k in ("held_gpu_seconds", "idle_gpu_seconds"))
        if not (math.isfinite(held) and math.isfinite(idle) and 0 <= idle <= held + 1e-6):
            raise ValueError(f"GPU-seconds: held {held!r}, idle {idle!r} (want 0 <= idle <= held)")
        return cls(held, idle, _count(data, "samples"), _nullable_time(data, "first_at"),
                   _nullable_time(data, "last_at"))


@dataclass(frozen=True)
class NodeState:
    """jobs/<job>/nodes/<host>.json: what one node's agent is doing.

    The agent rewrites it on every change of state, and writes the same
    record every few seconds to its node-local status file. Read by the
    coordinator (which nodes joined; whom to ask to drain, follow or host a
    head), by ``elastic-ray session status`` and by ``elastic-agent status``.
    Every key is written every time (nullable ones as null); a reader ignores
    keys it does not know, so a compatible addition keeps the protocol
    version. A file without ``protocol_version`` predates the field: version 1.
    """

    session: str
    job_id: str
    node: str
    node_ip: str
    role: AgentRole
    state: AgentState
    since: float                   # when ``state`` began
    max_restarts: int
    rejoin_timeout: float
    started_at: float
    updated_at: float
    pid: int
    control: str                   # the agent's control endpoint
    node_index: int = 0
    reason: str = ""
    head_job: str | None = None
    head_address: str | None = None
    node_id: str | None = None     # the Ray node id, once joined
    ports: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    ray_pid: int | None = None
    raylet_pid: int | None = None
    temp_dir: str | None = None
    ray_address: str | None = None
    restarts: int = 0
    failures: int = 0
    next_retry_at: float | None = None
    gave_up_on: str | None = None
    drain_deadline: float | None = None
    no_head_since: float | None = None
    pid_create_time: float | None = None
    requests: RequestCounts = field(default_factory=RequestCounts)
    hosted_head: HostedHead | None = None
    history: tuple[str, ...] = ()
    handover_deadline: float | None = None
    transitions: tuple[Transition, ...] = ()
    exited: bool = False
    exit_code: int | None = None
    gpu_usage: GpuUsage | None = None     # optional on read: agents before it did not write it
    oom_kills: int | None = None          # the job's OOM kills (agent.node.oom); None: unknown; optional on read
    protocol_version: int = PROTOCOL_VERSION

    def __post_init__(self) -> None:
        object.__setattr__(self, "role", AgentRole(self.role))

    def to_dict(self) -> dict[str, Any]:
        return {
            "protocol_version": self.protocol_version,
            "session": self.session, "job_id": self.job_id, "node": self.node,
            "node_ip": self.node_ip, "node_index": self.node_index, "role": self.role.value,
            "state": self.state.value, "reason": self.reason, "since": self.since,
            "head_job": self.head_job, "head_address": self.head_address, "node_id": self.node_id,
            "ports": dict(self.ports),
            "ray_pid": self.ray_pid, "raylet_pid": self.raylet_pid,
            "temp_dir": self.temp_dir, "ray_address": self.ray_address,
            "restarts": self.restarts, "failures": self.failures, "max_restarts": self.max_restarts,
            "next_retry_at": self.next_retry_at, "gave_up_on": self.gave_up_on,
            "drain_deadline": self.drain_deadline,
            "no_head_since": self.no_head_since, "rejoin_timeout": self.rejoin_timeout,
            "started_at": self.started_at, "updated_at": self.updated_at,
            "pid": self.pid, "pid_create_time": self.pid_create_time, "control": self.control,
            "requests": self.requests.to_dict(),
            "hosted_head": None if self.hosted_head is None else self.hosted_head.to_dict(),
            "history": list(self.history),
            "handover_deadline": self.handover_deadline,
            "transitions": [t.to_dict() for t in self.transitions],
            "exited": self.exited, "exit_code": self.exit_code,
            "gpu_usage": None if self.gpu_usage is None else self.gpu_usage.to_dict(),
            "oom_kills": self.oom_kills,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "NodeState":
        version = check_protocol_version(data, missing=1)
        node = _get(data, "node", str)
        if not node:
            raise ValueError("'node' must not be empty")
        role = _get(data, "role", str)
        if role not in AGENT_ROLES:
            raise ValueError(f"'role': {role!r} is not one of {', '.join(AGENT_ROLES)}")
        index = _count(data, "node_index")
        ports = _get(data, "ports", dict)
        for name, value in ports.items():
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 65536:
                raise ValueError(f"ports[{name!r}] is not a port number")
        pid = _get(data, "pid", int)
        if pid <= 0:
            raise ValueError("'pid' must be a positive process id")
        head_job = _nullable(data, "head_job", str)
        gave_up_on = _nullable(data, "gave_up_on", str)
        requests = _get(data, "requests", dict)
        hosted = _nullable(data, "hosted_head", dict)
        history = _get(data, "history", list)
        for i, entry in enumerate(history):
            if not isinstance(entry, str):
                raise ValueError(f"history[{i}] has type {type(entry).__name__}")
        transitions = _get(data, "transitions", list)
        return cls(
            session=_get(data, "session", str),
            job_id=check_job_id(_get(data, "job_id", str)),
            node=node,
            node_ip=_get(data, "node_ip", str),
            role=AgentRole(role),
            state=_enum(data, "state", AgentState),
            since=float(_get(data, "since", (int, float))),
            max_restarts=_count(data, "max_restarts"),
            rejoin_timeout=float(_get(data, "rejoin_timeout", (int, float))),
            started_at=float(_get(data, "started_at", (int, float))),
            updated_at=float(_get(data, "updated_at", (int, float))),
            pid=pid,
            control=_get(data, "control", str),
            node_index=index,
            reason=_get(data, "reason", str),
            head_job=None if head_job is None else check_job_id(head_job, "head_job"),
            head_address=_nullable(data, "head_address", str),
            node_id=_nullable(data, "node_id", str),
            ports=MappingProxyType(dict(ports)),
            ray_pid=_nullable_pid(data, "ray_pid"),
            raylet_pid=_nullable_pid(data, "raylet_pid"),
            temp_dir=_nullable(data, "temp_dir", str),
            ray_address=_nullable(data, "ray_address", str),
            restarts=_count(data, "restarts"),
            failures=_count(data, "failures"),
            next_retry_at=_nullable_time(data, "next_retry_at"),
            gave_up_on=None if gave_up_on is None else check_job_id(gave_up_on, "gave_up_on"),
            drain_deadline=_nullable_time(data, "drain_deadline"),
            no_head_since=_nullable_time(data, "no_head_since"),
            pid_create_time=_nullable_time(data, "pid_create_time"),
            requests=_nested("requests", lambda: RequestCounts.from_dict(requests)),
            hosted_head=None if hosted is None else _nested("hosted_head", lambda: HostedHead.from_dict(hosted)),
            history=tuple(history),
            handover_deadline=_nullable_time(data, "handover_deadline"),
            transitions=tuple(_nested(f"transitions[{i}]", lambda t=t: Transition.from_dict(t))
                              for i, t in enumerate(transitions)),
            exited=_get(data, "exited", bool),
            exit_code=_nullable(data, "exit_code", int),
            gpu_usage=None if _get(data, "gpu_usage", dict, optional=True) is None else _nested(
                "gpu_usage", lambda: GpuUsage.from_dict(data["gpu_usage"])),
            oom_kills=None if _get(data, "oom_kills", int, optional=True) is None else _count(data, "oom_kills"),
            protocol_version=version,
        )
