"""Typed records stored in the session directory, validated on every read.

Each record has ``to_dict`` (what we write) and ``from_dict`` (what we accept):
``from_dict`` raises ``ValueError`` naming the bad key, and the session
directory turns that into ``CorruptFileError`` with the file's path. A reader
therefore either gets a well-formed record or a clear report, never a
``KeyError`` deep inside the coordinator.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

# Job ids and names follow the one Slurm vocabulary (config/slurm_values.py);
# re-exported here for the session directory and the CLI, which read records.
from ..config.slurm_values import check_job_id, check_job_name, is_job_id  # noqa: F401

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
    {"kind": "local", "state_dir": ...}).
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

    def to_dict(self) -> dict[str, Any]:
        return {
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

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "SessionInfo":
        version = _get(data, "protocol_version", int)
        if version != PROTOCOL_VERSION:
            raise ValueError(f"protocol_version {version} is not supported (this is {PROTOCOL_VERSION})")
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
        )


# ---------------------------------------------------------------- allocation.json

WORKER_STATES = ("submitted", "draining", "removed")


@dataclass(frozen=True)
class WorkerRecord:
    """One worker allocation as the session remembers it.

    ``state`` is the session's intent, not Slurm's state (ask the scheduler
    for that): submitted, draining (a drain was requested) or removed.
    """

    job_id: str
    config: Mapping[str, Any]
    submitted_at: float
    state: str = "submitted"
    drain_requested_at: float | None = None
    drain_deadline: float | None = None
    head_failures: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "config": dict(self.config),
            "submitted_at": self.submitted_at,
            "state": self.state,
            "drain_requested_at": self.drain_requested_at,
            "drain_deadline": self.drain_deadline,
            "head_failures": self.head_failures,
        }

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
        return cls(
            job_id=check_job_id(_get(data, "job_id", str)),
            config=MappingProxyType(dict(_get(data, "config", dict))),
            submitted_at=float(_get(data, "submitted_at", (int, float))),
            state=state,
            drain_requested_at=None if drain_at is None else float(drain_at),
            drain_deadline=None if deadline is None else float(deadline),
            head_failures=failures,
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

    def with_worker(self, worker: WorkerRecord) -> "AllocationRecord":
        workers = dict(self.workers)
        workers[worker.job_id] = worker
        return replace(self, workers=MappingProxyType(workers))

    def to_dict(self) -> dict[str, Any]:
        return {
            "protocol_version": PROTOCOL_VERSION,
            "generation": self.generation,
            "head_job": self.head_job,
            "workers": {job: rec.to_dict() for job, rec in sorted(self.workers.items(), key=lambda kv: int(kv[0]))},
            "predecessors": list(self.predecessors),
            "election": None if self.election is None else self.election.to_dict(),
            "successor": self.successor,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "AllocationRecord":
        version = _get(data, "protocol_version", int)
        if version != PROTOCOL_VERSION:
            raise ValueError(f"protocol_version {version} is not supported (this is {PROTOCOL_VERSION})")
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
        return cls(
            generation=generation,
            head_job=None if head is None else check_job_id(head, "head_job"),
            workers=MappingProxyType(workers),
            predecessors=tuple(check_job_id(p, "predecessors[]") for p in predecessors),
            election=None if election is None else ElectionClaim.from_dict(election),
            successor=None if successor is None else check_job_id(successor, "successor"),
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

    def to_dict(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id, "host": self.host, "address": self.address,
            "ray_version": self.ray_version, "started_at": self.started_at, "ports": dict(self.ports),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "HeadEndpoint":
        address = _get(data, "address", str)
        hostpart, _, port = address.rpartition(":")
        if not hostpart or not (port.isascii() and port.isdigit()) or not 0 < int(port) < 65536:
            raise ValueError(f"address {address!r} is not host:port")
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
        )
