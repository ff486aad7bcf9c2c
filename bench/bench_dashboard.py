"""What Ray's dashboard adds to an idle head: RSS and CPU, dashboard off against on.

Prints figures; asserts nothing. Needs no Slurm and no agent: each run starts
one real head-only Ray node the way the agent builds it
(``build_ray_start``: ``--num-cpus=0 --num-gpus=0``, the ``random`` port
strategy, a private temp dir, token auth with a throw-away token), in a
session of its own, once with ``include_dashboard=False`` and once with
``True``, alternating, so both see the same machine over the sitting:

    nice -n 19 .venv/bin/python bench/bench_dashboard.py [--runs 5] [--seconds 30] [--settle 15]

For each run: once the node is up (and, with the dashboard, once its HTTP
port answers) it waits ``--settle`` s, then takes, over ``--seconds`` s of
idle, the CPU time (user + system) of every process of the node's session
(processes that appear during the window count from zero) as a percent of
one core, and the RSS (and PSS, which splits shared pages) summed over
those processes at the window's end. The
machine's load average and the CPU the rest of the machine used are
printed next to it, because a figure taken next to another job's run is
not a quiet machine's figure. Every node is stopped by its session's PIDs
(never by name), also when the bench fails or is interrupted.
"""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import psutil  # noqa: E402

from elastic_ray.agent.node.ray_args import build_ray_start, choose_ports  # noqa: E402
from elastic_ray.agent.node.ray_node import RayNode, free_port  # noqa: E402
from elastic_ray.config.launcher import RayLauncher  # noqa: E402
from elastic_ray.polling import wait_for  # noqa: E402
from elastic_ray.ray_auth import derive_ray_token  # noqa: E402

NODE_IP = "127.0.0.2"
START_TIMEOUT = 120.0


def session_members(sid: int) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter():
        try:
            if os.getsid(proc.pid) == sid and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except (OSError, psutil.Error):
            pass
    return found


def cpu_seconds(procs: list[psutil.Process]) -> dict[tuple[int, float], float]:
    out = {}
    for proc in procs:
        try:
            with proc.oneshot():
                times = proc.cpu_times()
                out[(proc.pid, proc.create_time())] = times.user + times.system
        except psutil.Error:
            pass
    return out


def rss_bytes(procs: list[psutil.Process]) -> int:
    total = 0
    for proc in procs:
        try:
            total += proc.memory_info().rss
        except psutil.Error:
            pass
    return total


def pss_bytes(procs: list[psutil.Process]) -> int:
    """Proportional set size: shared pages (libraries, the object store's
    mapping) split between the processes that map them, so the sum is not
    inflated the way a sum of RSS is."""
    total = 0
    for proc in procs:
        try:
            total += proc.memory_full_info().pss
        except (psutil.Error, AttributeError):
            pass
    return total


def machine_busy() -> float:
    """CPU seconds used by the whole machine so far (every core)."""
    t = psutil.cpu_times()
    return t.user + t.nice + t.system + t.irq + t.softirq + getattr(t, "steal", 0.0)


def dashboard_answers(address: str) -> bool:
    try:
        with urllib.request.urlopen(f"http://{address}/", timeout=2) as reply:
            return reply.status == 200
    except OSError:
        return False


def one_run(root: str, dashboard: bool, token_path: str, settle: float, seconds: float) -> dict:
    launcher = RayLauncher(include_dashboard=dashboard, object_store_memory=100_000_000)
    temp_dir = tempfile.mkdtemp(prefix="d" if dashboard else "n", dir=root)
    ports = choose_ports("random", "1", "head", free_port)
    cmd = build_ray_start("head", job_id="1", node_ip=NODE_IP, temp_dir=temp_dir, launcher=launcher,
                          ports=ports, token_path=token_path)
    started = time.monotonic()
    node = RayNode.start(cmd, os.path.join(root, f"{Path(temp_dir).name}.log"))
    try:
        wait_for(lambda: node.poll_exit() is not None or node.startup_finished(), timeout=START_TIMEOUT,
                 interval=0.2, what="ray start")
        if node.poll_exit() is not None:
            raise RuntimeError(f"ray start exited {node.poll_exit()}:\n{node.log_tail()}")
        if dashboard:
            address = cmd.dashboard_address
            assert address is not None
            wait_for(lambda: dashboard_answers(address), timeout=START_TIMEOUT, interval=0.5,
                     what=f"the dashboard at {address}")
        up = time.monotonic() - started
        time.sleep(settle)
        load = os.getloadavg()[0]
        before = cpu_seconds(session_members(node.sid))
        machine_before, t0 = machine_busy(), time.monotonic()
        time.sleep(seconds)
        procs = session_members(node.sid)
        after = cpu_seconds(procs)
        machine_after, wall = machine_busy(), time.monotonic() - t0
        used = sum(v - before.get(k, 0.0) for k, v in after.items())
        return {"dashboard": dashboard, "up_s": up, "processes": len(procs), "rss_mib": rss_bytes(procs) / 2**20,
                "pss_mib": pss_bytes(procs) / 2**20,
                "cpu_pct": 100.0 * used / wall, "rest_pct": 100.0 * (machine_after - machine_before - used) / wall,
                "load": load}
    finally:
        node.kill()
        leftover = session_members(node.sid)
        if leftover:
            print(f"WARNING: session {node.sid} left {[p.pid for p in leftover]}", file=sys.stderr)
        shutil.rmtree(temp_dir, ignore_errors=True)


def summary(name: str, values: list[float], unit: str) -> str:
    return (f"{name} median {statistics.median(values):.2f} {unit} "
            f"(range {min(values):.2f}-{max(values):.2f})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="runs of each setting (alternating)")
    parser.add_argument("--seconds", type=float, default=30.0, help="idle window measured per run")
    parser.add_argument("--settle", type=float, default=15.0, help="wait after start before measuring")
    args = parser.parse_args()
    os.makedirs("/tmp/er-b", exist_ok=True)
    root = tempfile.mkdtemp(prefix="", dir="/tmp/er-b")        # short: Ray's socket paths live below it
    token_path = os.path.join(root, "ray_token")
    with open(os.open(token_path, os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
        f.write(derive_ray_token(secrets.token_bytes(32)))
    results: list[dict] = []
    try:
        for index in range(2 * args.runs):
            dashboard = index % 2 == 1 if (index // 2) % 2 == 0 else index % 2 == 0   # off,on,on,off,...
            result = one_run(root, dashboard, token_path, args.settle, args.seconds)
            results.append(result)
            print(f"run {index + 1:2d} dashboard={'on ' if dashboard else 'off'} up {result['up_s']:.1f} s, "
                  f"{result['processes']} processes, RSS {result['rss_mib']:.1f} MiB "
                  f"(PSS {result['pss_mib']:.1f}), "
                  f"CPU {result['cpu_pct']:.2f} % of a core (rest of the machine {result['rest_pct']:.0f} %, "
                  f"load {result['load']:.2f})", flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"\n{args.runs} runs each, {args.seconds:g} s idle windows after {args.settle:g} s settle, "
          f"{psutil.cpu_count()} cores")
    medians = {}
    for dashboard in (False, True):
        rows = [r for r in results if r["dashboard"] is dashboard]
        label = "dashboard on " if dashboard else "dashboard off"
        medians[dashboard] = (statistics.median(r["rss_mib"] for r in rows),
                              statistics.median(r["cpu_pct"] for r in rows),
                              statistics.median(r["pss_mib"] for r in rows))
        print(f"{label}: {summary('RSS', [r['rss_mib'] for r in rows], 'MiB')}; "
              f"{summary('PSS', [r['pss_mib'] for r in rows], 'MiB')}; "
              f"{summary('CPU', [r['cpu_pct'] for r in rows], '%')}; "
              f"{summary('processes', [r['processes'] for r in rows], '')}; "
              f"rest of machine median {statistics.median(r['rest_pct'] for r in rows):.0f} %")
    print(f"dashboard adds (difference of medians): RSS {medians[True][0] - medians[False][0]:+.1f} MiB, "
          f"PSS {medians[True][2] - medians[False][2]:+.1f} MiB, "
          f"CPU {medians[True][1] - medians[False][1]:+.2f} % of a core")


if __name__ == "__main__":
    main()
