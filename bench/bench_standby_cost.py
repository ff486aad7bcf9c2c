"""What the warm standby head costs a run, now that it is on by default (issue 24).

Prints figures; asserts nothing. Runs on the LOCAL scheduler with real agents
and real Ray (no Slurm lab); hold the heavy-run lock on a shared box:

    flock /tmp/elastic-lab.lock .venv/bin/python bench/bench_standby_cost.py [--runs 5] [--seconds 60]

Each run alternates two sessions built the same way, one with
``RayLauncher(standby_head=False)`` (``off``) and one with the default
(``on``): a separate head on ``cpu``, one worker allocation of one node with
2 CPUs on ``gpu-a``, the session's own supervisor (``Session.create``'s
default, which places the standby). Once the worker is JOINED (and, for
``on``, its first node reports the standby as STANDBY) and ``--settle``
seconds passed, every process of the worker's job (its environment's
``SLURM_JOB_ID``: the agent, its Ray worker node and, with ``on``, the
standby's GCS, raylet and helpers) is measured over ``--seconds``: how many,
their RSS and PSS summed, and the CPU they used as a share of one core.
The standby's cost is the ``on`` column minus the ``off`` one, run by run.

Also printed: how long after the worker's node JOINED the standby was ready
(the supervisor's keeper places it at its next look, then ``ray start
--head`` and the raylet's registration).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import psutil  # noqa: E402

from elastic_ray import SlurmRunAllocationConfig, SlurmWorkerAllocationConfig  # noqa: E402
from elastic_ray.config.launcher import RayLauncher  # noqa: E402
from elastic_ray.coordinator.session import Session  # noqa: E402
from elastic_ray.polling import wait_for  # noqa: E402
from elastic_ray.protocol.disk.records import AgentState, HostedHeadState  # noqa: E402

MODES = ("off", "on")


def job_processes(job: str) -> list[psutil.Process]:
    """Every live process whose environment says it belongs to ``job``."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.pid == os.getpid() or proc.status() == psutil.STATUS_ZOMBIE:
                continue
            if proc.environ().get("SLURM_JOB_ID") == job:
                found.append(proc)
        except (psutil.Error, OSError):
            continue
    return found


def measure(procs: list[psutil.Process], seconds: float) -> dict[str, float]:
    """Count, RSS and PSS (MiB, summed) and CPU (% of one core) of ``procs`` over ``seconds``."""
    def cpu(p: psutil.Process) -> float:
        try:
            t = p.cpu_times()
            return t.user + t.system
        except psutil.Error:
            return 0.0

    before = {p.pid: cpu(p) for p in procs}
    t0 = time.monotonic()
    time.sleep(seconds)
    wall = time.monotonic() - t0
    used = sum(max(0.0, cpu(p) - before[p.pid]) for p in procs)
    rss = pss = 0
    alive = 0
    for p in procs:
        try:
            info = p.memory_full_info()
        except psutil.Error:
            continue
        alive += 1
        rss += info.rss
        pss += getattr(info, "pss", 0)
    return {"processes": alive, "rss": rss / 2**20, "pss": pss / 2**20, "cpu": used / wall * 100}


def first_node_state(session: Session, job: str):
    return next(iter(session.node_states(job).values()), None)


def one_run(work: Path, mode: str, settle: float, seconds: float) -> dict[str, float]:
    launcher = RayLauncher(object_store_memory=100_000_000, standby_head=mode == "on")
    session = Session.create(work / f"{mode}-{time.time_ns()}", scheduler="local",
                             head=SlurmRunAllocationConfig(partition="cpu", time_limit="30", mem="1G"),
                             launcher=launcher)
    try:
        session.wait_for_head(timeout=120)
        handle = session.add_worker_allocation(SlurmWorkerAllocationConfig(
            partition="gpu-a", num_nodes=1, cpus_per_task=2, mem="2G", time_limit="30"))
        state = wait_for(lambda: (s := first_node_state(session, handle.job_id)) is not None
                         and s.state is AgentState.JOINED and s, timeout=120, interval=0.2,
                         what="the worker's node to join")
        joined_at = next((t.at for t in reversed(state.transitions) if t.to_state is AgentState.JOINED), time.time())
        ready = None
        if mode == "on":
            wait_for(lambda: (s := first_node_state(session, handle.job_id)) is not None
                     and s.hosted_head is not None and s.hosted_head.state is HostedHeadState.STANDBY,
                     timeout=180, interval=0.2, what="the standby head")
            ready = time.time() - joined_at
        time.sleep(settle)
        row = measure(job_processes(handle.job_id), seconds)
        row["ready"] = ready if ready is not None else float("nan")
        print(f"  {mode:3}: {row['processes']:.0f} processes, RSS {row['rss']:.0f} MiB, PSS {row['pss']:.0f} MiB, "
              f"CPU {row['cpu']:.2f} % of a core"
              + (f", standby ready {ready:.1f} s after the node joined" if ready is not None else ""), flush=True)
        return row
    finally:
        session.teardown()


def fmt(xs: list[float], digits: int = 1) -> str:
    xs = [x for x in xs if x == x]   # NaN: not measured in that mode
    if not xs:
        return "-"
    return f"{statistics.median(xs):.{digits}f} ({min(xs):.{digits}f}-{max(xs):.{digits}f})"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5, help="runs of each mode, alternating")
    ap.add_argument("--seconds", type=float, default=60.0, help="length of the measuring window")
    ap.add_argument("--settle", type=float, default=10.0, help="wait after the node (and standby) is up")
    args = ap.parse_args(argv)
    for name in ("runs", "seconds"):
        if getattr(args, name) <= 0:
            ap.error(f"--{name} must be above zero")
    work = Path(os.environ.get("TMPDIR", "/tmp")) / f"bench-standby-{os.getpid()}"
    rows: dict[str, list[dict[str, float]]] = {m: [] for m in MODES}
    for i in range(args.runs):
        print(f"run {i + 1}/{args.runs}", flush=True)
        for mode in MODES:
            rows[mode].append(one_run(work, mode, args.settle, args.seconds))

    print(f"\nthe worker job's processes, {args.runs} alternating runs, window {args.seconds:.0f} s; "
          f"median (range)")
    print("| figure | standby off | standby on (default) | on - off |")
    print("|---|---:|---:|---:|")
    for key, label, digits in (("processes", "processes", 0), ("rss", "RSS, MiB", 0), ("pss", "PSS, MiB", 0),
                               ("cpu", "CPU, % of one core", 2)):
        diff = [on[key] - off[key] for on, off in zip(rows["on"], rows["off"])]
        print(f"| {label} | {fmt([r[key] for r in rows['off']], digits)} | "
              f"{fmt([r[key] for r in rows['on']], digits)} | {fmt(diff, digits)} |")
    print(f"| standby ready after the node joined, s | - | {fmt([r['ready'] for r in rows['on']])} | |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
