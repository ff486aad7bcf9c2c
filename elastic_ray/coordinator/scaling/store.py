"""The autoscaler's two files in the session directory: the policy, and the holder's state.

``autoscale.json`` holds the policy as :meth:`AutoscalePolicy.to_dict`
gives it, or none (the session does not scale by itself). Any process of
the run may set it (``Session.autoscale``); the last one written wins, as a
setting should. It is checked before it is written, so a refused policy
changes nothing; a reader that finds it damaged or of a newer version
takes it as unknown (the autoscaler does nothing that turn) and says so.

``autoscale-state.json`` is written by the one process holding the lease
(:mod:`.lease`), and by no other, so a plain atomic replace is enough: the
jobs it submitted and for which pool (the next holder must know which
allocations are the autoscaler's to shed), Slurm's start estimates, its
last turn, its notes and its latest decisions (``session status`` shows
them). Both files are versioned on their own (1).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from ...atomic import atomic_write_json, read_record
from ...config.autoscale import AutoscalePolicy
from ...errors import ConfigError, CorruptFileError
from ...protocol.disk import event_log, paths
from ...protocol.disk.events import EventKind, EventSource

log = logging.getLogger("elastic_ray.coordinator")

STORE_VERSION = 1
#: Decisions kept in the state file for ``session status`` (the event log keeps them all).
RECENT_KEPT = 10


def _version(data: Any, what: str) -> Mapping[str, Any]:
    if not isinstance(data, Mapping):
        raise ValueError(f"{what}: not an object")
    version = data.get("version")
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise ValueError(f"{what}.version: {version!r} is not a version")
    if version > STORE_VERSION:
        raise ValueError(f"{what}.version: {version} is newer than this elastic-ray reads ({STORE_VERSION})")
    return data


def _number(data: Mapping[str, Any], key: str, *, optional: bool = False) -> float | None:
    value = data.get(key)
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{key}: {value!r} is not a number")
    return float(value)


# ---------------------------------------------------------------- the policy

@dataclass(frozen=True)
class PolicyFile:
    policy: AutoscalePolicy | None
    set_at: float

    def to_dict(self) -> dict[str, Any]:
        return {"version": STORE_VERSION, "set_at": self.set_at,
                "policy": None if self.policy is None else self.policy.to_dict()}

    @classmethod
    def from_dict(cls, data: Any) -> "PolicyFile":
        data = _version(data, "autoscale.json")
        raw = data.get("policy")
        try:
            policy = None if raw is None else AutoscalePolicy.from_dict(raw)
        except ConfigError as exc:
            raise ValueError(f"policy.{exc.field}: {exc.reason}") from None
        return cls(policy, _number(data, "set_at"))  # type: ignore[arg-type]


def as_policy(policy: Any) -> AutoscalePolicy | None:
    """``policy`` checked: an AutoscalePolicy, its dict form (a session file, run config) or None;
    anything else is refused naming the field."""
    if policy is None or isinstance(policy, AutoscalePolicy):
        return policy
    if isinstance(policy, Mapping):
        return AutoscalePolicy.from_dict(policy)
    raise ConfigError("policy", policy, "must be an AutoscalePolicy, its dict form, or None (stop scaling)")


def write_policy(session: Path, policy: AutoscalePolicy | None, now: float | None = None) -> PolicyFile:
    record = PolicyFile(policy, time.time() if now is None else now)
    atomic_write_json(paths.autoscale_file(session), record.to_dict(), mode=0o600)
    return record


def set_policy(session: Path, policy: Any) -> PolicyFile:
    """``Session.autoscale``: check ``policy`` (:func:`as_policy`; a refusal writes nothing), store it
    for whichever process holds the lease, and record it in the event log."""
    checked = as_policy(policy)
    record = write_policy(session, checked)
    if checked is None:
        event_log.emit(session, EventKind.AUTOSCALE_POLICY, EventSource.COORDINATOR, reason="stopped")
    else:
        event_log.emit(session, EventKind.AUTOSCALE_POLICY, EventSource.COORDINATOR, reason="set",
                       pools=len(checked.pools), min_allocations=checked.min_allocations,
                       max_nodes=checked.max_nodes, idle_timeout=checked.idle_timeout)
    log.info("event=autoscale_policy session=%s policy=%s", session, "none" if checked is None else "set")
    return record


def stop_at_teardown(session: Path) -> bool:
    """A teardown ends the run, so it stops scaling too: a policy left set would have any process
    still supervising the session submit again (``min_allocations``, a demand still pending) right
    after the cancel, and ``session status`` would go on saying "on". Clears a set policy (a
    damaged file as well) and records it; True when there was one to stop."""
    try:
        stored = read_policy(session)
    except CorruptFileError:
        stored = PolicyFile(None, 0.0)   # unreadable: cleared all the same, it cannot be acted on anyway
    else:
        if stored is None or stored.policy is None:
            return False
    write_policy(session, None)
    event_log.emit(session, EventKind.AUTOSCALE_POLICY, EventSource.COORDINATOR, reason="stopped by teardown")
    log.info("event=autoscale_policy session=%s policy=none reason=teardown", session)
    return True


def policy_stamp(session: Path) -> tuple[int, int, int] | None:
    """The policy file's (inode, size, mtime_ns), None without one: one ``stat``, so a resting
    autoscaler sees a policy set or stopped by any process at its next look, not its next turn."""
    try:
        st = os.stat(paths.autoscale_file(session))
    except OSError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns


def read_policy(session: Path) -> PolicyFile | None:
    """The stored policy; None when none was ever set. CorruptFileError when damaged or newer."""
    try:
        return read_record(paths.autoscale_file(session), PolicyFile.from_dict)
    except FileNotFoundError:
        return None


# ---------------------------------------------------------------- the holder's state

@dataclass(frozen=True)
class Tracked:
    """One allocation the autoscaler submitted: the pool's config (its pool is
    found again by this config, so a changed policy does not mix pools up)."""

    config: Mapping[str, Any]
    submitted_at: float
    raced: bool = False
    replaces: str | None = None
    ending: bool = False     # cancelled or drained by the autoscaler: counts for nothing

    def to_dict(self) -> dict[str, Any]:
        return {"config": dict(self.config), "submitted_at": self.submitted_at, "raced": self.raced,
                "replaces": self.replaces, "ending": self.ending}

    @classmethod
    def from_dict(cls, data: Any) -> "Tracked":
        if not isinstance(data, Mapping) or not isinstance(data.get("config"), Mapping):
            raise ValueError("jobs[]: not an object with a config")
        replaces = data.get("replaces")
        if replaces is not None and not isinstance(replaces, str):
            raise ValueError(f"jobs[].replaces: {replaces!r} is not a job id")
        return cls(MappingProxyType(dict(data["config"])), _number(data, "submitted_at"),  # type: ignore[arg-type]
                   bool(data.get("raced", False)), replaces, bool(data.get("ending", False)))


@dataclass(frozen=True)
class ScalerState:
    holder: str = ""
    turn_at: float | None = None
    jobs: Mapping[str, Tracked] = field(default_factory=lambda: MappingProxyType({}))
    estimates: Mapping[str, Mapping[str, Any]] = field(default_factory=lambda: MappingProxyType({}))
    unserved: int = 0
    notes: tuple[str, ...] = ()
    recent: tuple[Mapping[str, Any], ...] = ()
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"version": STORE_VERSION, "holder": self.holder, "turn_at": self.turn_at,
                "jobs": {job: t.to_dict() for job, t in sorted(self.jobs.items())},
                "estimates": {k: dict(v) for k, v in self.estimates.items()}, "unserved": self.unserved,
                "notes": list(self.notes), "recent": [dict(r) for r in self.recent[-RECENT_KEPT:]],
                "error": self.error}

    @classmethod
    def from_dict(cls, data: Any) -> "ScalerState":
        data = _version(data, "autoscale-state.json")
        jobs = data.get("jobs", {})
        if not isinstance(jobs, Mapping):
            raise ValueError("jobs: not an object")
        estimates = data.get("estimates", {})
        if not isinstance(estimates, Mapping) or not all(isinstance(v, Mapping) for v in estimates.values()):
            raise ValueError("estimates: not an object of objects")
        notes, recent = data.get("notes", []), data.get("recent", [])
        if not isinstance(notes, list) or not all(isinstance(n, str) for n in notes):
            raise ValueError("notes: not a list of strings")
        if not isinstance(recent, list) or not all(isinstance(r, Mapping) for r in recent):
            raise ValueError("recent: not a list of objects")
        error = data.get("error")
        return cls(holder=str(data.get("holder", "")), turn_at=_number(data, "turn_at", optional=True),
                   jobs=MappingProxyType({str(k): Tracked.from_dict(v) for k, v in jobs.items()}),
                   estimates=MappingProxyType({str(k): MappingProxyType(dict(v)) for k, v in estimates.items()}),
                   unserved=int(data.get("unserved", 0) or 0), notes=tuple(notes),
                   recent=tuple(MappingProxyType(dict(r)) for r in recent),
                   error=None if error is None else str(error))


def write_state(session: Path, state: ScalerState, *, durable: bool = True) -> None:
    """``durable``: fsynced (a change of its jobs must survive a crash; a turn's time need not)."""
    atomic_write_json(paths.autoscale_state_file(session), state.to_dict(), mode=0o600, durable=durable)


def read_state(session: Path) -> ScalerState | None:
    """The last holder's state; None when there is none. CorruptFileError when damaged or newer."""
    try:
        return read_record(paths.autoscale_state_file(session), ScalerState.from_dict)
    except FileNotFoundError:
        return None


__all__ = ["PolicyFile", "ScalerState", "Tracked", "as_policy", "read_policy", "read_state", "set_policy",
           "stop_at_teardown", "write_policy", "write_state"]
