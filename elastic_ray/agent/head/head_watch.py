"""What an agent knows about the head it follows, and the decisions drawn from it.

Pure: the record is filled by ``agent.head.following`` (pointer reads, heartbeats,
the answers of the head's agent and of its GCS) and judged here, so the
judgement is tested without sockets (``tests/test_agent_head_watch.py``).

The head's heartbeat is the fast signal. Its silence alone does not make the
head lost, though: the head's *agent* may be stalled (a slow write to the
shared filesystem, a starved CPU) while its Ray serves on, and treating that
as a loss would make every worker drop its Ray node at once. So silence is
checked against the head's GCS (one probe) first; a heartbeat that says Ray is
down, or a GCS that does not answer, is a loss at once.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from ...protocol.disk.records import HeadEndpoint
from ..machine import HeadSeen
from ...protocol.wire.head_status import head_serves

# A silent head's GCS must answer within this long to keep the head live.
HEAD_PROBE_TIMEOUT = 4.0


@dataclass
class HeadWatch:
    """The head named by ``ray_head``. Mutable, and owned by the agent's event
    loop alone: helper threads hand their findings to the loop."""

    job: str | None = None
    endpoint: HeadEndpoint | None = None
    last_beat: float | None = None
    beat_ok: bool = False
    beat_draining: bool = False
    gcs_ok_at: float | None = None        # the GCS answered (asked because the heartbeat was silent)
    gcs_failed_at: float | None = None    # it did not
    probing: bool = False
    next_probe: float = 0.0

    def silent(self, now: float, lost_after: float) -> bool:
        return (self.endpoint is not None and self.last_beat is not None and self.beat_ok
                and now - self.last_beat > lost_after)

    def is_live(self, now: float, lost_after: float) -> bool:
        if self.endpoint is None or self.last_beat is None or not self.beat_ok:
            return False
        quiet = now - self.last_beat
        if quiet <= lost_after:
            return True
        if self.gcs_failed_at is not None and self.gcs_failed_at > self.last_beat:
            return False
        if self.gcs_ok_at is not None and self.gcs_ok_at > self.last_beat:
            return now - self.gcs_ok_at <= lost_after + HEAD_PROBE_TIMEOUT
        return quiet <= lost_after + HEAD_PROBE_TIMEOUT + 1.0   # the first probe is on its way

    def seen(self, now: float, lost_after: float) -> HeadSeen:
        return HeadSeen(now, self.job, self.endpoint.address if self.endpoint else None,
                        self.is_live(now, lost_after))

    def probe_due(self, now: float, lost_after: float) -> bool:
        """Ask the GCS whether this silent head still serves? Once per
        ``lost_after``, one probe at a time, and not again once the GCS failed
        to answer (a heartbeat, or another pointer, starts over)."""
        if self.probing or now < self.next_probe or not self.silent(now, lost_after):
            return False
        return not (self.gcs_failed_at is not None and self.last_beat is not None
                    and self.gcs_failed_at > self.last_beat)

    def heard(self, now: float, ok: bool, draining: bool = False) -> None:
        """A heartbeat (or an answer that counts as one)."""
        self.last_beat, self.beat_ok, self.beat_draining = now, ok, draining

    def probed(self, at: float, answered: bool) -> None:
        if answered:
            self.gcs_ok_at = at
        else:
            self.gcs_failed_at = at
        self.probing = False


def beat_time(sent: float, read_before: float | None, now: float, heard_before: float | None = None) -> float:
    """When a heartbeat taken at ``now`` came. The loop does not wake per
    beat (``agent.head.following``): it takes the queued ones at its next wakeup,
    up to a second later, and dating a beat by that would hide that much of
    a silence. A beat came after the previous take (which emptied the queue)
    and by ``now``; within that window the head's own send time places it,
    so a head clock that is off moves it no further than the window. Never
    before ``heard_before`` (an answer of the head's agent that counted as a
    beat): the last beat heard only moves forward."""
    low = max(x for x in (read_before, heard_before, float("-inf")) if x is not None)
    return min(max(sent, low), now)


class PointerRead(str, enum.Enum):
    KEEP = "keep"      # the pointer is missing but the followed head lives: keep following it
    NEW = "new"        # the pointer names another head (or none): start a new watch
    SAME = "same"


def read_pointer(watch: HeadWatch, job: str | None, now: float, lost_after: float) -> PointerRead:
    """What a worker makes of one read of ``ray_head``.

    Absent or unreadable (a damaged file, an NFS hiccup) while the followed
    head's heartbeat lives: keep it. A head that is really gone falls silent
    within ``lost_after`` and is left then; dropping every worker on one bad
    read would cost the cluster.
    """
    if job is None and watch.job is not None and watch.is_live(now, lost_after):
        return PointerRead.KEEP
    return PointerRead.NEW if job != watch.job else PointerRead.SAME


def answer_counts(watch: HeadWatch, status: dict[str, Any]) -> bool:
    """An answer from the head's agent counts as its first heartbeat: it must
    come from the watched job, say it serves, and find no heartbeat heard yet."""
    return status.get("job_id") == watch.job and head_serves(status) and watch.last_beat is None
