"""The main demo: one elastic run, start to finish.

A CPU-only head; a GPU worker allocation joins; a payload commits units of
Ray work; a second worker allocation joins mid-run and the payload uses it;
that worker is drained away; the head's job is cancelled, the payload gets
SlurmAllocationEnded, the session elects the GPU worker allocation as the
new head, the payload is relaunched and finishes. Every unit must be
committed exactly once. Runs on the local scheduler by default, on the Slurm
lab with ``--scheduler slurm``.
"""

from __future__ import annotations

import sys
import time
import uuid
from pathlib import Path

from rich.console import Console

from ..config import SlurmRunAllocationConfig, SlurmWorkerAllocationConfig
from ..coordinator.session import Session
from ..errors import SlurmAllocationEnded
from ..protocol.disk import paths
from ..config.launcher import RayLauncher


class Timeline:
    def __init__(self, console: Console):
        self.console = console
        self.t0 = time.monotonic()

    def step(self, text: str) -> None:
        elapsed = time.monotonic() - self.t0
        self.console.print(f"[dim]{elapsed:6.1f}s[/]  {text}")


def run_main_demo(scheduler: str, workdir: Path, console: Console, units: int = 120) -> bool:
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / f"run-{time.strftime('%H%M%S')}-{uuid.uuid4().hex[:4]}"
    t = Timeline(console)
    session = Session.create(
        path, scheduler=scheduler, supervise=False,
        head=SlurmRunAllocationConfig(partition="cpu", time_limit="30", mem="1G", cpus_per_task=1),
        launcher=RayLauncher(object_store_memory=100_000_000))
    t.step(f"session {session.job_name} created in {path}; head job {session.record().head_job} submitted")
    ok = False
    try:
        address = session.wait_for_head(timeout=180)
        t.step(f"CPU-only head ready at {address}")
        gpu = session.add_worker_allocation(SlurmWorkerAllocationConfig(
            partition="gpu-a", num_nodes=1, gpus_per_node=2, cpus_per_task=2, mem="1G", time_limit="20",
            ray_resources={"accelerator:a40": 1}))
        nodes = session.wait_for_worker_allocation(gpu, timeout=180)
        t.step(f"worker allocation {gpu.job_id} (gpu-a, 2 GPUs, 2 CPUs) joined: {nodes}")

        commits = paths.demo_commits_file(path)
        argv = [sys.executable, "-m", "elastic_ray.demo.payload", str(commits), str(units)]
        log = open(paths.demo_payload_log(path), "a")
        run = session.run(argv, stdout=log, stderr=log)
        t.step(f"payload started next to the head ({units} units of Ray work)")

        extra = session.add_worker_allocation(SlurmWorkerAllocationConfig(
            partition="cpu", num_nodes=1, gpus_per_node=0, cpus_per_task=2, mem="1G", time_limit="20"))
        session.wait_for_worker_allocation(extra, timeout=180)
        t.step(f"worker allocation {extra.job_id} (cpu, 2 CPUs) joined while the payload runs")
        time.sleep(3)
        state = session.remove_worker_allocation(extra, drain_timeout=60)
        t.step(f"worker allocation {extra.job_id} drained and removed: {state}")

        head_job = session.record().head_job
        session.scheduler.cancel(head_job)
        t.step(f"head job {head_job} cancelled (the node hosting the head is gone)")
        try:
            run.wait(timeout=300)
            t.step("payload finished before the failover")
        except SlurmAllocationEnded as exc:
            t.step(f"payload raised SlurmAllocationEnded (allocation_state={exc.allocation_state})")
        head = session.replace_head(timeout=300)
        t.step(f"replace_head(): job {head.job_id} hosts the head now at {head.address}")
        session.wait_for_worker_allocation(gpu, timeout=180)
        t.step(f"worker allocation {gpu.job_id} rejoined the new head with new Ray node ids")
        session.run(argv, head=head, stdout=log, stderr=log).wait(timeout=600)
        committed = [int(x) for x in commits.read_text().split()]
        ok = sorted(committed) == list(range(units))
        t.step(f"payload finished; {len(committed)} commits for {units} units: "
               + ("every unit exactly once" if ok else "[red]MISMATCH[/]"))
        # The payload's view, shortened to the moments the cluster changed.
        previous = None
        for line in paths.demo_payload_log(path).read_text().splitlines():
            if not line.startswith("payload:"):
                continue
            shape = line.split(";")[0].split(" on ")[-1] + line.split(";")[1] if ";" in line else line
            if shape != previous:
                console.print(f"         [dim]{line}[/]")
                previous = shape
    finally:
        session.teardown()
        t.step("session torn down (every job of the session cancelled)")
    show_history(path, console)
    return ok


def show_history(path: Path, console: Console) -> None:
    """The run as its event log tells it: what it held, and its timeline drawn to a page."""
    from ..history.read import run_usage
    from ..history.summary import draw_page

    history, figures = run_usage(path)
    console.print(f"         [dim]the event log: {len(history.events)} events "
                  f"(elastic-ray session events {path}); {figures.node_hours * 60:.1f} node-minutes, "
                  f"{figures.gpu_hours_held * 60:.1f} GPU-minutes held"
                  + ("" if figures.gpu_hours_idle is None else f", {figures.gpu_hours_idle * 60:.1f} idle") + "[/]")
    page = draw_page(path, history)      # None: no timeline extra, or the page could not be written
    if page is not None:
        console.print(f"         [dim]the run's timeline: {page}[/]")
