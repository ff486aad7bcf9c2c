"""What the per-node agent costs on the Slurm lab, next to doing it by hand.

Prints figures; asserts nothing. Needs the lab (``python3 integration/lab up 4``)
and root. Run it as

    .venv/bin/python bench/bench_agent.py [--runs 5] [--idle 30]

(a) The floor: a bare ``sbatch`` of a 1-node job whose step is
    ``ray start --address=<head> --block`` with the same essential flags the
    agent passes; time from sbatch to the node ALIVE in the GCS.
(b) Ours: ``Session.add_worker_allocation`` to the agent's JOINED (its node
    state file) and to ALIVE in the GCS.
    (a) and (b) alternate run by run on the same node (gpub-1), each starting
    only when the previous job has ended, so both see the same box.
(c) An idle agent's own process (not Ray): RSS and CPU over ``--idle`` s.
(d) ``remove_worker_allocation(wait=True)`` of an idle worker: wall time,
    measured after every (b) run.
(e) Session start: ``Session.create`` -> the head's endpoint published
    (``--session-runs``, alternating with the floor: a bare ``sbatch`` of
    ``ray start --head --block`` on the same partition until its GCS lists
    the head node ALIVE).

Phases of (a) and (b), read once the node is ALIVE from the processes of the
job (every lab node shares the host's PID namespace; start times from
/proc/<pid>/stat against a boot time taken from /proc/uptime, so 10 ms
resolution): sbatch -> the batch script started (its shell, which ``exec``s
``srun``); -> the step's first process (ours: the agent; floor: ``ray
start``); -> ``ray start`` launched (ours only: the agent's import and start);
-> the raylet process started (``ray start``'s own import and set-up); ->
ALIVE seen (registration with the GCS, plus at most 0.1 s of polling).

``--busy`` runs one CPU burner (a ``python`` busy loop started and ended by
this bench, by PID) for the whole run, so one of the box's two cores is taken:
the figures then say how the join fares on a loaded machine.

ALIVE is seen by polling the GCS node table every 0.1 s from this process,
with the same GcsClient calls and record parsing as the agent's GCS probe
(``elastic_ray.agent.node.gcs_probe``), kept open instead of one process per poll:
a probe process costs about a second of CPU, which would both blur the
figure and slow the node being measured.
"""

from __future__ import annotations

import argparse
import inspect
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as a script: the repository root, for `integration`

import psutil  # noqa: E402

from integration import labctl  # noqa: E402
from integration.faults import lab_ops  # noqa: E402
from elastic_ray import SlurmRunAllocationConfig, SlurmWorkerAllocationConfig  # noqa: E402
from elastic_ray.agent.node import gcs_probe  # noqa: E402
from elastic_ray.coordinator.session import Session  # noqa: E402
from elastic_ray.polling import wait_for  # noqa: E402
from elastic_ray.config.launcher import RayLauncher  # noqa: E402

PARTITION = "gpu-b"
CPUS = 2
OBJECT_STORE = 100_000_000
RAY = str(Path(sys.executable).parent / "ray")

FLOOR_SCRIPT = """#!/bin/bash
#SBATCH --job-name={name}
#SBATCH --partition={partition}
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=1
#SBATCH --cpus-per-task={cpus}
#SBATCH --mem=1G
#SBATCH --time=10
#SBATCH --output={out}/floor-%j.out
export RAY_USAGE_STATS_ENABLED=0 RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH={token_path}
exec srun --nodes=1 --ntasks=1 --cpus-per-task={cpus} {ray} start --address={address} --block \\
    --node-ip-address="$(getent hosts "$(hostname)" | cut -d' ' -f1)" --temp-dir=/tmp/rbf/$SLURM_JOB_ID \\
    --num-cpus="$SLURM_CPUS_ON_NODE" --num-gpus=0 --object-store-memory={store} --disable-usage-stats \\
    --labels=slurm.job-id=$SLURM_JOB_ID --min-worker-port=0 --max-worker-port=0
"""


class GcsWatch:
    """The GCS node table, read in this process (see the module docstring)."""

    def __init__(self, address: str):
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        from ray._raylet import GcsClient

        self.client = GcsClient(address=address)

    def alive_job(self, job: str) -> dict | None:
        infos = self.client.get_all_node_info(timeout=5)
        for node_id, info in infos.items():
            record = gcs_probe._node_record(node_id, info, None)
            if record["state"] == "ALIVE" and record["labels"].get("slurm.job-id") == job:
                return record
        return None


def poll(predicate, timeout: float, interval: float = 0.1):
    """The project's one polling loop (raises a TimeoutError naming the last look)."""
    return wait_for(predicate, timeout=timeout, interval=interval, what="the bench's condition")


def _one_state(session: Session, job: str) -> dict:
    """The one node's published state of a single-node job, as written; {} until there is one."""
    state = next(iter(session.node_states(job).values()), None)
    return state.to_dict() if state is not None else {}


def job_processes(job: str) -> list[tuple[float, str]]:
    """(start time, argv) of every live process whose environment says SLURM_JOB_ID=job."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            env = Path(f"/proc/{entry}/environ").read_bytes()
            if f"SLURM_JOB_ID={job}".encode() not in env.split(b"\0"):
                continue
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        t = lab_ops.started_at(int(entry))
        if t is not None:
            found.append((t, " ".join(a for a in argv if a)))
    return sorted(found)


def phases_of(job: str, t0: float, alive_at: float) -> dict:
    """The join's phases (see the module docstring) from the job's live processes."""
    # The batch shell exec's srun, whose argv names the step's command too:
    # the step's processes are the ones that are not srun.
    procs = job_processes(job)
    not_srun = lambda c: not c.split(" ", 1)[0].endswith("srun")  # noqa: E731
    first = lambda pred: next((t for t, cmd in procs if pred(cmd)), None)  # noqa: E731
    batch = first(lambda c: c.split(" ", 1)[0].endswith("srun"))
    agent = first(lambda c: not_srun(c) and "elastic_ray.agent" in c)
    ray_start = first(lambda c: not_srun(c) and "/ray start" in c)
    raylet = first(lambda c: c.split(" ", 1)[0].endswith("/raylet"))
    step = agent if agent is not None else ray_start
    out = {"batch": None, "step": None, "agent": None, "ray_cli": None, "register": None}
    if None in (batch, step, ray_start, raylet):
        return out
    out["batch"] = batch - t0
    out["step"] = step - batch
    out["agent"] = (ray_start - agent) if agent is not None else None
    out["ray_cli"] = raylet - ray_start
    out["register"] = alive_at - raylet
    return out


def slurm(*argv: str) -> str:
    return subprocess.run(argv, check=True, capture_output=True, text=True, timeout=60).stdout


def job_final(session: Session, job: str) -> bool:
    info = session.scheduler.query(session.job_name, [job]).get(job)
    return info is not None and info.state.is_final


def floor_run(session: Session, watch: GcsWatch, address: str, work: Path) -> dict:
    script = work / f"floor-{uuid.uuid4().hex[:6]}.sbatch"
    script.write_text(FLOOR_SCRIPT.format(name=session.job_name, partition=PARTITION, cpus=CPUS, out=work, ray=RAY,
                                          address=address, store=OBJECT_STORE,
                                          token_path=os.environ["RAY_AUTH_TOKEN_PATH"]))
    t0 = time.time()
    job = slurm("sbatch", "--parsable", str(script)).strip().split(";")[0]
    poll(lambda: watch.alive_job(job), 120)
    alive_at = time.time()
    alive = alive_at - t0
    ph = phases_of(job, t0, alive_at)
    slurm("scancel", job)
    poll(lambda: job_final(session, job), 120, 0.3)
    # The bare `ray start` leaves its temp dir in the node's private /tmp.
    node = slurm("squeue", "-h", "-t", "all", "-j", job, "-o", "%N").strip()
    if node:
        shutil.rmtree(labctl.lab_dir() / "nodes" / node / "tmp" / "rbf" / job, ignore_errors=True)
    return {"job": job, "alive": alive, **ph}


def ours_run(session: Session, watch: GcsWatch) -> dict:
    config = SlurmWorkerAllocationConfig(partition=PARTITION, num_nodes=1, cpus_per_task=CPUS, gpus_per_node=0,
                                         mem="1G", time_limit="10")
    t0 = time.time()
    handle = session.add_worker_allocation(config)
    job = handle.job_id
    alive_at = joined_at = None
    state: dict = {}
    deadline = t0 + 120
    while time.time() < deadline and (alive_at is None or joined_at is None):
        if alive_at is None and watch.alive_job(job):
            alive_at = time.time()
            ph = phases_of(job, t0, alive_at)
        if joined_at is None:
            state = _one_state(session, job)
            if state.get("state") == "JOINED":
                joined_at = time.time()
        time.sleep(0.1)
    if alive_at is None or joined_at is None:
        raise TimeoutError(f"bench: worker {job} did not join")
    launched = next(t["at"] for t in state["transitions"] if t["to"] == "STARTING")
    t1 = time.time()
    final = session.remove_worker_allocation(handle, drain_timeout=60, wait=True)
    removed = time.time() - t1
    return {"job": job, "alive": alive_at - t0, "joined": joined_at - t0, "agent_up": state["started_at"] - t0,
            "ray_launched": launched - t0, "agent_joined": state["since"] - t0, "removed": removed,
            "final": final, **ph}


FLOOR_HEAD = """#!/bin/bash
#SBATCH --job-name={name}
#SBATCH --partition=cpu
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=1
#SBATCH --cpus-per-task=2
#SBATCH --mem=2G
#SBATCH --time=10
#SBATCH --output={out}/floor-head-%j.out
export RAY_USAGE_STATS_ENABLED=0 RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH={token_path}
exec srun --nodes=1 --ntasks=1 --cpus-per-task=2 {ray} start --head --block --port={port} \\
    --node-ip-address="$(getent hosts "$(hostname)" | cut -d' ' -f1)" --temp-dir=/tmp/rbh/$SLURM_JOB_ID \\
    --num-cpus=0 --num-gpus=0 --include-dashboard=false --object-store-memory={store} --disable-usage-stats
"""


def _node_ip(node: str) -> str:
    return subprocess.run(["getent", "hosts", node], check=True, capture_output=True, text=True).stdout.split()[0]


def floor_head_run(session: Session, work: Path) -> dict:
    """Bare sbatch + ``ray start --head``: sbatch -> the head node ALIVE in its own GCS."""
    from ray._raylet import GcsClient

    port = 20000 + (os.getpid() + int(time.time())) % 20000
    script = work / f"floor-head-{uuid.uuid4().hex[:6]}.sbatch"
    script.write_text(FLOOR_HEAD.format(name=session.job_name, out=work, ray=RAY, port=port, store=OBJECT_STORE,
                                        token_path=os.environ["RAY_AUTH_TOKEN_PATH"]))
    t0 = time.time()
    job = slurm("sbatch", "--parsable", str(script)).strip().split(";")[0]
    node = poll(lambda: slurm("squeue", "-h", "-j", job, "-o", "%N").strip(), 60, 0.05)
    address = f"{_node_ip(node)}:{port}"

    def ready() -> bool:
        host, _, p = address.rpartition(":")
        try:
            socket.create_connection((host, int(p)), timeout=0.5).close()
            infos = GcsClient(address=address).get_all_node_info(timeout=1)
        except Exception:  # noqa: BLE001 - not up yet
            return False
        return any(gcs_probe._node_record(k, v, None)["state"] == "ALIVE" for k, v in infos.items())

    poll(ready, 120, 0.1)
    ready_s = time.time() - t0
    slurm("scancel", job)
    poll(lambda: job_final(session, job), 120, 0.3)
    shutil.rmtree(labctl.lab_dir() / "nodes" / node / "tmp" / "rbh" / job, ignore_errors=True)
    return {"job": job, "ready": ready_s}


def ours_session_run(work: Path) -> dict:
    """``Session.create`` -> the head's endpoint published (polled every 0.05 s)."""
    t0 = time.time()
    s = Session.create(work / f"start-{uuid.uuid4().hex[:6]}", scheduler="slurm",
                       launcher=RayLauncher(object_store_memory=OBJECT_STORE),
                       head=SlurmRunAllocationConfig(partition="cpu", time_limit="10", mem="2G"), supervise=False)
    try:
        job = s.record().head_job
        poll(lambda: s.dir.read_head_endpoint(job), 180, 0.05)
        ready_s = time.time() - t0
    finally:
        s.teardown()
    return {"job": job, "ready": ready_s}


def idle_usage(session: Session, seconds: float) -> dict:
    handle = session.add_worker_allocation(SlurmWorkerAllocationConfig(
        partition=PARTITION, num_nodes=1, cpus_per_task=CPUS, gpus_per_node=0, mem="1G", time_limit="10"))
    state = poll(lambda: (s := _one_state(session, handle.job_id)).get("state") == "JOINED" and s, 120)
    head_state = _one_state(session, session.dir.read_ray_head())
    procs = {"worker agent": psutil.Process(state["pid"]), "head agent": psutil.Process(head_state["pid"])}
    time.sleep(5)  # let the join settle before the window opens
    before = {k: (p.cpu_times(), time.time()) for k, p in procs.items()}
    rss_peak = {k: 0 for k in procs}
    end = time.time() + seconds
    while time.time() < end:
        for k, p in procs.items():
            rss_peak[k] = max(rss_peak[k], p.memory_info().rss)
        time.sleep(1)
    out = {}
    for k, p in procs.items():
        times, t = before[k]
        now = p.cpu_times()
        cpu = (now.user + now.system - times.user - times.system) / (time.time() - t) * 100
        full = p.memory_full_info()
        out[k] = {"rss": full.rss, "uss": full.uss, "rss_peak": rss_peak[k], "cpu_percent": cpu,
                  "threads": p.num_threads()}
    session.remove_worker_allocation(handle, drain_timeout=60, wait=True)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--idle", type=float, default=30.0)
    parser.add_argument("--session-runs", type=int, default=5, help="(e) session start runs of each (0: skip)")
    parser.add_argument("--busy", action="store_true", help="keep one core busy with a burner process")
    args = parser.parse_args()
    if not labctl.is_up():
        print("the Slurm lab is not up: python3 integration/lab up 4")
        return 2
    os.environ["SLURM_CONF"] = str(labctl.slurm_conf_path())
    work = ROOT / ".lab" / "shared" / "bench-agent" / uuid.uuid4().hex[:8]
    work.mkdir(parents=True)
    kwargs = {"supervise": False} if "supervise" in inspect.signature(Session.create).parameters else {}
    session = Session.create(work / "session", scheduler="slurm", launcher=RayLauncher(object_store_memory=OBJECT_STORE),
                             head=SlurmRunAllocationConfig(partition="cpu", time_limit="30", mem="2G"), **kwargs)
    floors, ours = [], []
    starts_floor, starts_ours = [], []
    burner = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if args.busy else None
    try:
        address = session.wait_for_head(timeout=180)
        # The run's Ray uses token auth: this process's GCS client and the
        # floor's bare `ray start` (same token file, so the floor pays the
        # same handshake) need it.
        os.environ.update(session.ray_client_env())
        watch = GcsWatch(address)
        print(f"head {address}; {args.runs} runs each of floor and ours on {PARTITION}, alternating")
        for i in range(args.runs):
            for label, runner in (("floor", lambda: floor_run(session, watch, address, work)),
                                  ("ours", lambda: ours_run(session, watch))):
                result = runner()
                (floors if label == "floor" else ours).append(result)
                print(f"  run {i + 1} {label:5} job {result['job']}: ALIVE {result['alive']:.2f} s"
                      + (f", JOINED {result['joined']:.2f} s (agent up {result['agent_up']:.2f}, ray start "
                         f"{result['ray_launched']:.2f}); removed in {result['removed']:.2f} s ({result['final']})"
                         if label == "ours" else ""), flush=True)
        usage = idle_usage(session, args.idle)
        for i in range(args.session_runs):
            for label, runner in (("floor", lambda: floor_head_run(session, work)),
                                  ("ours", lambda: ours_session_run(work))):
                result = runner()
                (starts_floor if label == "floor" else starts_ours).append(result)
                print(f"  session start {i + 1} {label:5} job {result['job']}: ready {result['ready']:.2f} s",
                      flush=True)
    finally:
        if burner is not None:
            burner.kill()
            burner.wait()
        session.teardown()

    med = lambda rows, key: statistics.median(r[key] for r in rows)  # noqa: E731
    rng = lambda rows, key: f"{min(r[key] for r in rows):.2f}-{max(r[key] for r in rows):.2f}"  # noqa: E731
    floor_alive = med(floors, "alive")
    print()
    print(f"{'figure':52} {'median':>9} {'range':>13} {'vs floor':>9}")
    rows = [
        ("(a) floor: sbatch -> ALIVE (bare ray start)", floors, "alive"),
        ("(b) ours: add_worker_allocation -> ALIVE", ours, "alive"),
        ("(b) ours: add_worker_allocation -> JOINED", ours, "joined"),
        ("    of which: -> agent process up", ours, "agent_up"),
        ("    of which: -> ray start launched", ours, "ray_launched"),
        ("(d) remove_worker_allocation(wait=True), idle", ours, "removed"),
    ]
    for label, data, key in rows:
        ratio = f"{med(data, key) / floor_alive:.2f}x" if key in ("alive", "joined") else ""
        print(f"{label:52} {med(data, key):8.2f}s {rng(data, key):>13} {ratio:>9}")
    for who, u in usage.items():
        print(f"(c) idle {who} over {args.idle:.0f} s: RSS {u['rss'] / 2**20:.1f} MiB (USS {u['uss'] / 2**20:.1f}, "
              f"peak RSS {u['rss_peak'] / 2**20:.1f}), CPU {u['cpu_percent']:.2f} %, {u['threads']} threads")
    phase_rows = [("sbatch -> batch script", "batch"), ("batch -> step process", "step"),
                  ("agent import+start -> ray start", "agent"), ("ray start -> raylet process", "ray_cli"),
                  ("raylet -> ALIVE seen (registration)", "register")]
    print(f"\njoin phases ({'one core busy' if args.busy else 'quiet machine'}), median (range), seconds:")
    print("| phase | floor | ours |\n|---|---|---|")
    for label, key in phase_rows:
        cells = []
        for rows in (floors, ours):
            xs = [r[key] for r in rows if r.get(key) is not None]
            cells.append(f"{statistics.median(xs):.2f} ({min(xs):.2f}-{max(xs):.2f})" if xs else "-")
        print(f"| {label} | {cells[0]} | {cells[1]} |")
    if starts_ours and starts_floor:
        f_med, o_med = med(starts_floor, "ready"), med(starts_ours, "ready")
        print(f"\n(e) session start -> head ready: floor {f_med:.2f} s ({rng(starts_floor, 'ready')}), "
              f"ours {o_med:.2f} s ({rng(starts_ours, 'ready')}): {o_med / f_med:.2f}x (target <= 1.5x)")
    print(f"\nratio ours/floor, to ALIVE: {med(ours, 'alive') / floor_alive:.2f}x; to JOINED: "
          f"{med(ours, 'joined') / floor_alive:.2f}x (target <= 1.15x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
