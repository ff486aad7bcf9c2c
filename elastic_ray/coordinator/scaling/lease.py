"""Which process of the run runs the autoscaler: a lease in allocation.json. Pure.

Many processes may hold a Session with supervision on (the run's
supervisor, payload steps, a restarted supervisor); exactly one of them
must submit, cancel and drain for the policy, or two would both grow the
run for the same demand. The lease is the election claim's twin (same
record shape, same compare-and-swap through ``update_allocation``), kept in
its own field so that an election and the autoscaler never block each other.

A holder renews it while it runs (every turn once a third of the period
has passed); when it dies, another process takes it over once it expires,
or at once when the holder was a process of the asking host that no longer
exists (:func:`..head.claims.holder_gone`). The period is short
(:data:`LEASE_PERIOD`) so that a takeover on another host happens within a
minute; each renewal is one generation of allocation.json, about four a
minute while a policy is set.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from ...protocol.disk.records import AllocationRecord, ElectionClaim
from ..head.election import next_claim

#: Seconds a lease holds without renewal: a dead holder on another host is
#: replaced within this (plus one turn of the taker).
LEASE_PERIOD = 45.0
#: A holder renews once this little of the period is left (two chances more before it lapses).
RENEW_WHEN_LEFT = 30.0


def holder_name(host: str, pid: int, nonce: str) -> str:
    """``host:pid:nonce``: the shape :func:`..head.election.claimant_process` reads back."""
    return f"{host}:{pid}:{nonce}"


def live_lease(record: AllocationRecord, now: float) -> ElectionClaim | None:
    lease = record.autoscaler
    return lease if lease is not None and lease.is_live(now) else None


def take(record: AllocationRecord, holder: str, now: float, period: float = LEASE_PERIOD,
         holder_dead: Callable[[str], bool] | None = None) -> AllocationRecord:
    """The record with the lease ``holder``'s (taken, or renewed when it is
    already ours), or the very same record when another live holder has it
    (then ``update_allocation`` writes nothing)."""
    if not holder:
        raise ValueError("holder must be a non-empty string")
    taken = next_claim(live_lease(record, now), holder, now, period, holder_dead)
    return record if taken is None else replace(record, autoscaler=taken)


def holds(record: AllocationRecord, holder: str, now: float) -> bool:
    """Whether ``holder`` has a live lease in ``record``."""
    lease = live_lease(record, now)
    return lease is not None and lease.claimant == holder


def due(record: AllocationRecord, holder: str, now: float, renew_when_left: float = RENEW_WHEN_LEFT) -> bool:
    """Whether ``holder`` should write: it does not hold the lease, or its lease runs out soon."""
    lease = live_lease(record, now)
    return lease is None or lease.claimant != holder or lease.expires - now <= renew_when_left


def renew_at(record: AllocationRecord, holder: str) -> float | None:
    """When ``holder`` must renew its lease (None: it holds none), so a holder resting longer between
    turns than a third of the period wakes for it."""
    lease = record.autoscaler
    if lease is None or lease.claimant != holder:
        return None
    return lease.expires - RENEW_WHEN_LEFT


def release(record: AllocationRecord, holder: str) -> AllocationRecord:
    """Give the lease up (a stopped policy, a closing session); another's is left alone."""
    if record.autoscaler is None or record.autoscaler.claimant != holder:
        return record
    return replace(record, autoscaler=None)


__all__ = ["LEASE_PERIOD", "RENEW_WHEN_LEFT", "holder_name", "live_lease", "take", "holds", "due", "renew_at", "release"]
