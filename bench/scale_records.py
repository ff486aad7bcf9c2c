"""Parts (d) and (e) of ``bench_scale.py``: allocation.json at scale, without agents.

(d) The election decision at 1,000 worker allocations, along the path a
caller takes (``Failover.replace_head``): read allocation.json, take the
scheduler's answer, assess the head, take the session's election claim
(a locked write of allocation.json), let ``election.choose_head`` pick, and
give the claim back. The scheduler answer is prepared (1,000 JobInfos): the
query itself is Slurm's cost, measured in ``bench_scheduler_load.py``.

(e) 200 writer processes that each add their own worker record at the same
moment through ``SessionDir.update_allocation`` with ``failures.record_worker``
(the session's own step after a submission), released together by a barrier.

Both run in a throwaway session directory made with ``SessionDir.create``.
Forked writers: call :func:`lock_contention` before the process starts any
thread (the bench runs it before the cluster is up).
"""

from __future__ import annotations

import multiprocessing as mp
import statistics
import sys
import time
import uuid
from pathlib import Path
from types import MappingProxyType

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_coordinator_decisions import build  # noqa: E402

from elastic_ray.coordinator.head import election
from elastic_ray.coordinator.allocations import failures  # noqa: E402
from elastic_ray.coordinator.head.claims import election_claim  # noqa: E402
from elastic_ray.protocol.disk.records import AllocationRecord, SessionInfo, WorkerRecord  # noqa: E402
from elastic_ray.protocol.disk.session_dir import SessionDir  # noqa: E402


def new_session_dir(path: Path) -> SessionDir:
    info = SessionInfo(session_id=uuid.uuid4().hex, job_name=f"er-{uuid.uuid4().hex[:8]}", created_at=time.time(),
                       scheduler={"kind": "local", "state_dir": str(path / "local-scheduler")},
                       head={"partition": "head", "time_limit": "60"}, ray_head_only=True,
                       worker_allocation=None, launcher={}, user="bench")
    return SessionDir.create(path, info)


def spread(samples: list[float], unit: float = 1e3, fmt: str = "{:.1f}") -> str:
    """median (range min-max), in ms by default."""
    return (f"median {fmt.format(statistics.median(samples) * unit)} "
            f"(range {fmt.format(min(samples) * unit)}-{fmt.format(max(samples) * unit)})")


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


# --------------------------------------------------------------------------- (d)

def election_decision(work: Path, allocations: int = 1000, runs: int = 7) -> dict:
    """Time the caller's path from reading the record to the chosen head."""
    record, infos = build(allocations)
    directory = new_session_dir(work / "election")
    # The record as a real session holds it: committed through the locked update.
    directory.update_allocation(lambda r: AllocationRecord.from_dict({**record.to_dict(),
                                                                      "generation": r.generation}))
    size = directory.allocation_file.stat().st_size
    phases: dict[str, list[float]] = {k: [] for k in ("read", "assess", "claim", "choose", "release", "total")}
    choice = None
    for i in range(runs + 1):           # the first run warms the caches and is not counted
        claimant = f"{__import__('socket').gethostname()}:{__import__('os').getpid()}:{i}"
        t0 = time.perf_counter()
        rec = directory.read_allocation()
        t1 = time.perf_counter()
        assessment = election.assess_head(rec, infos, head_alive=False, now=time.time())
        t2 = time.perf_counter()
        claim_cm = election_claim(directory, claimant, election.DEFAULT_CLAIM_PERIOD)
        claim = claim_cm.__enter__()
        t3 = time.perf_counter()
        choice = election.choose_head(claim.record, infos, can_host_on_worker=True, now=time.time())
        t4 = time.perf_counter()
        claim_cm.__exit__(None, None, None)
        t5 = time.perf_counter()
        if not (assessment.needs_election and claim.held):
            raise RuntimeError(f"bench (d): expected an election and a held claim, got {assessment.why!r} "
                               f"held={claim.held}")
        if i == 0:
            continue
        for key, value in (("read", t1 - t0), ("assess", t2 - t1), ("claim", t3 - t2), ("choose", t4 - t3),
                           ("release", t5 - t4), ("total", t5 - t0)):
            phases[key].append(value)
        phases.setdefault("decided", []).append(t4 - t0)
    return {"allocations": allocations, "bytes": size, "phases": phases, "choice": choice, "runs": runs}


# --------------------------------------------------------------------------- (e)

def _writer(path: str, job: str, barrier, results) -> None:
    directory = SessionDir(path)
    barrier.wait()
    t0 = time.perf_counter()
    start = time.time()
    try:
        directory.update_allocation(lambda r: failures.record_worker(r, WorkerRecord(
            job_id=job, config={"partition": "sim", "nodes": 1, "time_limit": "60"}, submitted_at=start)),
            timeout=300)
        results.put((job, time.perf_counter() - t0, time.time(), None))
    except Exception as exc:       # reported, not hidden
        results.put((job, time.perf_counter() - t0, time.time(), repr(exc)))


def lock_contention(work: Path, writers: int = 200, rounds: int = 5, children: list | None = None) -> dict:
    """``writers`` processes add one worker record each, all at once; ``rounds`` times."""
    ctx = mp.get_context("fork")
    totals: list[float] = []
    per_write: list[float] = []
    errors: list[str] = []
    records_after: list[int] = []
    for rnd in range(rounds):
        directory = new_session_dir(work / f"contention-{rnd}")
        # Earlier allocations in the record, as in a long run: 100 of them.
        base = {str(500000 + k): WorkerRecord(job_id=str(500000 + k), config={"partition": "sim"},
                                              submitted_at=time.time()) for k in range(100)}
        directory.update_allocation(lambda r: AllocationRecord.from_dict(
            {**r.to_dict(), "workers": {k: w.to_dict() for k, w in base.items()}}))
        barrier = ctx.Barrier(writers + 1)
        results = ctx.Queue()
        procs = [ctx.Process(target=_writer, args=(str(directory.path), str(600000 + rnd * 1000 + k), barrier,
                                                   results), daemon=True) for k in range(writers)]
        for p in procs:
            p.start()
            if children is not None:
                children.append(p.pid)
        barrier.wait(timeout=120)
        released = time.time()
        got = [results.get(timeout=600) for _ in range(writers)]
        for p in procs:
            p.join(timeout=30)
        totals.append(max(end for _, _, end, _ in got) - released)
        per_write.extend(seconds for _, seconds, _, _ in got)
        errors.extend(f"{job}: {err}" for job, _, _, err in got if err)
        records_after.append(len(directory.read_allocation().workers))
    return {"writers": writers, "rounds": rounds, "totals": totals, "per_write": per_write, "errors": errors,
            "records_after": records_after}


def record_count_check(result: dict) -> str:
    expected = 100 + result["writers"]
    ok = all(n == expected for n in result["records_after"])
    return (f"every round ends with {expected} records" if ok
            else f"LOST UPDATES: records after each round {result['records_after']}, expected {expected}")


__all__ = ["election_decision", "lock_contention", "spread", "percentile", "record_count_check",
           "MappingProxyType"]
