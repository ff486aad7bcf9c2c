"""200 worker agents against one head agent: what grows with the number of nodes.

Prints figures; asserts nothing. Needs no Slurm lab; hold the heavy-run lock:

    flock /tmp/elastic-heavy.lock .venv/bin/python bench/bench_scale.py [--nodes 200]

SIMULATION: NO RAY RUNS. Every agent is a real ``elastic-agent`` process
started by the local scheduler (one job of ``--nodes`` nodes, each on its own
127.x.y.z address), with the real session directory, ZeroMQ heartbeat and
control channel, node files and logs. Only Ray is replaced, through the two
simulation hooks of ``elastic_ray/agent/node/simulation.py``:
``ELASTIC_RAY_RAY_EXECUTABLE`` points at ``bench/standin/ray`` (a shell script
that writes the raylet log lines the agent reads to decide JOINED and keeps a
process named ``raylet`` alive), and ``ELASTIC_RAY_GCS_PROBE`` at
``bench/standin/gcs_probe.py`` (answers every GCS probe like a healthy GCS).
So the figures are the agents' and the coordinator's own costs; Ray's (a
raylet per node, the GCS's fan-out to 200 raylets) are not in them.

a) The head agent's CPU with all followers JOINED (5 windows, 60 s in all),
   its descriptors and TCP connections, and the heartbeat fan-out: beats/s
   and bytes per beat seen by one extra subscriber, times the subscribers;
   plus the loopback traffic of the whole machine meanwhile.
b) ``elastic-ray session status`` at that size: the real CLI in a subprocess
   (5 runs) and the in-process parts (open, collect_status, render).
c) Moving the head: a successor head allocation is submitted and becomes
   ready, then ``Failover.switch_head`` records it, moves the ``ray_head``
   pointer and nudges every agent; timed until every worker agent published
   that it follows the new head, and until all are JOINED on it (5 moves).
d) The election decision at 1,000 worker allocations (``scale_records``).
e) 200 processes writing allocation.json at once (``scale_records``); run
   first, before any thread or agent exists, since the writers are forked.
f) A short paper section from these figures (also in bench/README.md).

Every process the bench starts carries a marker in its environment; at the
end (also on error or Ctrl-C) the session is torn down, and whatever still
carries the marker is killed by PID, and the count of leftovers printed.
"""

from __future__ import annotations

import argparse
import ctypes
import io
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import replace
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(BENCH))

import psutil  # noqa: E402
import zmq  # noqa: E402

from scale_records import election_decision, lock_contention  # noqa: E402
from scale_report import STANDIN, report  # noqa: E402

from elastic_ray import SlurmRunAllocationConfig, SlurmWorkerAllocationConfig  # noqa: E402
from elastic_ray.agent.node.simulation import GCS_PROBE_ENV, RAY_EXECUTABLE_ENV  # noqa: E402
from elastic_ray.polling import wait_for  # noqa: E402
from elastic_ray.config.launcher import RayLauncher  # noqa: E402
from elastic_ray.protocol.wire import curve  # noqa: E402
from elastic_ray.scheduler.local import LocalCluster, LocalScheduler  # noqa: E402
from elastic_ray.scheduler.local.cluster import LocalNode  # noqa: E402

MARKER = "ELASTIC_BENCH_SCALE_RUN"
HEADS = 7                      # the first head plus one successor per move


def log(text: str = "") -> None:
    print(text, flush=True)


def wait(predicate, timeout: float, interval: float = 0.2, what: str = "condition"):
    """The project's one polling loop (raises a TimeoutError naming ``what``)."""
    return wait_for(predicate, timeout=timeout, interval=interval, what=what)


def cluster(nodes: int) -> LocalCluster:
    heads = [LocalNode(f"head-{i}", f"127.0.1.{i}", "head", cpus=2, mem_mb=2048) for i in range(1, HEADS + 1)]
    workers = [LocalNode(f"w-{i}", f"127.2.{i // 250}.{i % 250 + 1}", "sim", cpus=1, mem_mb=512)
               for i in range(1, nodes + 1)]
    return LocalCluster(nodes=(*heads, *workers), default_partition="head", kill_wait=2.0)


def cpu_seconds(proc: psutil.Process) -> float:
    t = proc.cpu_times()
    return t.user + t.system


def loopback() -> tuple[int, int]:
    with open("/proc/net/dev") as fh:
        for line in fh:
            if line.strip().startswith("lo:"):
                fields = line.split(":", 1)[1].split()
                return int(fields[0]), int(fields[1])
    return 0, 0


def agent_procs(session, job: str) -> dict[str, psutil.Process]:
    out = {}
    for node, state in session.node_states(job).items():
        try:
            out[node] = psutil.Process(state.pid)
        except psutil.NoSuchProcess:
            pass
    return out


# --------------------------------------------------------------------------- (a)

def head_cost(session, head_job: str, worker_job: str, windows: int, seconds: float) -> dict:
    head_state = next(iter(session.node_states(head_job).values()))
    head = psutil.Process(head_state.pid)
    workers = agent_procs(session, worker_job)
    endpoint = session.dir.read_head_endpoint(head_job)
    host = endpoint.address.rpartition(":")[0]
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    curve.make_client(sub, session.secret)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(f"tcp://{host}:{endpoint.ports['heartbeat']}")
    time.sleep(2.0)
    while sub.poll(0):
        sub.recv_multipart()
    rows = []
    try:
        for i in range(windows):
            t0 = time.monotonic()
            cpu0 = cpu_seconds(head)
            wcpu0 = sum(cpu_seconds(p) for p in workers.values())
            lo0 = loopback()
            beats = payload = 0
            end = t0 + seconds
            while (left := end - time.monotonic()) > 0:
                if sub.poll(int(left * 1000)):
                    parts = sub.recv_multipart()
                    beats += 1
                    payload += sum(len(p) for p in parts)
            wall = time.monotonic() - t0
            lo1 = loopback()
            conns = [c for c in head.net_connections(kind="tcp") if c.status == psutil.CONN_ESTABLISHED]
            row = {"cpu": (cpu_seconds(head) - cpu0) / wall, "wall": wall, "beats": beats / wall,
                   "beat_bytes": payload / max(beats, 1), "fds": head.num_fds(), "conns": len(conns),
                   "rss": head.memory_info().rss, "threads": head.num_threads(),
                   "workers_cpu": (sum(cpu_seconds(p) for p in workers.values()) - wcpu0) / wall,
                   "lo_bytes": (lo1[0] - lo0[0]) / wall, "lo_packets": (lo1[1] - lo0[1]) / wall}
            rows.append(row)
            log(f"  window {i + 1}/{windows} ({wall:.0f} s): head agent {row['cpu'] * 100:.2f} % of one core, "
                f"{row['fds']} fds, {row['conns']} TCP conns; {row['beats']:.2f} beats/s of "
                f"{row['beat_bytes']:.0f} B; all {len(workers)} worker agents {row['workers_cpu'] * 100:.1f} %; "
                f"loopback {row['lo_bytes'] / 1024:.0f} KiB/s")
    finally:
        sub.close(0)
        ctx.term()
    return {"rows": rows, "followers": len(workers), "head_pid": head.pid}


# --------------------------------------------------------------------------- (b)

def status_timing(session, runs: int) -> dict:
    from rich.console import Console

    from elastic_ray.cli.session import collect_status, open_session
    from elastic_ray.cli.status_view import render_status

    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    cli, floor, opened, collected, rendered, nodes_read = [], [], [], [], [], []
    lines = 0
    for i in range(runs + 1):
        t0 = time.perf_counter()
        out = subprocess.run([sys.executable, "-m", "elastic_ray.cli", "session", "status", str(session.path)],
                             env=env, capture_output=True, text=True, timeout=120)
        t1 = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import elastic_ray.cli.main"], env=env, check=True, timeout=60)
        t2 = time.perf_counter()
        if out.returncode != 0:
            raise RuntimeError(f"session status failed: {out.stderr[-2000:]}")
        lines = len(out.stdout.splitlines())
        s = open_session(session.path, None)
        t3 = time.perf_counter()
        try:
            status = collect_status(s)
        finally:
            s.close()
        t4 = time.perf_counter()
        Console(file=io.StringIO(), width=160).print(render_status(status))
        t5 = time.perf_counter()
        for job in [session.record().head_job, *session.record().workers]:
            session.node_states(job)
        t6 = time.perf_counter()
        if i == 0:
            continue
        cli.append(t1 - t0)
        floor.append(t2 - t1)
        opened.append(t3 - t2)
        collected.append(t4 - t3)
        rendered.append(t5 - t4)
        nodes_read.append(t6 - t5)
    return {"cli": cli, "floor": floor, "open": opened, "collect": collected, "render": rendered,
            "nodes_read": nodes_read, "lines": lines}


# --------------------------------------------------------------------------- (c)

def move_head(session, worker_job: str, moves: int) -> list[dict]:
    from elastic_ray.coordinator.head.failover import Failover

    expected = len(session.node_states(worker_job))
    out = []
    for i in range(moves):
        job = session.submit_head_allocation(lambda r, submitted: replace(r, successor=submitted))
        wait(lambda: session.dir.read_head_endpoint(job), 120, what=f"successor head {job} ready")
        failover = Failover(session)
        original_nudge = failover.nudge_agents
        nudge = {}

        def timed_nudge(target: str) -> None:
            t = time.monotonic()
            original_nudge(target)
            nudge["seconds"] = time.monotonic() - t

        failover.nudge_agents = timed_nudge
        switched: dict = {}

        def switch() -> None:
            try:
                failover.switch_head(job, hosted_on_worker=False)
            finally:
                switched["at"] = time.monotonic()

        # switch_head runs on a thread so that the agents' following is timed
        # while the nudges are still going out (they also read the pointer on their own).
        thread = threading.Thread(target=switch, name="bench-switch-head")
        t0 = time.monotonic()
        thread.start()
        follow = joined = None
        while time.monotonic() - t0 < 180 and (joined is None or thread.is_alive()):
            states = session.node_states(worker_job).values()
            following = sum(1 for s in states if s.head_job == job)
            if follow is None and following >= expected:
                follow = time.monotonic() - t0
            if joined is None and sum(1 for s in states if s.head_job == job
                                      and s.state.value == "JOINED") >= expected:
                joined = time.monotonic() - t0
            time.sleep(0.1)
        thread.join(timeout=60)
        t_switched = switched.get("at", time.monotonic()) - t0
        row = {"job": job, "switch": t_switched, "nudge": nudge.get("seconds"), "follow": follow, "joined": joined}
        out.append(row)
        fmt = lambda v: "n/a" if v is None else f"{v:.2f} s"  # noqa: E731
        log(f"  move {i + 1}/{moves} to head {job}: switch_head {fmt(t_switched)} (nudging {expected} agents "
            f"{fmt(row['nudge'])}); all follow {fmt(follow)}; all JOINED on it {fmt(joined)}")
    return out


# --------------------------------------------------------------------------- cleanup

def marked_pids(token: str) -> list[int]:
    needle = f"{MARKER}={token}".encode()
    found = []
    for pid in psutil.pids():
        if pid == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as fh:
                if needle in fh.read().split(b"\0"):
                    found.append(pid)
        except OSError:
            continue
    return found


def stop_everything(session, token: str) -> int:
    """Tear the session down, then kill by PID whatever still carries the marker."""
    if session is not None:
        try:
            session.teardown()
        except Exception as exc:      # report and go on: the marker sweep below still runs
            log(f"teardown: {exc!r}")
    deadline = time.monotonic() + 30
    while marked_pids(token) and time.monotonic() < deadline:
        reap()
        time.sleep(0.5)
    leftovers = marked_pids(token)
    for pid in leftovers:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    time.sleep(0.5)
    reap()
    return len(leftovers)


def reap() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


# --------------------------------------------------------------------------- main

def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=200)
    parser.add_argument("--windows", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=12.0, help="seconds per CPU window (5 x 12 = 60 s)")
    parser.add_argument("--moves", type=int, default=5)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--writers", type=int, default=200)
    parser.add_argument("--allocations", type=int, default=1000)
    parser.add_argument("--keep", action="store_true", help="keep the work directory (session, logs)")
    args = parser.parse_args()
    if args.moves > HEADS - 1:
        parser.error(f"--moves: at most {HEADS - 1}")

    token = uuid.uuid4().hex
    os.environ[MARKER] = token
    work = Path(os.environ.get("TMPDIR", "/tmp")) / f"bench-scale-{os.getpid()}"
    work.mkdir(parents=True)
    probe_log = work / "probes.log"
    os.environ[RAY_EXECUTABLE_ENV] = str(BENCH / "standin" / "ray")
    os.environ[GCS_PROBE_ENV] = f"{sys.executable} {BENCH / 'standin' / 'gcs_probe.py'}"
    os.environ["ELASTIC_RAY_STANDIN_PROBE_LOG"] = str(probe_log)
    os.environ["PYTHONPATH"] = str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")
    # Orphans (a daemonized child of a dead agent) come to us, so the sweep sees them.
    ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)   # PR_SET_CHILD_SUBREAPER
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))

    log(STANDIN)
    log(f"machine: {psutil.cpu_count()} CPUs, {psutil.virtual_memory().total / 2**30:.0f} GiB; work dir {work}")
    session = None
    results: dict = {}
    try:
        log(f"\n(e) allocation.json with {args.writers} concurrent writer processes, {args.runs} rounds")
        results["e"] = lock_contention(work, args.writers, args.runs)
        log(f"\n(d) election decision at {args.allocations} worker allocations, {args.runs + 2} runs")
        results["d"] = election_decision(work, args.allocations, args.runs + 2)

        from elastic_ray.coordinator.session import Session
        scheduler = LocalScheduler(work / "local-scheduler", cluster(args.nodes))
        log(f"\nstarting the head and one worker allocation of {args.nodes} nodes")
        t0 = time.monotonic()
        session = Session.create(work / "session", scheduler=scheduler, supervise=False,
                                 head=SlurmRunAllocationConfig(partition="head", time_limit="60", mem="512M"),
                                 launcher=RayLauncher(object_store_memory=100_000_000))
        session.wait_for_head(timeout=300)
        head_job = session.record().head_job
        t_head = time.monotonic() - t0
        handle = session.add_worker_allocation(SlurmWorkerAllocationConfig(
            partition="sim", num_nodes=args.nodes, gpus_per_node=0, cpus_per_task=1, mem="256M",
            time_limit="60"))
        session.wait_for_worker_allocation(handle, timeout=900)
        t_all = time.monotonic() - t0
        rss = sum(p.memory_info().rss for p in agent_procs(session, handle.job_id).values())
        log(f"  head ready after {t_head:.1f} s; all {args.nodes} worker agents JOINED after {t_all:.1f} s; "
            f"worker agents' RSS {rss / 2**30:.2f} GiB in all ({rss / args.nodes / 2**20:.1f} MiB each)")
        results["startup"] = {"head": t_head, "all": t_all, "rss": rss}
        time.sleep(5)

        log(f"\n(a) head agent with {args.nodes} followers: {args.windows} windows of {args.seconds:.0f} s")
        results["a"] = head_cost(session, head_job, handle.job_id, args.windows, args.seconds)
        log(f"\n(b) `elastic-ray session status` at {args.nodes + 1} nodes, {args.runs} runs")
        results["b"] = status_timing(session, args.runs)
        log(f"\n(c) moving the head, {args.moves} moves")
        results["c"] = move_head(session, handle.job_id, args.moves)
        results["files"] = {d.relative_to(session.path).as_posix() or ".": len(os.listdir(d))
                            for d in [session.path, *(p for p in session.path.rglob("*") if p.is_dir())]}
        results["probes"] = probe_log.read_text().count("\n") if probe_log.exists() else 0
    except KeyboardInterrupt:
        log("interrupted: stopping everything")
    except Exception:
        import traceback
        log("bench failed (figures so far are printed below):\n" + traceback.format_exc())
    finally:
        leftovers = stop_everything(session, token)
        log(f"\ncleanup: session torn down; {leftovers} process(es) still carrying the marker were killed by PID; "
            f"now {len(marked_pids(token))} left")
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    report(args, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
