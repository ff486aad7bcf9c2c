"""A worker node cut off the network, on the Slurm lab: how long its tasks stall, by Ray setting.

Prints figures; asserts nothing. Needs root and the lab (``python3
integration/lab up 4``; the fault harness starts it if it is down):

    .venv/bin/python bench/bench_net_cut.py [--runs 1] [--cuts 20,120,never] [--modes off,keepalive]
    .venv/bin/python bench/bench_net_cut.py --long-task 120 --modes keepalive

Each run is the fault matrix's ``worker-network-cut`` scenario
(``integration/faults``): a separate CPU head, 2-CPU worker allocations on
``gpu-a`` and ``gpu-b``, the demo payload (waves of 0.5 s units, each task
with ``max_retries=3``) through the seed's loop, and gpu-b's link set down
16 units in, for ``--cuts`` seconds (``never``: it stays down until the
payload has finished). Figures, in seconds after the link went down:

* ``stall``: the longest time in which no unit started (the wave that had a
  unit on the cut node waits for it);
* ``work again``: the first unit started after the cut.

``--modes`` alternates the Ray settings:

* ``off``: ``RayLauncher(network_keepalive_ms=None)``, Ray's own settings;
* ``keepalive``: ``network_keepalive_ms=2000``, gRPC keepalive every 2 s on every Ray process
  (client and server side, nodes and driver), so that the owner of a task
  finds the connection to the cut node dead after a few seconds instead of
  TCP's own minutes;
* ``env``: the same variables set by hand (launcher ``env`` and the driver's
  environment), with ``network_keepalive_ms=None``.

``--long-task S`` runs no fault: units of S seconds (2 units per wave, one
per worker) under each mode, to show that a task longer than the keepalive
period is not killed by it (``redone`` must be 0, the run must finish).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from elastic_ray.config.launcher import RayLauncher  # noqa: E402
from integration.faults import lab_ops  # noqa: E402
from integration.faults.harness import Ctx, Scenario, run_scenario  # noqa: E402

#: ``RayLauncher.network_keepalive_ms`` by mode: ``keepalive`` is 2000 ms, ``off`` is Ray's own
#: settings (the default); ``env`` sets the same variables by hand through the launcher's env and
#: the driver's environment (how they were first measured).
MODES = {"off": None, "keepalive": 2000, "env": None}
ENV_MODE = RayLauncher(network_keepalive_ms=2000).keepalive_env()


def _cut_for(seconds: float | None):
    def inject(ctx: Ctx) -> None:
        job = ctx.worker_jobs[1]
        node = ctx.worker_nodes[job]
        what = "until the payload finished" if seconds is None else f"for {seconds:.0f}s"
        ctx.fault_now(f"link down on {node}'s veth {what} (worker {job})")
        lab_ops.link(node, False)
        # As the fault matrix does: link up, then wait until Slurm has the node back for good
        # (a node cut off past SlurmdTimeout comes back with steps of a job Slurm requeued).
        ctx.cleanup.append(lambda: lab_ops.restore_node(node))
        if seconds is not None:
            time.sleep(seconds)
            lab_ops.link(node, True)
            ctx.event(f"link up on {node}")
    return inject


def _no_fault(ctx: Ctx) -> None:
    ctx.fault_now("no fault: long units running")


def _scenario(cut: str, mode: str, long_task: float | None) -> Scenario:
    kw = {"ray_env": dict(ENV_MODE) if mode == "env" else {}, "network_keepalive_ms": MODES[mode]}
    if long_task is not None:
        return Scenario(f"long-task-{long_task:.0f}s-{mode}", "bench", f"units of {long_task:.0f}s, {mode}",
                        _no_fault, units=4, unit_seconds=long_task, fault_after_units=0,
                        timeout=6 * long_task + 300, **kw)
    seconds = None if cut == "never" else float(cut)
    return Scenario(f"net-cut-{cut}-{mode}", "bench", f"gpu-b's link down {cut} s, {mode}", _cut_for(seconds),
                    timeout=600.0 if seconds is None else 360.0 + seconds, **kw)


def _fmt(values: list[float]) -> str:
    if not values:
        return "-"
    return f"{statistics.median(values):.1f} ({min(values):.1f}-{max(values):.1f}) n={len(values)}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--cuts", default="20,120,never")
    ap.add_argument("--modes", default="off,keepalive")
    ap.add_argument("--long-task", type=float, default=None, metavar="S")
    args = ap.parse_args(argv)
    modes = args.modes.split(",")
    for mode in modes:
        if mode not in MODES:
            ap.error(f"--modes: unknown mode {mode!r} (known: {', '.join(MODES)})")
    cuts = ["-"] if args.long_task is not None else args.cuts.split(",")
    for cut in cuts:
        if cut not in ("-", "never"):
            try:
                float(cut)
            except ValueError:
                ap.error(f"--cuts: {cut!r} is neither a number of seconds nor 'never'")
    rows: dict[tuple[str, str], list] = {}
    base = Path(tempfile.mkdtemp(prefix="bench-net-cut-", dir=str(REPO / ".lab")))
    for run in range(args.runs):
        for cut in cuts:
            # alternate the order of the modes run by run, so neither always goes first
            for mode in (modes if run % 2 == 0 else list(reversed(modes))):
                res = run_scenario(_scenario(cut, mode, args.long_task), base)
                rows.setdefault((cut, mode), []).append(res)
                print(f"-> run {run + 1} cut {cut} mode {mode}: finished={res.finished} stall={res.stall} "
                      f"work_again={res.work_again} redone={res.redone} lost={res.lost} dup={res.duplicates} "
                      f"outcome={res.outcome[:120]!r} failures={getattr(res, 'failures', [])}", flush=True)
    print("\n| cut | mode | finished | stall (s) | work again (s) | redone | lost | duplicates |")
    print("|---|---|---|---|---|---|---|---|")
    for (cut, mode), results in rows.items():
        print(f"| {cut} | {mode} | {sum(r.finished for r in results)}/{len(results)} | "
              f"{_fmt([r.stall for r in results if r.stall is not None])} | "
              f"{_fmt([r.work_again for r in results if r.work_again is not None])} | "
              f"{sum(r.redone for r in results)} | {sum(r.lost for r in results)} | "
              f"{sum(r.duplicates for r in results)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
