"""The autoscaler as ``elastic-ray session status`` shows it (and ``--json``).

:func:`summary` is pure: the stored policy, the holder's state file and the
lease in allocation.json, at ``now``, into one JSON-ready dict (None for a
session that never had a policy: its status looks as before).
:func:`autoscale_status` reads the two files for it; a damaged one is shown
as an error, never raised: a status must always answer.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ...errors import CorruptFileError
from ...protocol.disk.records import AllocationRecord, ElectionClaim
from . import store


def summary(policy: store.PolicyFile | None, state: store.ScalerState | None, lease: ElectionClaim | None,
            now: float, errors: tuple[str, ...] = ()) -> dict[str, Any] | None:
    if policy is None and state is None and not errors:
        return None
    on = policy is not None and policy.policy is not None
    live = lease is not None and lease.is_live(now)
    out: dict[str, Any] = {
        "on": on,
        "policy": policy.policy.to_dict() if on else None,  # type: ignore[union-attr]
        "set_at": None if policy is None else policy.set_at,
        "holder": lease.claimant if live else None,     # type: ignore[union-attr]
        "lease_left": round(lease.expires - now, 1) if live else None,   # type: ignore[union-attr]
        "turn_age": None, "unserved": 0, "notes": [], "error": None, "jobs": {}, "estimates": {}, "recent": [],
        "read_errors": list(errors),
    }
    if state is not None:
        out.update(turn_age=None if state.turn_at is None else round(max(0.0, now - state.turn_at), 1),
                   unserved=state.unserved, notes=list(state.notes), error=state.error,
                   jobs={job: {"partition": t.config.get("partition"), "submitted_at": t.submitted_at,
                               "raced": t.raced, "replaces": t.replaces, "ending": t.ending}
                         for job, t in state.jobs.items()},
                   estimates={k: dict(v) for k, v in state.estimates.items()},
                   recent=[dict(r) for r in state.recent])
    return out


def autoscale_status(session: Path, record: AllocationRecord, now: float) -> dict[str, Any] | None:
    errors: list[str] = []
    policy: store.PolicyFile | None = None
    state: store.ScalerState | None = None
    try:
        policy = store.read_policy(session)
    except CorruptFileError as exc:
        errors.append(f"policy: {exc.reason}")
    try:
        state = store.read_state(session)
    except CorruptFileError as exc:
        errors.append(f"state: {exc.reason}")
    return summary(policy, state, record.autoscaler, now, tuple(errors))


__all__ = ["autoscale_status", "summary"]
