"""Putting a damaged allocation.json back: the effects around :mod:`.recovery`.

``SessionDir`` calls in here when the record does not read (under its file
lock): gather what the directory shows, let :func:`.recovery.plan_recovery`
decide, and either restore (one logged event, the damaged file kept aside
for a person, never deleted) or raise one CorruptFileError that says why not
and names the one command that does it by hand.

What it touches of the directory is public: the record's generation files
through :mod:`.generations` (``sd.generations``), every other name through
:mod:`.paths`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from ...atomic import atomic_write_json, read_bytes_bounded, read_record
from ...errors import CorruptFileError
from .recovery import (
    REPAIR_COMMAND,
    Candidate,
    DamagedFile,
    Evidence,
    RecoveryPlan,
    legible_numbers,
    plan_recovery,
)
from . import paths
from .records import AllocationRecord

if TYPE_CHECKING:
    from .session_dir import SessionDir

log = logging.getLogger("elastic_ray.protocol.disk.session_dir")


class RefusalMemory:
    """The last reason automatic recovery was refused for one ``SessionDir``:
    a reader that polls a damaged record logs the refusal once, not at every
    read, and again only when the reason changes."""

    def __init__(self) -> None:
        self.last: str | None = None

    def is_new(self, why: str) -> bool:
        """Whether ``why`` differs from the last refusal (and remember it)."""
        if self.last == why:
            return False
        self.last = why
        return True

    def clear(self) -> None:
        self.last = None


def damaged_file(path: str, reason: str) -> DamagedFile:
    try:
        data = read_bytes_bounded(path)
    except (OSError, CorruptFileError):
        return DamagedFile(path, reason)
    generation, protocol = legible_numbers(data)
    return DamagedFile(path, reason, generation, protocol)


def gather(sd: "SessionDir", damaged: DamagedFile) -> Evidence:
    """Everything :func:`.recovery.plan_recovery` weighs. Never raises: a file
    that cannot be read is simply no evidence."""
    committed = sd.generations.listed()
    candidates: list[Candidate] = []
    for generation in reversed(committed):
        try:
            candidates.append(Candidate(str(sd.generation_file(generation)), sd.generations.read(generation)))
            break    # the newest generation file that reads is the only one worth having
        except (OSError, CorruptFileError):
            continue
    for path in (sd.allocation_file, sd.backup_file):
        if str(path) == damaged.path:
            continue
        try:
            candidates.append(Candidate(str(path), read_record(path, AllocationRecord.from_dict)))
        except (OSError, CorruptFileError):
            pass
    heads: set[str] = set()
    with contextlib.suppress(OSError):
        for entry in paths.jobs_dir(sd.path).iterdir():
            job = paths.job_of_dir(entry.name)
            if job is not None and paths.head_endpoint_file(sd.path, job).exists():
                heads.add(job)
    return Evidence(damaged, tuple(committed), tuple(candidates), sd.read_ray_head(), frozenset(heads))


def known_jobs(sd: "SessionDir") -> tuple[frozenset[str], frozenset[str]]:
    """The job ids the session directory knows of without allocation.json,
    for a teardown that must not depend on it: ``(recorded, seen)``.

    ``recorded``: every id in a copy of the record that still reads (the
    backup, every kept generation file). ``seen``: ids only the files show
    (the ``ray_head`` pointer, ``jobs/<job>/``, ``logs/head-<job>.out`` and
    ``logs/worker-<job>.out``), which a caller checks against the scheduler
    (name, user) before acting on them. Never raises.
    """
    recorded: set[str] = set()
    for path in [sd.backup_file, *(sd.generation_file(g) for g in sd.generations.listed())]:
        try:
            recorded |= read_record(path, AllocationRecord.from_dict).recorded_jobs
        except (OSError, CorruptFileError):
            continue
    seen: set[str] = set()
    pointer = sd.read_ray_head()
    if pointer:
        seen.add(pointer)
    with contextlib.suppress(OSError):
        seen.update(job for entry in paths.jobs_dir(sd.path).iterdir()
                    if (job := paths.job_of_dir(entry.name)) is not None)
    with contextlib.suppress(OSError):
        for entry in paths.log_dir(sd.path).iterdir():
            named = paths.parse_job_output_name(entry.name)
            if named is not None:
                seen.add(named[1])
    return frozenset(recorded), frozenset(seen - recorded)


def plan(sd: "SessionDir", damaged: DamagedFile) -> RecoveryPlan:
    return plan_recovery(gather(sd, damaged))


def _aside_name(session: Path, stem: str) -> Path:
    stamp = time.strftime("%Y%m%dT%H%M%S")
    for n in range(1000):
        candidate = paths.corrupt_copy(session, stem, stamp, n)
        if not candidate.exists():
            return candidate
    return paths.corrupt_copy(session, stem, stamp, os.getpid())


def set_aside(sd: "SessionDir", damaged: DamagedFile) -> Path | None:
    """Keep the damaged file for a person. allocation.json is moved (the
    restore writes a new one); a damaged generation file is copied, since
    it keeps its name as the evidence that its generation was committed
    (pruning removes it later, the copy stays)."""
    if not damaged.path:
        return None
    path = Path(damaged.path)
    try:
        if path == sd.allocation_file:
            aside = _aside_name(sd.path, paths.ALLOCATION_FILE)
            os.replace(path, aside)
        else:
            aside = _aside_name(sd.path, paths.generation_aside_stem(path.stem))
            shutil.copyfile(path, aside, follow_symlinks=False)
        return aside
    except FileNotFoundError:
        return None


def restore(sd: "SessionDir", recovery: RecoveryPlan) -> tuple[AllocationRecord, Path | None]:
    """Commit the plan's source again, numbered past every generation ever
    committed (so no writer's compare-and-swap collides with a damaged one).
    The caller holds the file lock."""
    source = recovery.source
    if source is None:
        raise CorruptFileError(recovery.damaged.path, f"{recovery.damaged.reason}; no usable copy to restore from")
    aside = set_aside(sd, recovery.damaged)
    restored = replace(source.record,
                       generation=max([recovery.newest, source.generation, *sd.generations.listed()]) + 1)
    while not sd.generations.commit(restored):
        restored = replace(restored, generation=restored.generation + 1)
    if not sd.allocation_file.exists():
        atomic_write_json(sd.allocation_file, restored.to_dict())
    return restored, aside


def recover_automatically(sd: "SessionDir", error: CorruptFileError) -> AllocationRecord:
    """Restore when the plan allows it; else raise ``error`` with the reasons
    and the command. The caller holds the file lock."""
    recovery = plan(sd, damaged_file(error.path, error.reason))
    if not recovery.automatic:
        why = "; ".join(recovery.refusals)
        if sd.recovery_refusal.is_new(why):
            log.error("event=allocation_recovery_refused path=%s reason=%r why=%r command=%r", error.path,
                      error.reason, why, f"{REPAIR_COMMAND} {sd.path}")
        raise CorruptFileError(error.path, f"{error.reason}; not restored automatically ({why}); see what a restore "
                                           f"would put back, and do it, with: {REPAIR_COMMAND} {sd.path}") from None
    restored, aside = restore(sd, recovery)
    sd.recovery_refusal.clear()
    assert recovery.source is not None
    log.warning("event=allocation_recovered path=%s reason=%r damaged_generation=%s newest_known=%s source=%s "
                "source_generation=%s generation=%s kept_as=%s", error.path, error.reason,
                recovery.damaged.generation, recovery.newest, recovery.source.source, recovery.source.generation,
                restored.generation, aside)
    return restored


__all__ = ["RefusalMemory", "damaged_file", "gather", "known_jobs", "plan", "recover_automatically", "restore",
           "set_aside"]
