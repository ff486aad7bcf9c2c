"""Slurm job state names -> :class:`JobState`, in one table.

Slurm reports a job's state in several spellings: squeue's ``%T`` long names
(``PENDING``), its ``%t`` short codes (``PD``), sacct's long names with a
suffix (``CANCELLED by 1000``) and, in narrow sacct columns, names cut short
with a ``+``. Everything above the scheduler reasons about :class:`JobState`
only, so the mapping lives here, once, where a reader can check every row
against Slurm's documentation.

Slurm reports *flag* states (COMPLETING, CONFIGURING, REQUEUED, ...) in place
of the base state while the flag is set. The table maps each to what it means
for an allocation: does it hold (or wait for) nodes we can use, is it on its
way out, or is it over?
"""

from __future__ import annotations

from types import MappingProxyType

from .base import JobState

# Long name -> (short code, JobState). Rows are grouped by what they mean for
# an allocation; the comment says why a row maps where it does when that is
# not obvious from the names.
_TABLE: dict[str, tuple[str, JobState]] = {
    # Waiting for nodes.
    "PENDING": ("PD", JobState.PENDING),
    # Nodes are allocated but still booting (power saving, cloud): nothing of
    # ours runs yet, so the allocation cannot host Ray. Active, not running.
    "CONFIGURING": ("CF", JobState.PENDING),
    # The job goes back to the queue (node failure, preemption with requeue,
    # scontrol requeue): it will wait for nodes again.
    "REQUEUED": ("RQ", JobState.PENDING),
    # Requeued in a federation to be scheduled by a sibling cluster.
    "REQUEUE_FED": ("RF", JobState.PENDING),
    # Requeued and held: stays queued until someone releases it.
    "REQUEUE_HOLD": ("RH", JobState.PENDING),
    # Requeued and held after exiting with the site's special exit code.
    "SPECIAL_EXIT": ("SE", JobState.PENDING),
    # Held because its reservation was deleted; still queued.
    "RESV_DEL_HOLD": ("RD", JobState.PENDING),
    # Has nodes and runs.
    "RUNNING": ("R", JobState.RUNNING),
    # The allocation is growing or shrinking; it keeps running meanwhile.
    "RESIZING": ("RS", JobState.RUNNING),
    # A signal is being delivered to a running job.
    "SIGNALING": ("SI", JobState.RUNNING),
    # Holds its nodes but does not run.
    "SUSPENDED": ("S", JobState.SUSPENDED),
    # Every process got SIGSTOP; the nodes stay allocated, like SUSPENDED.
    "STOPPED": ("ST", JobState.SUSPENDED),
    # On its way out: processes are being cleaned up (COMPLETING) or burst
    # buffer data is being staged out after the job's end (STAGE_OUT).
    "COMPLETING": ("CG", JobState.COMPLETING),
    "STAGE_OUT": ("SO", JobState.COMPLETING),
    # Over.
    "COMPLETED": ("CD", JobState.COMPLETED),
    "CANCELLED": ("CA", JobState.CANCELLED),
    "FAILED": ("F", JobState.FAILED),
    "TIMEOUT": ("TO", JobState.TIMEOUT),
    "NODE_FAIL": ("NF", JobState.NODE_FAIL),
    "PREEMPTED": ("PR", JobState.PREEMPTED),
    "OUT_OF_MEMORY": ("OOM", JobState.OUT_OF_MEMORY),
    "BOOT_FAIL": ("BF", JobState.BOOT_FAIL),
    "DEADLINE": ("DL", JobState.DEADLINE),
    # In a federation, this cluster's copy was withdrawn because a sibling
    # cluster started the job. Nothing runs here any more.
    "REVOKED": ("RV", JobState.CANCELLED),
}

#: Every Slurm spelling we know -> JobState (long names and short codes).
SLURM_STATES: MappingProxyType[str, JobState] = MappingProxyType({
    **{long: state for long, (_, state) in _TABLE.items()},
    **{short: state for short, state in _TABLE.values()},
})

#: What an unrecognised state becomes. A state we do not know most likely
#: comes from a newer Slurm that added a flag (all recent additions are
#: transitional states of live jobs). Reporting it as PENDING keeps the job
#: "active but without usable nodes": the coordinator waits for it, can still
#: cancel it, and never abandons an allocation that may hold nodes, whereas a
#: final state would leak it. The raw string stays in ``JobInfo.raw_state``.
UNKNOWN_STATE_FALLBACK = JobState.PENDING


def normalise_state_name(raw: str) -> str:
    """The table key for a state as Slurm printed it.

    sacct and ``scontrol`` append details to some names (``CANCELLED by 0``)
    and sacct cuts names that do not fit their column with a ``+``; only the
    first word counts, and an upper-case copy is compared.
    """
    words = str(raw).strip().split()
    return words[0].upper().rstrip("+") if words else ""


def translate_state(raw: str) -> JobState:
    """The :class:`JobState` for a Slurm state string; never raises.

    Unknown or empty strings map to :data:`UNKNOWN_STATE_FALLBACK`.
    """
    return SLURM_STATES.get(normalise_state_name(raw), UNKNOWN_STATE_FALLBACK)


def is_known_state(raw: str) -> bool:
    """True when ``raw`` is in the table (used to log unfamiliar states once)."""
    return normalise_state_name(raw) in SLURM_STATES
