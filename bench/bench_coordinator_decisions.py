"""What the coordinator's decisions cost with 1,000 worker allocations.

Prints figures; asserts nothing. Run it as

    .venv/bin/python bench/bench_coordinator_decisions.py

A poll of the coordinator is: ONE scheduler query for every job of the
session, then the pure decisions over the answer. The scheduler here is a
double that hands back prepared JobInfos and counts its calls, so the figures
are the decision layer's own cost plus the record's (de)serialisation, which
happens on every locked update of allocation.json.
"""

from __future__ import annotations

import copy
import json
import random
import statistics
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from types import MappingProxyType

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from elastic_ray.coordinator.head.election import assess_head, choose_head, live_workers  # noqa: E402
from elastic_ray.protocol.disk.records import AllocationRecord, WorkerRecord  # noqa: E402
from elastic_ray.scheduler.base import JobInfo, JobState  # noqa: E402

N_WORKERS = 1_000
POLLS = 10
RUNS = 50
NOW = 1_700_000_000.0
JOB_NAME = "er-bench"


class CountingScheduler:
    """The part of the Scheduler interface a poll uses: ``query``, counted."""

    def __init__(self, infos: dict[str, JobInfo]):
        self._infos = infos
        self.calls = 0

    def query(self, job_name: str, job_ids: Iterable[str] = ()) -> dict[str, JobInfo]:
        self.calls += 1
        return dict(self._infos)


def build(n: int, seed: int = 7) -> tuple[AllocationRecord, dict[str, JobInfo]]:
    rnd = random.Random(seed)
    head = "100000"
    workers: dict[str, WorkerRecord] = {}
    infos: dict[str, JobInfo] = {head: JobInfo(job_id=head, name=JOB_NAME, state=JobState.RUNNING,
                                               nodes=("h1",), end_time=NOW + 7200)}
    for i in range(n):
        job = str(100001 + i)
        state = rnd.choices(["submitted", "draining", "removed"], weights=[90, 5, 5])[0]
        workers[job] = WorkerRecord(
            job_id=job, submitted_at=NOW - rnd.uniform(0, 86400), state=state,
            config={"partition": rnd.choice(["cpu", "gpu", "bigmem"]), "nodes": rnd.randint(1, 8),
                    "time_limit": "12:00:00", "gpus_per_node": rnd.choice([0, 4])},
            drain_requested_at=NOW - 10 if state == "draining" else None,
            head_failures=rnd.choices([0, 1, 2], weights=[90, 7, 3])[0],
        )
        job_state = rnd.choices([JobState.RUNNING, JobState.PENDING, JobState.COMPLETED], weights=[80, 15, 5])[0]
        running = job_state is JobState.RUNNING
        infos[job] = JobInfo(
            job_id=job, name=JOB_NAME, state=job_state, partition=workers[job].config["partition"],
            nodes=tuple(f"n{i}-{k}" for k in range(workers[job].config["nodes"])) if running else (),
            submit_time=workers[job].submitted_at, start_time=NOW - 600 if running else None,
            end_time=(NOW + rnd.uniform(60, 43200)) if running and rnd.random() < 0.95 else None,
        )
    record = AllocationRecord(generation=42, head_job=head, workers=MappingProxyType(workers),
                              predecessors=("99998", "99999"))
    return record, infos


def median_seconds(fn: Callable[[], object], runs: int = RUNS) -> float:
    fn()  # warm up
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def fmt(seconds: float) -> str:
    return f"{seconds * 1e3:8.3f} ms" if seconds >= 1e-3 else f"{seconds * 1e6:8.1f} us"


def main() -> None:
    record, infos = build(N_WORKERS)
    scheduler = CountingScheduler(infos)
    job_ids = [record.head_job, *record.workers]

    def poll() -> None:
        answer = scheduler.query(JOB_NAME, job_ids)
        live_workers(record, answer)
        assess_head(record, answer, head_alive=True, now=NOW)

    for _ in range(POLLS):
        poll()
    print(f"worker allocations:               {N_WORKERS}")
    print(f"scheduler queries per poll:       {scheduler.calls / POLLS:g}  "
          f"({scheduler.calls} calls over {POLLS} polls)")

    answer = scheduler.query(JOB_NAME, job_ids)
    live = live_workers(record, answer)
    choice = choose_head(record, answer, can_host_on_worker=True, now=NOW)
    t_live = median_seconds(lambda: live_workers(record, answer))
    t_choose = median_seconds(lambda: choose_head(record, answer, can_host_on_worker=True, now=NOW))
    t_assess = median_seconds(lambda: assess_head(record, answer, head_alive=True, now=NOW))
    print(f"live_workers   (median of {RUNS}):    {fmt(t_live)}   -> {len(live)} live")
    print(f"choose_head    (median of {RUNS}):    {fmt(t_choose)}   -> {type(choice).__name__}({choice.job_id})")
    print(f"assess_head    (median of {RUNS}):    {fmt(t_assess)}")

    data = record.to_dict()
    text = json.dumps(data)

    def plain_copy() -> dict:
        # The cheapest faithful copy: the top level and each worker's dict.
        out = dict(data)
        out["workers"] = {job: {**w, "config": dict(w["config"])} for job, w in data["workers"].items()}
        return out

    baseline = median_seconds(plain_copy)
    t_deep = median_seconds(lambda: copy.deepcopy(data))
    t_records = median_seconds(lambda: AllocationRecord.from_dict(record.to_dict()))
    t_json = median_seconds(lambda: json.loads(json.dumps(data)))
    t_full = median_seconds(lambda: AllocationRecord.from_dict(json.loads(json.dumps(record.to_dict()))))
    print(f"allocation.json size:             {len(text) / 1024:.0f} KiB")
    print(f"baseline: plain copy of the dict  {fmt(baseline)}   1.00x")
    print(f"copy.deepcopy of the dict         {fmt(t_deep)}   {t_deep / baseline:.2f}x")
    print(f"to_dict + from_dict               {fmt(t_records)}   {t_records / baseline:.2f}x")
    print(f"json dumps + loads                {fmt(t_json)}   {t_json / baseline:.2f}x")
    print(f"to_dict+dumps+loads+from_dict     {fmt(t_full)}   {t_full / baseline:.2f}x")


if __name__ == "__main__":
    main()
