"""What the autoscaler costs and how fast it reacts, on the Slurm lab, next to doing it by hand.

Prints figures; asserts nothing. Needs the lab (``python3 integration/lab up 4``) and
root (``sdiag -r``). Run it as

    .venv/bin/python bench/bench_autoscale.py [--runs 5] [--idle-timeout 10]

One session (head: one CPU on partition cpu), supervised by this process, with an
autoscaling policy on for the whole bench: pools gpu-a and gpu-b, one GPU a node;
gpu-a is held by a job of another name (``--no-hold`` leaves it free). Drivers run
in the head's job (``srun --overlap``), as a run's payload does.

(a) The floor: a driver asks for one task of ``{GPU: 1, floor: 1}``; once it has
    asked, the bench runs a bare ``sbatch`` of ``ray start --block`` on gpu-b (the
    partition that starts first) giving that node the ``floor`` resource. Figure:
    sbatch -> the task starts. No pool offers ``floor``, so the autoscaler leaves
    this demand alone, while it runs as in (b).
(b) Ours: a driver asks for one task of ``{GPU: 1}`` and nothing else happens by
    hand. Figure: the task asked -> the task starts (the autoscaler's turn, its
    ``demand_delay``, Slurm's estimates, sbatch, the agent, ``ray start``).
    (a) and (b) alternate run by run; each starts once the previous job ended.
    Target: (b) <= 1.2 x (a) + 2 s.
(c) Idle capacity held: the task of (b) ended -> its allocation COMPLETED after the
    autoscaler drained it; target <= idle_timeout + the drain.
(d) Scheduler calls: slurmctld's own RPC counts (``sdiag``, reset first) and this
    process's calls to the Slurm CLI, over ``--idle`` s with the policy on and no
    demand, and over each (b) run (demand, a submission, the task, the drain, the job's
    end), per hour. The (b) runs count the driver's own ``srun --overlap`` too (a
    user's payload costs that anyway); the bench makes no Slurm call inside them.
(e) What the lease holder costs while idle: CPU of this process (it holds the lease
    and runs the autoscaler's thread) and of its probe process, in windows of the idle
    period alternating the quick look at Ray's demand between turns on and off.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as a script: the repository root, for `integration`

from integration import labctl  # noqa: E402
from elastic_ray import SlurmRunAllocationConfig, SlurmWorkerAllocationConfig  # noqa: E402
from elastic_ray.autoscale import AutoscalePolicy, Pool  # noqa: E402
from elastic_ray.config.launcher import RayLauncher  # noqa: E402
from elastic_ray.coordinator.scaling import store  # noqa: E402
from elastic_ray.coordinator.session import Session  # noqa: E402
from elastic_ray.polling import wait_for  # noqa: E402
from elastic_ray.protocol.disk import event_log  # noqa: E402
from elastic_ray.protocol.disk.events import EventKind  # noqa: E402

OBJECT_STORE = 100_000_000
RAY = str(Path(sys.executable).parent / "ray")

FLOOR_SCRIPT = """#!/bin/bash
#SBATCH --job-name={name}
#SBATCH --partition=gpu-b
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=1
#SBATCH --cpus-per-task=1
#SBATCH --gres=gpu:1
#SBATCH --mem=1G
#SBATCH --time=10
#SBATCH --output={out}/floor-%j.out
export RAY_USAGE_STATS_ENABLED=0 RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH={token_path}
exec srun --nodes=1 --ntasks=1 --cpus-per-task=1 {ray} start --address={address} --block \\
    --node-ip-address="$(getent hosts "$(hostname)" | cut -d' ' -f1)" --temp-dir=/tmp/rbf/$SLURM_JOB_ID \\
    --num-cpus=1 --num-gpus=1 --resources='{{"floor": 1}}' --object-store-memory={store} \\
    --disable-usage-stats --min-worker-port=0 --max-worker-port=0
"""

DRIVER = r'''
import json, sys, time
import ray
ray.init(logging_level="ERROR", log_to_driver=False)
out, shape = sys.argv[1], json.loads(sys.argv[2])

@ray.remote
def first():
    return time.time()

asked = time.time()
ref = first.options(**shape).remote()
with open(out, "a") as fh:
    fh.write(json.dumps({"asked": asked}) + "\n")
started = ray.get(ref, timeout=600)
with open(out, "a") as fh:
    fh.write(json.dumps({"started": started, "ended": time.time()}) + "\n")
'''


def poll(predicate, timeout: float, interval: float = 0.1):
    return wait_for(predicate, timeout=timeout, interval=interval, what="the bench's condition")


def slurm(*argv: str) -> str:
    return subprocess.run(argv, check=True, capture_output=True, text=True, timeout=60).stdout


def marks(path: Path) -> dict:
    out: dict = {}
    if path.exists():
        for line in path.read_text().splitlines():
            out.update(json.loads(line))
    return out


def job_final(session: Session, job: str) -> bool:
    info = session.scheduler.query(session.job_name, [job]).get(job)
    return info is not None and info.state.is_final


def submits(session: Session) -> list:
    return [e for e in event_log.read(session.path).events
            if e.kind is EventKind.SCALER_DECISION and e.details.get("action") == "submit"]


def sdiag_counts() -> Counter:
    """slurmctld's RPC counts by message type since its last reset."""
    text = slurm("sdiag")
    section = text.split("Remote Procedure Call statistics by message type", 1)[-1]
    section = section.split("Remote Procedure Call statistics by user", 1)[0]
    return Counter({m.group(1): int(m.group(2))
                    for m in re.finditer(r"^\s*(\w+)\s+\(\s*\d+\)\s+count:(\d+)", section, re.M)})


def start_driver(session: Session, work: Path, shape: dict) -> tuple:
    out = work / f"driver-{uuid.uuid4().hex[:6]}.json"
    err = (work / "drivers.err").open("a")
    run = session.run([sys.executable, "-c", DRIVER, str(out), json.dumps(shape)], stderr=err,
                      stdout=subprocess.DEVNULL)
    poll(lambda: "asked" in marks(out), 120)
    return run, out, err


def floor_run(session: Session, work: Path, address: str) -> dict:
    run, out, err = start_driver(session, work, {"num_gpus": 1, "resources": {"floor": 1}})
    script = work / f"floor-{uuid.uuid4().hex[:6]}.sbatch"
    script.write_text(FLOOR_SCRIPT.format(name=session.job_name, out=work, ray=RAY, address=address,
                                          store=OBJECT_STORE, token_path=os.environ["RAY_AUTH_TOKEN_PATH"]))
    t_sbatch = time.time()
    job = slurm("sbatch", "--parsable", str(script)).strip().split(";")[0]
    run.wait(timeout=300)
    err.close()
    m = marks(out)
    slurm("scancel", job)
    poll(lambda: job_final(session, job), 120, 0.3)
    node = slurm("squeue", "-h", "-t", "all", "-j", job, "-o", "%N").strip()
    if node:
        shutil.rmtree(labctl.lab_dir() / "nodes" / node / "tmp" / "rbf" / job, ignore_errors=True)
    return {"job": job, "first_task": m["started"] - t_sbatch, "asked_to_sbatch": t_sbatch - m["asked"]}


def job_gone(job: str) -> bool:
    """No live process of the job is left (every lab node shares the host's PID namespace): no Slurm call."""
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if f"SLURM_JOB_ID={job}".encode() in Path(f"/proc/{entry}/environ").read_bytes().split(b"\0"):
                    return False
            except OSError:
                pass
    return True


def ours_run(session: Session, work: Path, counts: Counter, seconds: list) -> dict:
    """One (b) run. slurmctld's RPCs and this process's Slurm CLI calls are counted over it into
    ``counts`` (the bench itself calls Slurm only after the count: it watches the job's processes)."""
    before = len(submits(session))
    slurm("sdiag", "-r")
    cli0 = Counter(session.scheduler.calls)
    t = time.time()
    run, out, err = start_driver(session, work, {"num_gpus": 1})
    run.wait(timeout=300)
    err.close()
    m = marks(out)
    made = submits(session)[before:]
    if len(made) != 1:
        raise RuntimeError(f"bench: expected one submission, got {[e.reason for e in made]}")
    job = made[0].job
    poll(lambda: job_gone(job), 300, 0.2)
    released = time.time()
    counts.update(sdiag_counts())
    counts.update({f"cli:{k}": v for k, v in (Counter(session.scheduler.calls) - cli0).items()})
    seconds.append(time.time() - t)
    poll(lambda: job_final(session, job), 120, 0.5)
    state = session.job_info(job).state.value
    return {"job": job, "first_task": m["started"] - m["asked"], "held": released - m["ended"], "final": state,
            "partition": made[0].details["partition"], "decided": made[0].at - m["asked"]}


def med(rows: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in rows)


def rng(rows: list[dict], key: str) -> str:
    values = [r[key] for r in rows]
    return f"{min(values):.2f}-{max(values):.2f}"


def per_hour(counts: Counter, seconds: float) -> str:
    total = sum(counts.values())
    top = ", ".join(f"{k} {v}" for k, v in counts.most_common(4))
    return f"{total} in {seconds:.0f} s = {total * 3600 / seconds:.0f}/h ({top})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--idle", type=float, default=60.0, help="seconds of the idle window of (d)")
    parser.add_argument("--idle-timeout", type=float, default=10.0)
    parser.add_argument("--no-hold", action="store_true", help="leave gpu-a free")
    args = parser.parse_args()
    if not labctl.is_up():
        print("the Slurm lab is not up: python3 integration/lab up 4")
        return 2
    os.environ["SLURM_CONF"] = str(labctl.slurm_conf_path())
    work = ROOT / ".lab" / "shared" / "bench-autoscale" / uuid.uuid4().hex[:8]
    work.mkdir(parents=True)
    held = None
    if not args.no_hold:
        held = slurm("sbatch", "--parsable", "-J", "someone-else", "-p", "gpu-a", "--gres=gpu:4", "-c", "1",
                     "--mem=256M", "-t", "60", "-o", "/dev/null", "--wrap", "sleep 3600").strip().split(";")[0]
    session = Session.create(work / "session", scheduler="slurm", supervise=True,
                             launcher=RayLauncher(object_store_memory=OBJECT_STORE),
                             head=SlurmRunAllocationConfig(partition="cpu", time_limit="60", mem="1G", cpus_per_task=1))
    floors: list[dict] = []
    ours: list[dict] = []
    try:
        address = session.wait_for_head(timeout=180)
        os.environ.update(session.ray_client_env())
        one_gpu = dict(num_nodes=1, gpus_per_node=1, cpus_per_task=1, mem="1G", time_limit="30")
        policy = AutoscalePolicy(pools=[Pool(SlurmWorkerAllocationConfig(partition="gpu-a", **one_gpu)),
                                        Pool(SlurmWorkerAllocationConfig(partition="gpu-b", **one_gpu))],
                                 idle_timeout=args.idle_timeout, backlog=1)
        session.autoscale(policy)
        poll(lambda: store.read_state(session.path) is not None, 60, 0.5)
        print(f"head {address}; policy on (demand_delay {policy.demand_delay} s, idle_timeout {args.idle_timeout} s, "
              f"turn every {os.environ.get('ELASTIC_RAY_AUTOSCALE_INTERVAL', '5')} s); gpu-a "
              f"{'held by job ' + held if held else 'free'}")

        # (d) idle: the policy on, no demand, nothing but the head.
        time.sleep(5)
        scaler = session.supervisor.autoscaler
        me, child = psutil.Process(), psutil.Process(scaler.demand.pid)
        slurm("sdiag", "-r")
        cli0 = Counter(session.scheduler.calls)
        t = time.time()
        # (e) alternating windows, the quick look between turns on (as configured) and off.
        polls = {scaler.poll: [], 0.0: []}
        for _ in range(3):
            for every in list(polls):
                scaler.poll = every
                c0, w0 = (sum(me.cpu_times()[:2]), sum(child.cpu_times()[:2])), time.monotonic()
                time.sleep(args.idle / 6)
                wall = time.monotonic() - w0
                polls[every].append({"me": 100 * (sum(me.cpu_times()[:2]) - c0[0]) / wall,
                                    "probe": 100 * (sum(child.cpu_times()[:2]) - c0[1]) / wall})
        scaler.poll = max(polls)
        idle_sdiag, idle_secs = sdiag_counts(), time.time() - t
        idle_cli = Counter(session.scheduler.calls) - cli0

        busy, busy_secs = Counter(), []
        for i in range(args.runs):
            for label in ("floor", "ours"):
                result = (floor_run(session, work, address) if label == "floor"
                          else ours_run(session, work, busy, busy_secs))
                (floors if label == "floor" else ours).append(result)
                extra = (f", decided {result['decided']:.2f} s, held idle {result['held']:.2f} s -> "
                         f"{result['final']} ({result['partition']})") if label == "ours" else ""
                print(f"  run {i + 1} {label:5} job {result['job']}: first task {result['first_task']:.2f} s{extra}",
                      flush=True)
    finally:
        session.autoscale(None)
        session.teardown()
        if held:
            subprocess.run(["scancel", held], check=False, timeout=30)
        session.close()

    if not ours:
        return 1
    f_med, o_med = med(floors, "first_task"), med(ours, "first_task")
    print(f"\n| figure | median | range |\n|---|---:|---:|")
    print(f"| (a) floor: sbatch -> first task | {f_med:.2f} s | {rng(floors, 'first_task')} |")
    print(f"| (b) ours: task asked -> first task | {o_med:.2f} s | {rng(ours, 'first_task')} |")
    print(f"| (b) of which: asked -> submit decided | {med(ours, 'decided'):.2f} s | {rng(ours, 'decided')} |")
    print(f"| (c) idle capacity held: task ended -> COMPLETED | {med(ours, 'held'):.2f} s | {rng(ours, 'held')} |")
    print(f"\n(b) / (a) = {o_med / f_med:.2f}x; (b) - 1.2 x (a) = {o_med - 1.2 * f_med:+.2f} s (target <= 2 s); "
          f"(c) - idle_timeout = {med(ours, 'held') - args.idle_timeout:.2f} s (the drain)")
    for every, rows in polls.items():
        print(f"(e) idle, policy on, quick look every {every:g} s (0: off): CPU of this process (the lease holder) "
              f"{med(rows, 'me'):.2f} % of a core ({rng(rows, 'me')}), of its probe {med(rows, 'probe'):.2f} % "
              f"({rng(rows, 'probe')}); 3 windows of {args.idle / 6:.0f} s each, alternating")
    print(f"(d) idle, policy on: slurmctld {per_hour(idle_sdiag, idle_secs)}; this process's Slurm CLI calls "
          f"{per_hour(idle_cli, idle_secs)}")
    busy_sdiag = Counter({k: v for k, v in busy.items() if not k.startswith("cli:")})
    busy_cli = Counter({k[4:]: v for k, v in busy.items() if k.startswith("cli:")})
    print(f"(d) the (b) runs (demand, a submit, the run, the drain, the end): slurmctld "
          f"{per_hour(busy_sdiag, sum(busy_secs))}; this process's Slurm CLI calls {per_hour(busy_cli, sum(busy_secs))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
