"""Which run sessions the orphan sensor ends, as a pure decision.

A session belongs to a Dagster run and to its retries and re-executions
(they share the root run id). Its Slurm jobs should end with the last of
those runs. In-process execution tears the session down itself; a run whose
process died, or whose steps ran in separate processes, leaves jobs behind,
and this is where the sensor decides about them.

One exception keeps jobs of a finished run: a worker allocation that waits
for a new head (its head ended, an election is pending or a successor is
published). That is a run in the middle of a failover, whose retry will
elect the waiting allocation; a worker that waits in vain releases itself
after its rejoin timeout, so sparing it costs little.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass

# Dagster run statuses after which nothing of the run runs any more.
FINISHED_STATUSES = frozenset({"SUCCESS", "FAILURE", "CANCELED"})


class OrphanAction(str, enum.Enum):
    NO_RUN = "no_run"                  # no Dagster run with this key: not ours to judge
    RUN_ACTIVE = "run_active"          # a run of the session is still going
    WAITING_FOR_HEAD = "waiting"       # a worker allocation waits for a new head: spare it
    NOTHING_LIVE = "nothing_live"      # every job already ended
    TEARDOWN = "teardown"              # end every job of the session


@dataclass(frozen=True)
class SessionJobs:
    """What the sensor saw of a session's jobs in one scheduler query."""

    head_active: bool
    running_workers: int
    pending_workers: int
    successor_active: bool
    election_pending: bool

    @property
    def any_live(self) -> bool:
        return self.head_active or self.running_workers > 0 or self.pending_workers > 0 or self.successor_active


def decide(run_statuses: Iterable[str], jobs: SessionJobs) -> tuple[OrphanAction, str]:
    """The sensor's verdict on one session, with the reason in words."""
    statuses = list(run_statuses)
    if not statuses:
        return OrphanAction.NO_RUN, "no Dagster run has this session's run id"
    active = [s for s in statuses if s not in FINISHED_STATUSES]
    if active:
        return OrphanAction.RUN_ACTIVE, f"run status {active[0]}"
    if not jobs.any_live:
        return OrphanAction.NOTHING_LIVE, "every job of the session has ended"
    if not jobs.head_active and (jobs.successor_active or jobs.election_pending or jobs.running_workers):
        return OrphanAction.WAITING_FOR_HEAD, "the head ended and a worker allocation or successor waits for a new head"
    return OrphanAction.TEARDOWN, f"the run ended ({', '.join(sorted(set(statuses)))}) and its jobs still run"
