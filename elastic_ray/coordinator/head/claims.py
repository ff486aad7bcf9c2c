"""Hold the session's election claim for the length of a ``with`` block.

Two kinds of work must run in one process at a time across the whole run:
electing a head (``Session.replace_head``) and submitting a worker allocation
again when none is left (the supervisor). Both take the one claim in
allocation.json. Taking it, checking who won and giving it back (also when
the work raises) is done here once, so that no caller can forget the
release and leave every other process waiting for the claim to expire.

The claim is a lease: ``election.DEFAULT_CLAIM_PERIOD`` (2 minutes, the
seed's figure for how long a dead elector's claim blocks the next
election), renewed by a thread every quarter period while its block runs,
so a live elector never loses it however long its election takes. An
elector that died holds the next election off for at most one period; one
that died on the host of the process asking (its pid is gone) for none.

The decisions themselves (is the claim free or expired, the new claim
record, who holds it) are the pure functions of :mod:`.election`.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from ...protocol.disk.records import AllocationRecord, ElectionClaim
from ...protocol.disk.session_dir import SessionDir
from . import election

log = logging.getLogger("elastic_ray.coordinator")


def holder_gone(claimant: str) -> bool:
    """True only when the claim's holder is a process of this host that no
    longer exists. Another host's process, or a pid now used by someone
    else, counts as alive: then the claim waits out its period (safe)."""
    who = election.claimant_process(claimant)
    if who is None or who[0] != socket.gethostname():
        return False
    try:
        os.kill(who[1], 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    try:
        with open(f"/proc/{who[1]}/status") as f:  # a zombie is gone too
            return any(line.startswith("State:") and line.split()[1] == "Z" for line in f)
    except OSError:
        return False


@dataclass(frozen=True)
class ClaimOutcome:
    """What taking the claim gave: ``held`` is True when it is ours, and
    ``record`` is allocation.json as the attempt left it (what an elector
    decides on)."""

    held: bool
    record: AllocationRecord

    @property
    def holder(self) -> ElectionClaim | None:
        """The live claim of the process that has it, when it is not ours."""
        return None if self.held else self.record.election


@contextmanager
def election_claim(directory: SessionDir, claimant: str, period: float,
                   clock: Callable[[], float] = time.time) -> Iterator[ClaimOutcome]:
    """Try to take the claim for ``period`` seconds; yield whether we hold it.

    On leaving the block a claim we hold is released, however the block
    ends; a claim we did not win is left alone. ``clock`` is wall-clock time
    because claims are compared across hosts.
    """
    record = directory.update_allocation(
        lambda r: election.claim(r, claimant, clock(), period, holder_dead=holder_gone)[0])
    held = election.holds_claim(record, claimant)
    stop = threading.Event()
    renewer = None
    if held:
        renewer = threading.Thread(target=_keep_renewing, args=(directory, claimant, period, clock, stop),
                                   name="election-claim", daemon=True)
        renewer.start()
    try:
        yield ClaimOutcome(held, record)
    finally:
        stop.set()
        if renewer is not None:
            renewer.join()
        if held:
            directory.update_allocation(lambda r: election.release(r, claimant))


def _keep_renewing(directory: SessionDir, claimant: str, period: float, clock: Callable[[], float],
                   stop: threading.Event) -> None:
    """Renew the held claim every quarter period until ``stop``; a failed
    write (a full disk, a damaged record) is retried at the next tick."""
    while not stop.wait(period / 4):
        try:
            if not renew_claim(directory, claimant, period, clock):
                log.warning("event=claim_lost claimant=%s: another process took the election claim", claimant)
                return
        except Exception as exc:  # noqa: BLE001 - keep trying; the period leaves three more chances
            log.warning("event=claim_renew_failed claimant=%s error=%s", claimant, exc)


def renew_claim(directory: SessionDir, claimant: str, period: float,
                clock: Callable[[], float] = time.time) -> bool:
    """Push our claim's expiry ``period`` seconds ahead; True while it is ours.

    An elector that waits longer than the claim period (a successor
    allocation queued behind other jobs) calls this as it waits, so no other
    process takes the claim as expired and submits a second head allocation.
    A claim someone else holds is left alone (False): the pure
    ``election.claim`` renews only its own claimant's claim.
    """
    record = directory.update_allocation(lambda r: election.claim(r, claimant, clock(), period)[0])
    return election.holds_claim(record, claimant)


__all__ = ["ClaimOutcome", "election_claim", "renew_claim"]
