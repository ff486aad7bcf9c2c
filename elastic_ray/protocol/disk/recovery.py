"""Whether a damaged allocation.json may be put back from a good copy, and from which.

Pure: what the session directory shows (gathered by ``SessionDir``) in, a
plan out. The rule this module holds is "nothing newer is lost":

* Every committed update has a generation number N, and its commit point is
  the creation of ``allocation.gen/<N>.json`` (see ``SessionDir``). The
  *names* in that directory therefore say which generations were committed
  even when a file's content is damaged (``allocation.json`` and the newest
  generation file are one inode, so damage written in place hits both).
* A restore source is a record that still validates: a generation file, or
  ``allocation.json.bak`` (a separate file, rewritten after every commit).
* The newest known generation is the largest of: the committed names, the
  generation the damaged file still shows (a truncated file often keeps its
  ``"generation": N``), and the source's own.

A restore is automatic only when the best source holds the newest known
generation, and the live state agrees with it: the job ``ray_head`` names
and every job that published a head endpoint (``jobs/<job>/head.json``) must
be jobs the source records. A head is recorded before its agents can run,
so a head the source does not know means the source is older than what is
live. Anything else is refused with the reasons, and a person decides with
``elastic-ray session repair DIR``. A record written by a newer elastic-ray
is not damage and is never replaced.

Worker node files (``jobs/<job>/nodes``) are not evidence: an agent may
publish before its submitter recorded the job id (the submission is then
in the record as an intent, which carries no job id to compare).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from .records import PROTOCOL_VERSION, AllocationRecord

# A damaged file often still shows its generation: keys are written sorted,
# one per line, and "generation" comes early.
_GENERATION_TEXT = re.compile(rb'"generation"\s*:\s*([0-9]{1,18})\s*[,}\n]')
_PROTOCOL_TEXT = re.compile(rb'"protocol_version"\s*:\s*([0-9]{1,9})\s*[,}\n]')

REPAIR_COMMAND = "elastic-ray session repair"


@dataclass(frozen=True)
class Candidate:
    """A record that validates, and the file it came from."""

    source: str
    record: AllocationRecord

    @property
    def generation(self) -> int:
        return self.record.generation


@dataclass(frozen=True)
class DamagedFile:
    """What is still legible in the file that failed: its generation and
    protocol version if they can be made out, else None."""

    path: str
    reason: str
    generation: int | None = None
    protocol_version: int | None = None


@dataclass(frozen=True)
class Evidence:
    damaged: DamagedFile
    committed: tuple[int, ...]          # generation numbers named in allocation.gen/
    candidates: tuple[Candidate, ...]   # every record that validates (generation files, the backup)
    pointer: str | None                 # the job ray_head names; None if absent or unreadable
    published_heads: frozenset[str]     # jobs with a jobs/<job>/head.json


@dataclass(frozen=True)
class RecoveryPlan:
    """``source``: the record to put back (None: there is none); ``newest``:
    the newest generation known to have been committed; ``refusals``: why
    it may not be put back without a person (empty: automatic)."""

    damaged: DamagedFile
    source: Candidate | None
    newest: int
    refusals: tuple[str, ...]

    @property
    def automatic(self) -> bool:
        return self.source is not None and not self.refusals


def legible_numbers(data: bytes) -> tuple[int | None, int | None]:
    """(generation, protocol_version) as far as damaged bytes still show them."""
    try:
        parsed = json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError):
        parsed = None
    if isinstance(parsed, dict):
        gen, proto = parsed.get("generation"), parsed.get("protocol_version")
        return (gen if type(gen) is int and gen >= 0 else None,
                proto if type(proto) is int and proto >= 0 else None)
    gen_match = _GENERATION_TEXT.search(data[:4096])
    proto_match = _PROTOCOL_TEXT.search(data[:4096])
    return (int(gen_match.group(1)) if gen_match else None, int(proto_match.group(1)) if proto_match else None)


def best_candidate(candidates: tuple[Candidate, ...]) -> Candidate | None:
    """The newest record; of two with one generation, the first given
    (generation files are listed before the backup)."""
    best: Candidate | None = None
    for candidate in candidates:
        if best is None or candidate.generation > best.generation:
            best = candidate
    return best


def plan_recovery(evidence: Evidence) -> RecoveryPlan:
    """Decide (the rule is the module's docstring; the table is in the tests)."""
    damaged = evidence.damaged
    source = best_candidate(evidence.candidates)
    known = [*evidence.committed, *([damaged.generation] if damaged.generation is not None else [])]
    newest = max([*known, source.generation if source else 0, 0])
    refusals: list[str] = []
    if damaged.protocol_version is not None and damaged.protocol_version > PROTOCOL_VERSION:
        refusals.append(f"{damaged.path} was written by a newer elastic-ray (protocol "
                        f"{damaged.protocol_version}); upgrade elastic-ray instead of restoring an older record")
    if source is None:
        refusals.append("no readable generation file and no readable allocation.json.bak to restore from")
    else:
        if source.generation < newest:
            refusals.append(f"the best copy ({source.source}) holds generation {source.generation}, but generation "
                            f"{newest} was committed: restoring it would lose the newer updates")
        recorded = source.record.recorded_jobs
        if evidence.pointer is not None and evidence.pointer not in recorded:
            refusals.append(f"ray_head names job {evidence.pointer}, which {source.source} does not record: "
                            "the copy is older than the live head")
        unknown = sorted(evidence.published_heads - recorded, key=int)
        if unknown:
            refusals.append(f"jobs {', '.join(unknown)} published a head endpoint but {source.source} does not "
                            "record them: the copy is older than what ran since")
    return RecoveryPlan(damaged, source, newest, tuple(refusals))


def pointer_to_restore(damaged: bool, record: AllocationRecord, now: float) -> str | None:
    """The job to write back into a damaged ``ray_head``: the record's head,
    unless there is none or an election is under way (its elector moves the
    pointer itself, right after recording the new head)."""
    if not damaged or record.head_job is None:
        return None
    if record.election is not None and record.election.is_live(now):
        return None
    return record.head_job


def describe(plan: RecoveryPlan) -> str:
    """One paragraph for a person: what would be restored, and why not automatically."""
    if plan.source is None:
        lines = [f"{plan.damaged.path}: {plan.damaged.reason}", "nothing to restore from"]
    else:
        rec = plan.source.record
        workers = ", ".join(sorted(rec.workers, key=int)) or "none"
        lines = [f"{plan.damaged.path}: {plan.damaged.reason}",
                 f"would restore {plan.source.source} (generation {plan.source.generation}; newest known "
                 f"{plan.newest}): head job {rec.head_job or '-'}, worker allocations {workers}, predecessors "
                 f"{', '.join(rec.predecessors) or 'none'}"]
    lines += [f"not automatic: {why}" for why in plan.refusals]
    return "\n".join(lines)


__all__ = ["REPAIR_COMMAND", "Candidate", "DamagedFile", "Evidence", "RecoveryPlan", "best_candidate", "describe",
           "legible_numbers", "plan_recovery", "pointer_to_restore"]
