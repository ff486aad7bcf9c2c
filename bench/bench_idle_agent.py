"""What an idle agent costs, and how soon head loss is noticed, from one build.

Prints figures; asserts nothing. Runs on the LOCAL scheduler with real agents
and real Ray (no Slurm lab needed); hold the heavy-run lock on a shared box:

    flock /tmp/elastic-heavy.lock .venv/bin/python bench/bench_idle_agent.py [--windows 5] [--seconds 60] [--gpus 2]

``--gpus 2`` gives the worker's node two (Ray-counted) GPUs, so its agent
runs its GPU-load sampler (``agent/node/ray_load``): run it with and without
to see what the sampler costs an idle agent.

1. A separate head (the head agent plus a head-only Ray) and one worker
   allocation of one node; once the worker is JOINED and 10 s have passed,
   ``--windows`` consecutive windows of ``--seconds`` each. In every window
   both agents are measured at once: the CPU time (user + system) of the
   agent process alone, not its Ray children, over the window's wall time,
   and its RSS. Median and range over the windows are printed; measuring
   both in the same windows means both see the same machine.
2. The machine's load in those windows: the load average, and the CPU that
   every other process used (the whole machine minus the two agents), so a
   figure taken next to another helper's heavy run can be told apart.
3. Head loss, in the same run: the head agent and its Ray node are killed
   with SIGKILL (so no last "I am going" heartbeat is sent: silence is what
   is detected), and the time is taken until (a) a Session's ``HeadWatch``
   in this process reports the head not alive (the "no caller" path: the
   supervisor's view), (b) the worker agent logs ``head_silent`` (its
   heartbeat silence check), and (c) the worker agent's published state
   leaves JOINED (after its GCS probe confirmed the head gone).
"""

from __future__ import annotations

import argparse
import datetime
import inspect
import os
import signal
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import psutil  # noqa: E402

from elastic_ray import SlurmRunAllocationConfig, SlurmWorkerAllocationConfig  # noqa: E402
from elastic_ray.config.launcher import RayLauncher  # noqa: E402
from elastic_ray.coordinator.head.headwatch import HeadWatch  # noqa: E402
from elastic_ray.coordinator.session import Session  # noqa: E402
from elastic_ray.polling import wait_for  # noqa: E402
from elastic_ray.protocol.disk import paths  # noqa: E402


def poll(predicate, timeout: float, interval: float = 0.1):
    """The project's one polling loop (raises a TimeoutError naming the last look)."""
    return wait_for(predicate, timeout=timeout, interval=interval, what="the bench's condition")


def one_state(session: Session, job: str) -> dict:
    state = next(iter(session.node_states(job).values()), None)
    return state.to_dict() if state is not None else {}


def cpu_seconds(proc: psutil.Process) -> float:
    t = proc.cpu_times()
    return t.user + t.system


def run_seconds(proc: psutil.Process) -> tuple[float, int]:
    """CPU time to the nanosecond and the number of times scheduled, summed
    over the process's threads (``/proc/PID/task/*/schedstat``): an idle
    agent uses a few milliseconds a second, and ``cpu_times()`` counts in
    10 ms ticks, so one tick more or less moves a 60 s window by 0.017 %."""
    ns = runs = 0
    for task in os.listdir(f"/proc/{proc.pid}/task"):
        try:
            with open(f"/proc/{proc.pid}/task/{task}/schedstat") as handle:
                on_cpu, _waited, scheduled = (int(x) for x in handle.read().split())
        except (OSError, ValueError):
            continue   # a thread that ended meanwhile
        ns += on_cpu
        runs += scheduled
    return ns / 1e9, runs


def machine_busy_seconds() -> float:
    t = psutil.cpu_times()
    return t.user + t.nice + t.system + t.irq + t.softirq + t.steal


def measure_windows(procs: dict[str, psutil.Process], windows: int, seconds: float) -> tuple[dict, list[dict]]:
    rows: dict[str, list[dict]] = {k: [] for k in procs}
    machine: list[dict] = []
    for i in range(windows):
        t0 = time.monotonic()
        before = {k: cpu_seconds(p) for k, p in procs.items()}
        precise = {k: run_seconds(p) for k, p in procs.items()}
        busy0 = machine_busy_seconds()
        rss_peak = {k: 0 for k in procs}
        end = t0 + seconds
        while time.monotonic() < end:
            for k, p in procs.items():
                rss_peak[k] = max(rss_peak[k], p.memory_info().rss)
            time.sleep(min(5.0, max(0.0, end - time.monotonic())))
        wall = time.monotonic() - t0
        ours = 0.0
        for k, p in procs.items():
            used = cpu_seconds(p) - before[k]
            ran, scheduled = run_seconds(p)
            ours += used
            rows[k].append({"cpu": used / wall * 100, "cpu_ns": (ran - precise[k][0]) / wall * 100,
                            "wakeups": (scheduled - precise[k][1]) / wall,
                            "rss": p.memory_info().rss, "rss_peak": rss_peak[k]})
        others = (machine_busy_seconds() - busy0 - ours) / wall * 100
        machine.append({"others": others, "load1": os.getloadavg()[0]})
        print(f"  window {i + 1}/{windows}: " + ", ".join(
            f"{k} {rows[k][-1]['cpu']:.3f} % (schedstat {rows[k][-1]['cpu_ns']:.3f} %, "
            f"{rows[k][-1]['wakeups']:.2f} runs/s)" for k in procs)
              + f"; rest of the machine {others:.1f} % of one core, load {machine[-1]['load1']:.2f}", flush=True)
    return rows, machine


def log_time(log_file: Path, event: str, after: float) -> float | None:
    """The wall time of the first ``event=`` line at or after ``after`` in an agent log."""
    try:
        lines = log_file.read_text(errors="replace").splitlines()
    except OSError:
        return None
    for line in lines:
        if f"event={event} " not in line and not line.endswith(f"event={event}"):
            continue
        stamp = " ".join(line.split(" ", 2)[:2])
        try:
            at = datetime.datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()
        except ValueError:
            continue
        if at >= after - 0.01:
            return at
    return None


def kill_head(head_state: dict) -> None:
    """SIGKILL the head agent, then its Ray node's whole process session (the
    agent starts ``ray start`` with setsid, so the session id is its PID):
    only processes of this run, found by the PIDs the head agent published."""
    agent = psutil.Process(head_state["pid"])
    ray_pid = head_state.get("ray_pid")
    targets = [agent]
    if ray_pid:
        for proc in psutil.process_iter(["pid"]):
            try:
                if os.getsid(proc.pid) == ray_pid:
                    targets.append(proc)
            except (ProcessLookupError, PermissionError, psutil.Error):
                continue
    for proc in targets:
        try:
            proc.send_signal(signal.SIGKILL)
        except psutil.Error:
            pass


def head_loss(session: Session, head_state: dict, worker_job: str, worker_log: Path) -> dict:
    watch = HeadWatch(session.dir, session.secret, session.info.session_id)
    poll(lambda: watch.observe(wait=0.2).alive, 30)
    killed = time.time()
    kill_head(head_state)
    seen_lost = left_joined = None
    deadline = killed + 30
    while time.time() < deadline and (seen_lost is None or left_joined is None):
        if seen_lost is None and not watch.observe(wait=0.02).alive:
            seen_lost = time.time()
        if left_joined is None and one_state(session, worker_job).get("state") != "JOINED":
            left_joined = time.time()
        time.sleep(0.02)
    watch.close()
    silent = log_time(worker_log, "head_silent", killed)
    rel = lambda t: None if t is None else t - killed  # noqa: E731
    return {"headwatch": rel(seen_lost), "worker_silent": rel(silent), "worker_left_joined": rel(left_joined)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--windows", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--settle", type=float, default=10.0)
    parser.add_argument("--gpus", type=int, default=0,
                        help="GPUs of the worker's node (Ray's count: none is needed); with any, the worker's "
                             "agent reads their load from Ray's metrics every ELASTIC_AGENT_GPU_SAMPLE_INTERVAL s")
    args = parser.parse_args()
    work = Path(os.environ.get("TMPDIR", "/tmp")) / f"bench-idle-{os.getpid()}"
    kwargs = {"supervise": False} if "supervise" in inspect.signature(Session.create).parameters else {}
    session = Session.create(work / "session", scheduler="local",
                             head=SlurmRunAllocationConfig(partition="cpu", time_limit="60", mem="2G"),
                             launcher=RayLauncher(object_store_memory=100_000_000), **kwargs)
    try:
        session.wait_for_head(timeout=120)
        handle = session.add_worker_allocation(SlurmWorkerAllocationConfig(
            partition="gpu-b", num_nodes=1, gpus_per_node=args.gpus, cpus_per_task=1, mem="1G", time_limit="60"))
        worker = poll(lambda: (s := one_state(session, handle.job_id)).get("state") == "JOINED" and s, 120)
        head_job = session.dir.read_ray_head()
        head = one_state(session, head_job)
        procs = {"worker agent": psutil.Process(worker["pid"]), "head agent": psutil.Process(head["pid"])}
        print(f"head job {head_job} (agent pid {head['pid']}), worker job {handle.job_id} "
              f"(agent pid {worker['pid']}); {psutil.cpu_count()} CPUs; settling {args.settle:.0f} s", flush=True)
        time.sleep(args.settle)
        rows, machine = measure_windows(procs, args.windows, args.seconds)
        worker_log = paths.agent_log(session.path, handle.job_id, worker["node"])
        loss = head_loss(session, head, handle.job_id, worker_log)
    finally:
        session.teardown()

    print()
    print(f"idle agents, {args.windows} windows of {args.seconds:.0f} s, both agents measured in each window "
          f"(agent process only, not Ray):")
    for who, data in rows.items():
        cpus = [r["cpu"] for r in data]
        exact = [r["cpu_ns"] for r in data]
        runs = [r["wakeups"] for r in data]
        rss = max(r["rss_peak"] for r in data) / 2**20
        print(f"  {who:12}: CPU median {statistics.median(cpus):.3f} % (range {min(cpus):.3f}-{max(cpus):.3f}) "
              f"of one core; RSS {data[-1]['rss'] / 2**20:.1f} MiB (peak {rss:.1f})")
        print(f"  {'':12}  schedstat: {statistics.median(exact):.3f} % ({min(exact):.3f}-{max(exact):.3f}), "
              f"scheduled {statistics.median(runs):.2f}/s ({min(runs):.2f}-{max(runs):.2f}), all threads")
    others = [m["others"] for m in machine]
    loads = [m["load1"] for m in machine]
    print(f"  machine load meanwhile: other processes used {statistics.median(others):.1f} % of one core "
          f"(range {min(others):.1f}-{max(others):.1f}, of {psutil.cpu_count() * 100} %), "
          f"1-min load average {min(loads):.2f}-{max(loads):.2f}")
    fmt = lambda v: "not seen" if v is None else f"{v:.2f} s"  # noqa: E731
    print("head loss (head agent and its Ray SIGKILLed, same run):")
    print(f"  Session HeadWatch says not alive after {fmt(loss['headwatch'])}")
    print(f"  worker agent logs head_silent after   {fmt(loss['worker_silent'])}")
    print(f"  worker agent leaves JOINED after      {fmt(loss['worker_left_joined'])} (includes its GCS probe)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
