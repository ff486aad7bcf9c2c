"""The SSH mode's cost: the main operations over SSH next to the same ones on the cluster side.

Prints figures and a table; asserts nothing. On the Slurm lab:

    export SLURM_CONF=/work/main/.lab/etc/slurm.conf
    python3 integration/lab up 4            # idempotent
    .venv/bin/python bench/bench_remote.py  # BENCH_REMOTE_RUNS=5 by default

A real OpenSSH server (tests/sshd_server.py) on 127.0.0.1 stands for the
login host; its remote commands see the lab's SLURM_CONF. Each run does the
same sequence twice, once with ``Session`` in this process (the cluster side:
a caller on the login node) and once with ``RemoteSession`` over SSH, the
order alternating between runs so that neither always meets a warmer lab:

* create: ``create`` until ``wait_for_head`` returns (session start);
* head, worker_allocations: one view each (a file read on the cluster side);
* add + wait: ``add_worker_allocation`` until ``wait_for_worker_allocation`` returns (join);
* run: a trivial payload (``python -c pass`` as a step of the head) to its end;
* replace_head: on a healthy head (returns it unchanged: the no-op path);
* remove: ``remove_worker_allocation`` of the idle worker, drain and wait;
* teardown.

Besides, ``hello`` (a call that does nothing on the cluster side) over the
already open connection gives the fixed cost of one SSH-mode call: a channel
on the multiplexed connection plus one start of the cluster side's Python;
and the first call of a new client, which also opens the master connection.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from elastic_ray import Session, SlurmRunAllocationConfig, SlurmWorkerAllocationConfig  # noqa: E402
from elastic_ray.config.launcher import RayLauncher  # noqa: E402
from elastic_ray.remote import RemoteSession, SshConnection  # noqa: E402
from elastic_ray.remote.client import RemoteCall  # noqa: E402
from tests.remote_helpers import REMOTE_PYTHON, target_of  # noqa: E402
from tests.sshd_server import SshServer  # noqa: E402

RUNS = int(os.environ.get("BENCH_REMOTE_RUNS", "5"))
SLURM_CONF = Path(os.environ.get("SLURM_CONF", REPO / ".lab" / "etc" / "slurm.conf"))
WORK = REPO / ".lab" / "shared" / "bench-remote"
HEAD = SlurmRunAllocationConfig(partition="cpu", time_limit="20", mem="1G", cpus_per_task=1)
WORKER = SlurmWorkerAllocationConfig(partition="gpu-a", num_nodes=1, cpus_per_task=2, mem="1G", time_limit="20")
LAUNCHER = RayLauncher(object_store_memory=100_000_000)
OPS = ["create", "head", "worker_allocations", "add + wait", "run", "replace_head", "remove", "teardown"]


def timed(results: dict[str, list[float]], name: str, fn):
    t0 = time.perf_counter()
    value = fn()
    results.setdefault(name, []).append(time.perf_counter() - t0)
    return value


def sequence(results: dict[str, list[float]], mode: str, server: SshServer) -> None:
    path = WORK / f"{mode}-{uuid.uuid4().hex[:8]}"
    if mode == "ssh":
        def make():
            s = RemoteSession.create(str(path), ssh=target_of(server), remote_python=REMOTE_PYTHON, head=HEAD,
                                     launcher=LAUNCHER, scheduler="slurm")
            s.wait_for_head(timeout=180)
            return s
    else:
        def make():
            s = Session.create(path, head=HEAD, launcher=LAUNCHER, scheduler="slurm")
            s.wait_for_head(timeout=180)
            return s
    s = timed(results, "create", make)
    try:
        timed(results, "head", lambda: s.head)
        timed(results, "worker_allocations", lambda: s.worker_allocations)
        def add_and_wait():
            w = s.add_worker_allocation(WORKER)
            s.wait_for_worker_allocation(w, timeout=180)
            return w

        worker = timed(results, "add + wait", add_and_wait)
        timed(results, "run", lambda: s.run([REMOTE_PYTHON, "-c", "pass"]).wait(timeout=120))
        timed(results, "replace_head", lambda: s.replace_head(timeout=60))
        timed(results, "remove", lambda: s.remove_worker_allocation(worker, drain_timeout=60))
    finally:
        timed(results, "teardown", s.teardown)
        s.close()


def call_overhead(server: SshServer, results: dict[str, list[float]]) -> None:
    conn = SshConnection(target_of(server))
    try:
        timed(results, "first call (connects)", lambda: RemoteCall(conn, REMOTE_PYTHON, "hello", {}).result(60))
        for _ in range(5):
            timed(results, "call on the open connection", lambda: RemoteCall(conn, REMOTE_PYTHON, "hello", {})
                  .result(60))
    finally:
        conn.close()
    t0 = time.perf_counter()
    subprocess.run([REMOTE_PYTHON, "-m", "elastic_ray.remote.server"], input=b"", capture_output=True)
    results.setdefault("cluster-side Python start (no SSH)", []).append(time.perf_counter() - t0)


def fmt(values: list[float]) -> str:
    if not values:
        return "-"
    return f"{statistics.median(values):6.2f} ({min(values):.2f}-{max(values):.2f})"


def main() -> int:
    os.environ.setdefault("SLURM_CONF", str(SLURM_CONF))
    WORK.mkdir(parents=True, exist_ok=True)
    cluster: dict[str, list[float]] = {}
    ssh: dict[str, list[float]] = {}
    overhead: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-sshd-") as tmp, \
            SshServer(Path(tmp), env={"SLURM_CONF": str(SLURM_CONF)}) as server:
        for run in range(RUNS):
            order = ["cluster", "ssh"] if run % 2 == 0 else ["ssh", "cluster"]
            for mode in order:
                t0 = time.time()
                sequence(ssh if mode == "ssh" else cluster, mode, server)
                print(f"[bench-remote] run {run + 1}/{RUNS} {mode:7s} {time.time() - t0:5.1f}s", flush=True)
            call_overhead(server, overhead)
    print(f"\nSSH mode against the cluster side, {RUNS} alternating runs on the lab; "
          f"median (min-max) seconds\n")
    print(f"{'operation':22s} {'cluster side':>20s} {'over SSH':>20s} {'added (median)':>15s}")
    for op in OPS:
        added = statistics.median(ssh[op]) - statistics.median(cluster[op]) if op in ssh and op in cluster else 0
        print(f"{op:22s} {fmt(cluster.get(op, [])):>20s} {fmt(ssh.get(op, [])):>20s} {added:+14.2f}s")
    print()
    for name, values in overhead.items():
        print(f"{name:38s} {fmt(values)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
