"""What a run's idle Ray side costs under the defaults of issue 24 (warm standby head, gRPC keepalive).

Prints figures; asserts nothing. Runs on the LOCAL scheduler with real agents
and real Ray (no Slurm lab); hold the lab lock on a shared box:

    flock /tmp/elastic-lab.lock .venv/bin/python bench/bench_run_cost.py [--runs 5] [--seconds 60] [--modes ...]

Each run alternates sessions built the same way but for the launcher:
``bare`` (``standby_head=False, network_keepalive_ms=None``: neither),
``standby`` (the warm standby only), ``keepalive`` (gRPC keepalive every
2 s only), ``default`` (``RayLauncher()``, whatever the defaults are in
this tree) and ``nowarm`` (the default without the worker kept joined to the
standby, ``ELASTIC_AGENT_STANDBY_WORKER=off``). Each session: a separate head on ``cpu``, one worker allocation
of one node with 2 CPUs on ``gpu-a``, the session's own supervisor
(``Session.create``'s default, which places the standby). Once the worker
is JOINED (and, where a standby is wanted, its first node reports it as
STANDBY, with its worker where it keeps one) and ``--settle`` seconds passed, the processes of the head's job
and of the worker's job (by the ``SLURM_JOB_ID`` and ``SLURM_JOB_NAME`` in their environment: the
agents, the Ray nodes and the standby's GCS, raylet and helpers) are
measured over ``--seconds``: how many, their RSS and PSS summed, and the
CPU they used as a share of one core. Costs are differences between
columns of the same run.

Also printed: how long after the worker's node JOINED the standby was
ready (the supervisor's keeper places it at its next look, then ``ray start
--head`` and the raylet's registration).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import time
from unittest import mock
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import psutil  # noqa: E402

from elastic_ray import SlurmRunAllocationConfig, SlurmWorkerAllocationConfig  # noqa: E402
from elastic_ray.config.launcher import RayLauncher  # noqa: E402
from elastic_ray.coordinator.session import Session  # noqa: E402
from elastic_ray.polling import wait_for  # noqa: E402
from elastic_ray.protocol.disk.records import AgentState, HostedHeadState  # noqa: E402

MODES = {
    "bare": {"standby_head": False, "network_keepalive_ms": None},
    "standby": {"standby_head": True, "network_keepalive_ms": None},
    "keepalive": {"standby_head": False, "network_keepalive_ms": 2000},
    "default": {},
    "nowarm": {},   # the default without the standby's worker (ELASTIC_AGENT_STANDBY_WORKER=off)
}
#: Agent settings of a mode (forwarded to its nodes by the session).
MODE_ENV = {"nowarm": {"ELASTIC_AGENT_STANDBY_WORKER": "off"}}


def job_processes(job: str, name: str) -> list[psutil.Process]:
    """Every live process whose environment says it belongs to job ``job`` named ``name`` (the
    local scheduler numbers each session's jobs from 1: the name tells sessions apart)."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.pid == os.getpid() or proc.status() == psutil.STATUS_ZOMBIE:
                continue
            env = proc.environ()
            if env.get("SLURM_JOB_ID") == job and env.get("SLURM_JOB_NAME") == name:
                found.append(proc)
        except (psutil.Error, OSError):
            continue
    return found


def measure_groups(groups: dict[str, list[psutil.Process]], seconds: float) -> dict[str, dict[str, float]]:
    """Per group: count, RSS and PSS (MiB, summed) and CPU (% of one core) over the same ``seconds``."""
    def cpu(p: psutil.Process) -> float:
        try:
            t = p.cpu_times()
            return t.user + t.system
        except psutil.Error:
            return 0.0

    before = {p.pid: cpu(p) for procs in groups.values() for p in procs}
    t0 = time.monotonic()
    time.sleep(seconds)
    wall = time.monotonic() - t0
    out = {}
    for name, procs in groups.items():
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
        out[name] = {"processes": alive, "rss": rss / 2**20, "pss": pss / 2**20, "cpu": used / wall * 100}
    return out


def first_node_state(session: Session, job: str):
    return next(iter(session.node_states(job).values()), None)


def one_run(work: Path, mode: str, settle: float, seconds: float) -> dict[str, dict[str, float]]:
    launcher = RayLauncher(object_store_memory=100_000_000, **MODES[mode])
    with mock.patch.dict(os.environ, MODE_ENV.get(mode, {})):   # recorded in session.json at create
        session = Session.create(work / f"{mode}-{time.time_ns()}", scheduler="local",
                                 head=SlurmRunAllocationConfig(partition="cpu", time_limit="30", mem="1G"),
                                 launcher=launcher)
    warm = mode != "nowarm"
    try:
        session.wait_for_head(timeout=120)
        handle = session.add_worker_allocation(SlurmWorkerAllocationConfig(
            partition="gpu-a", num_nodes=1, cpus_per_task=2, mem="2G", time_limit="30"))
        state = wait_for(lambda: (s := first_node_state(session, handle.job_id)) is not None
                         and s.state is AgentState.JOINED and s, timeout=120, interval=0.2,
                         what="the worker's node to join")
        joined_at = next((t.at for t in reversed(state.transitions) if t.to_state is AgentState.JOINED), time.time())
        ready = float("nan")
        if launcher.keeps_standby:
            wait_for(lambda: (s := first_node_state(session, handle.job_id)) is not None
                     and s.hosted_head is not None and s.hosted_head.state is HostedHeadState.STANDBY
                     and (s.hosted_head.worker_pid is not None or not warm),
                     timeout=180, interval=0.2, what="the standby head")
            ready = time.time() - joined_at
        time.sleep(settle)
        head_job = session.record().head_job
        groups = {"head": job_processes(head_job, session.job_name),
                  "worker": job_processes(handle.job_id, session.job_name)}
        rows = measure_groups(groups, seconds)
        rows["worker"]["ready"] = ready
        print(f"  {mode:9}: " + "; ".join(
            f"{who} {r['processes']:.0f} processes, RSS {r['rss']:.0f} MiB, PSS {r['pss']:.0f} MiB, "
            f"CPU {r['cpu']:.2f} %" for who, r in rows.items())
              + ("" if ready != ready else f"; standby ready {ready:.1f} s after the node joined"), flush=True)
        return rows
    finally:
        # Wait until every job of the session ended, so that its processes are not counted in the
        # next run's window (nor load it).
        session.teardown(wait=True, timeout=120)


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
    ap.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, from {', '.join(MODES)}")
    args = ap.parse_args(argv)
    for name in ("runs", "seconds"):
        if getattr(args, name) <= 0:
            ap.error(f"--{name} must be above zero")
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    bad = [m for m in modes if m not in MODES]
    if bad or not modes:
        ap.error(f"--modes: unknown mode(s) {bad}; use {', '.join(MODES)}")
    print(f"default launcher here: keeps_standby={RayLauncher().keeps_standby}, "
          f"network_keepalive_ms={RayLauncher().network_keepalive_ms}", flush=True)
    work = Path(os.environ.get("TMPDIR", "/tmp")) / f"bench-run-cost-{os.getpid()}"
    rows: dict[str, list[dict[str, dict[str, float]]]] = {m: [] for m in modes}
    try:
        for i in range(args.runs):
            print(f"run {i + 1}/{args.runs}", flush=True)
            for mode in modes:
                rows[mode].append(one_run(work, mode, args.settle, args.seconds))
    finally:
        shutil.rmtree(work, ignore_errors=True)

    print(f"\nprocesses of the head's and the worker's job, {args.runs} alternating runs, window "
          f"{args.seconds:.0f} s; median (range)")
    print(f"| job | figure | {' | '.join(modes)} |")
    print(f"|---|---|{'---:|' * len(modes)}")
    for who in ("head", "worker"):
        for key, label, digits in (("processes", "processes", 0), ("rss", "RSS, MiB", 0), ("pss", "PSS, MiB", 0),
                                   ("cpu", "CPU, % of one core", 2)):
            cells = [fmt([r[who][key] for r in rows[m]], digits) for m in modes]
            print(f"| {who} | {label} | {' | '.join(cells)} |")
    cells = [fmt([r["worker"]["ready"] for r in rows[m]]) for m in modes]
    print(f"| worker | standby ready after the node joined, s | {' | '.join(cells)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
