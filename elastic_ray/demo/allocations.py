"""The foundation demo: allocations of one session, watched as a live table.

It shows what the layers below the agent already do for real: validated
configs with inheritance, rendered submissions, one scheduler query per poll
for every job of the session, pending, running, completion and cancel. It
runs on the embedded local scheduler by default and on the Slurm lab with
``--scheduler slurm``. (The elastic Ray run comes with the agent.)
"""

from __future__ import annotations

import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.live import Live
from rich.table import Table

from ..config import SlurmRunAllocationConfig, SlurmWorkerAllocationConfig, inherit_worker_config, resolve_head_config
from ..polling import wait_for
from ..scheduler.base import JobInfo, JobSpec, JobState, Scheduler

# What every emulated or real node prints: enough to see that the allocation
# got what it asked for.
NODE_PROGRAM = (
    "import os, socket, time;"
    "e = os.environ.get;"
    "print('node', e('SLURMD_NODENAME', socket.gethostname()), 'host', socket.gethostname(), 'job', e('SLURM_JOB_ID'), 'nodeid', e('SLURM_NODEID'),"
    " 'cpus', e('SLURM_CPUS_ON_NODE'), 'gpus', e('CUDA_VISIBLE_DEVICES', '-'), flush=True);"
    "time.sleep(float(e('DEMO_SLEEP', '4')))"
)


@dataclass
class Tracked:
    label: str
    job_id: str
    config: SlurmWorkerAllocationConfig
    history: list[str]


def _spec(job_name: str, label: str, config: SlurmRunAllocationConfig, workdir: Path, sleep: float) -> JobSpec:
    return JobSpec(job_name=job_name, role="worker", allocation=config,
                   node_argv=(sys.executable, "-c", NODE_PROGRAM), workdir=workdir,
                   output=str(workdir / f"{label}-%j.out"), env={"DEMO_SLEEP": str(sleep)})


def _table(tracked: list[Tracked], infos: dict[str, JobInfo], polls: int, queries: int) -> Table:
    table = Table(title=f"allocations of one session  (poll {polls}, scheduler queries {queries})")
    for column in ("allocation", "job", "partition", "state", "nodes", "time left", "history"):
        table.add_column(column)
    for item in tracked:
        info = infos.get(item.job_id)
        state = info.state.value if info else "?"
        left = "-" if not info or info.time_left is None else f"{info.time_left:.0f}s"
        table.add_row(item.label, item.job_id, info.partition if info else "", state,
                      ",".join(info.nodes) if info else "", left, " > ".join(item.history))
    return table


def query_calls(scheduler: Scheduler) -> int:
    """How many state queries the scheduler has made (squeue calls on Slurm)."""
    calls = getattr(scheduler, "calls", {})
    return int(calls.get("squeue", calls.get("query", 0)))


def run_demo(scheduler: Scheduler, workdir: Path, console: Console, sleep: float = 4.0,
             timeout: float = 120.0) -> dict[str, JobState]:
    """Submit three worker allocations, watch them, cancel the one that pends."""
    workdir.mkdir(parents=True, exist_ok=True)
    job_name = f"er-demo-{uuid.uuid4().hex[:6]}"
    head = resolve_head_config(SlurmRunAllocationConfig(partition="cpu", time_limit="10"))
    first = inherit_worker_config(
        SlurmWorkerAllocationConfig(partition="cpu", num_nodes=2, cpus_per_task=2, mem="512M",
                                    time_limit="5"), None, head)
    gpus = inherit_worker_config(
        SlurmWorkerAllocationConfig(partition="gpu-a", num_nodes=1, gpus_per_node=2, cpus_per_task=2,
                                    ray_resources={"accelerator:a40": 1}), first, head)
    # Asks for every GPU of gpu-a while `gpus` holds two of them: it pends.
    waiting = inherit_worker_config(
        SlurmWorkerAllocationConfig(partition="gpu-a", num_nodes=1, gpus_per_node=4, cpus_per_task=1), first, head)

    tracked: list[Tracked] = []
    for label, config in (("cpu x2", first), ("gpu-a 2 GPUs", gpus), ("gpu-a 4 GPUs", waiting)):
        job_id = scheduler.submit(_spec(job_name, label.replace(" ", "_"), config, workdir, sleep))
        tracked.append(Tracked(label, job_id, config, ["SUBMITTED"]))
    console.print(f"session job name [bold]{job_name}[/]; {len(tracked)} allocations submitted; "
                  f"output in {workdir}")

    polls = 0
    cancelled = False
    infos: dict[str, JobInfo] = {}

    def poll(live: Live) -> bool:
        nonlocal polls, cancelled, infos
        polls += 1
        infos = scheduler.query(job_name, [t.job_id for t in tracked])  # one query for all
        for item in tracked:
            info = infos.get(item.job_id)
            if info and item.history[-1] != info.state.value:
                item.history.append(info.state.value)
        # Once the GPU allocation has run to completion the big one could start;
        # cancel it while it pends, to show a pending cancel.
        big = infos.get(tracked[2].job_id)
        if not cancelled and big is not None and big.state is JobState.PENDING and polls >= 3:
            scheduler.cancel(tracked[2].job_id)
            cancelled = True
        live.update(_table(tracked, infos, polls, query_calls(scheduler)))
        return all(i.state.is_final for i in infos.values()) and len(infos) == len(tracked)

    try:
        with Live(console=console, refresh_per_second=4, transient=False) as live:
            # Gives up quietly at the timeout: the table shows where each job got to.
            wait_for(lambda: poll(live), timeout=timeout, interval=0.5, raising=False)
    finally:
        for item in tracked:
            info = infos.get(item.job_id)
            if info is None or info.state.is_active:
                scheduler.cancel(item.job_id)
    for out in sorted(workdir.glob("*.out")):
        console.print(f"[dim]{out.name}:[/] {out.read_text().strip()}")
    return {t.label: infos[t.job_id].state for t in tracked if t.job_id in infos}

