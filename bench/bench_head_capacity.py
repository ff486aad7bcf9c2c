"""Capacity back after head loss, on the Slurm lab: head cancelled -> a task runs.

Prints figures; asserts nothing. Needs root and the lab (``python3
integration/lab up 4``; started and stopped here if it is down):

    .venv/bin/python bench/bench_head_capacity.py [--runs 5] [--orders all,host-first] [--modes off,standby]

Each run is the fault matrix's ``head-cancel`` scenario (``integration/faults``):
a separate CPU head on ``cpu``, 2-CPU worker allocations on ``gpu-a`` and
``gpu-b``, the demo payload driven through the seed's loop (run; on
``SlurmAllocationEnded`` call ``replace_head()`` and launch again), and
``scancel`` of the head job 4 units in. Nobody but that loop calls anything.
Phases, each in seconds after the ``scancel`` (t = 0), read from the loop's
events, the agents' own logs and the payload's trace:

* ``driver ended``: the payload's ``run.wait`` raised;
* ``elected``: ``replace_head()`` returned (the new head's GCS is open);
* ``host ready``: the hosting node's agent logged ``hosted_head_ready``;
* ``host worker``: the hosting node's own worker JOINED the new head;
* ``other worker``: the other allocation's worker JOINED the new head;
* ``driver begun``, ``driver connected``: the relaunched driver's process
  began, its ``ray.init()`` returned (the payload's trace);
* ``task runs``: the relaunched driver's first unit of work started on a
  node (the payload's trace: the task's own start time on its node, the
  first one after ``elected``);
* ``work again``: that unit's commit by the relaunched driver.

``--orders`` alternates the agents' rejoin order run by run (agent setting
``ELASTIC_AGENT_REJOIN_ORDER``): ``all`` (every worker restarts Ray the
moment it sees the new head) against ``host-first`` (the default: see
``elastic_ray.agent.head.rejoin_order``). The lab's nodes share one machine and
its 2 cores, which is what makes the order matter here.

``--modes`` alternates the warm standby head (``RayLauncher.standby_head``)
run by run: ``off`` (the election starts `ray start --head` on the elected
allocation) against ``standby`` (a standby keeper, the one the session's
supervisor runs, places a standby head on the allocation the next election
would pick; the ``scancel`` waits until its node file says STANDBY, so the
election only publishes it). The harness's session runs without a
supervisor (only the seed's loop acts), so here the keeper runs alone, on a
thread of this process, from just before the fault; ``host ready`` is then
the standby's promotion. ``supervised`` runs the session's own supervisor
(``HeadSupervisor``, as every step process of a real run does) with that
keeper inside: the supervisor notices the loss and elects by itself, so the
hosting node's worker starts rejoining before the loop's ``replace_head()``.
``default`` is what a user gets without setting anything: the session
created with its supervisor (``Session.create``'s default) and the default
launcher (``standby_head`` on), nothing added by the bench; the head is
cancelled once the payload is past its start (16 units in, and the
supervisor's own standby up: a head lost later in a run, as most are).
``standby placed`` is then how long after the session was up (every worker
JOINED) the supervisor's standby was ready with its worker (the worker node
kept joined to it, ``agent.head.standby_worker``). ``default-early`` is the same
with the head cancelled as soon as the payload committed its first unit,
whether or not a standby is up yet (the run's events say which): the head
lost in the first seconds of a run. ``default-nokeepalive`` is ``default``
with ``network_keepalive_ms=None`` (Ray's own gRPC settings), to weigh the
keepalive's share; ``default-nowarm`` is ``default`` with the standby's
worker off (``ELASTIC_AGENT_STANDBY_WORKER=off``), to weigh that worker's
share. ``--settle S`` waits S more seconds after the standby is
ready before the fault (the standby's own processes are busy starting for a
few seconds after it counts as ready; a head lost minutes into a run meets a
quiet standby).
``--layouts`` alternates the head's layout: ``separate`` (a head-only CPU
allocation, as above) and ``default`` (``ray_head_only=False``: the head's
allocation is the run's first worker allocation and computes too).
Columns are ``order/mode/layout``, each part only when it varies.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from elastic_ray.protocol.disk import paths  # noqa: E402
from integration.faults import lab_ops  # noqa: E402
from integration.faults.harness import Result, run_scenario  # noqa: E402
from integration.faults.scenarios import BY_NAME  # noqa: E402

MODES = ("off", "standby", "supervised", "default", "default-early", "default-nokeepalive", "default-nowarm")
PHASES = ("driver ended", "elected", "host ready", "host worker", "other worker", "driver begun",
          "driver connected", "task runs", "work again", "standby placed")
_LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) \w+ event=(\w+) (.*)$")


def _stamp(date: str, ms: str) -> float:
    return time.mktime(time.strptime(date, "%Y-%m-%d %H:%M:%S")) + int(ms) / 1000.0


def _events_of(log: Path) -> list[tuple[float, str, str]]:
    out = []
    for line in log.read_text(errors="replace").splitlines():
        m = _LINE.match(line)
        if m:
            out.append((_stamp(m.group(1), m.group(2)), m.group(3), m.group(4)))
    return out


def _agent_logs(session_dir: Path) -> dict[tuple[str, str], Path]:
    """(job, node) -> the agent's log (``logs/agent-<job>-<node>.log``)."""
    found = {}
    for p in paths.log_dir(session_dir).glob("agent-*.log"):
        named = paths.parse_agent_log_name(p.name)
        if named is not None:
            found[named] = p
    return found


def _loop_event(res: Result, prefix: str) -> float | None:
    for line in res.events:
        rel, _, text = line.strip().partition("s ")
        if text.startswith(prefix):
            return res.t0 + float(rel)
    return None


def phases(res: Result) -> dict[str, float | None]:
    """Seconds after the fault for each of :data:`PHASES` (None: not seen)."""
    tf = res.t_fault
    out: dict[str, float | None] = dict.fromkeys(PHASES)
    if tf is None:
        return out
    rel = lambda t: None if t is None else round(t - tf, 2)  # noqa: E731
    out["driver ended"] = rel(_loop_event(res, "run ended"))
    out["elected"] = rel(_loop_event(res, "replace_head()"))
    new_head = next((ln.rsplit("-> ", 1)[1].strip() for ln in res.events if "replace_head() ->" in ln), None)
    logs = _agent_logs(Path(res.session_dir))
    host_node = None
    if new_head is not None:
        for (job, node), path in logs.items():
            if job == new_head:
                for t, ev, _ in _events_of(path):
                    if ev == "hosted_head_ready" and t > tf:
                        out["host ready"] = rel(t)
                        host_node = (job, node)
                        break
        for key, path in logs.items():
            joined = next((t for t, ev, rest in _events_of(path)
                           if ev == "state_changed" and t > tf and "state=JOINED" in rest
                           and f"joined head {new_head}" in rest), None)
            if joined is None:
                continue
            slot = "host worker" if key == host_node else "other worker"
            if out[slot] is None or rel(joined) > out[slot]:
                out[slot] = rel(joined)
    # Units the old driver had dispatched can still start just after the
    # fault; the relaunched driver's first unit starts after replace_head().
    after = tf + (out["elected"] or 0.0)
    trace = [ln.split() for ln in _read(res.trace)]
    starts = sorted(float(p[2]) for p in trace if len(p) >= 4 and p[0] == "start" and float(p[2]) > after)
    out["task runs"] = rel(starts[0]) if starts else None
    for what in ("begun", "connected"):   # the relaunched driver: its process, its ray.init()
        seen = sorted(float(p[2]) for p in trace if len(p) >= 3 and p[0] == "driver" and p[1] == what
                      and float(p[2]) > after)
        out[f"driver {what}"] = rel(seen[0]) if seen else None
    out["work again"] = None if res.work_again is None else round(res.work_again, 2)
    # Not after the fault: how long after the session was up the supervisor's standby was ready.
    placed = next((ln for ln in res.events if "standby placed: ready" in ln), None)
    out["standby placed"] = float(placed.split("ready ", 1)[1].split(" s", 1)[0]) if placed else None
    return out


class _StandbySession:
    """The harness's session as the keeper sees it: the launcher with
    ``standby_head`` on (the session was created without it), all else its own."""

    def __init__(self, session):
        self._session = session
        self.launcher = replace(session.launcher, standby_head=True)

    def __getattr__(self, name):
        return getattr(self._session, name)


def with_standby(inject, supervised: bool = False):
    """Wrap a scenario's fault: start a standby keeper, wait for its standby, then inject.

    ``supervised``: instead of a bare keeper, the session's own supervisor
    (``HeadSupervisor``, what every step process of a run starts) with the
    keeper inside it; it notices the head's loss itself and elects at once,
    before the payload loop's ``replace_head()`` asks. It is stopped by the
    scenario's cleanup, before the teardown."""
    import threading

    from elastic_ray.coordinator.head.standby import StandbyKeeper, first_node
    from elastic_ray.coordinator.head.supervise import HeadSupervisor
    from elastic_ray.protocol.disk.records import HostedHeadState

    def run(ctx) -> None:
        keeper = StandbyKeeper(_StandbySession(ctx.session), interval=5.0)
        if supervised:
            supervisor = HeadSupervisor(ctx.session, interval=30.0, standby=keeper).start()
            ctx.cleanup.append(supervisor.stop)
            keeper = supervisor.standby
        stop = threading.Event()
        ctx.cleanup.append(stop.set)

        def keep() -> None:
            while not stop.is_set():
                try:
                    if keeper.due(time.time()):
                        keeper.apply(time.time())
                except Exception as exc:  # noqa: BLE001 - a bench keeps going; the figures show it
                    ctx.event(f"standby keeper: {type(exc).__name__}: {exc}")
                stop.wait(0.5)

        if not supervised:
            threading.Thread(target=keep, daemon=True, name="bench-standby").start()

        def standing() -> str | None:
            target = keeper.last.target if keeper.last is not None else None
            first = first_node(ctx.session.node_states(target)) if target else None
            hosted = first.hosted_head if first is not None else None
            return target if hosted is not None and hosted.state is HostedHeadState.STANDBY else None

        deadline = time.monotonic() + 120
        while (job := standing()) is None:
            if time.monotonic() > deadline:
                raise TimeoutError("no standby head within 120 s")
            time.sleep(0.2)
        ctx.event(f"standby head ready on {job}")
        inject(ctx)

    return run


def noting_standby(inject, wait: bool, settle: float = 0.0, warm: bool = True):
    """Wrap a fault: with ``wait``, first wait (up to 120 s) for the supervisor's own standby,
    noting how long after the session was up it was ready; say in the run's events whether a
    standby was up at the fault."""
    from elastic_ray.protocol.disk.records import HostedHeadState

    def standing(ctx) -> list[str]:
        # Ready with its worker, where it keeps one (ELASTIC_AGENT_STANDBY_WORKER, on by default).
        return [job for job in ctx.worker_jobs for st in ctx.session.node_states(job).values()
                if st.hosted_head is not None and st.hosted_head.state is HostedHeadState.STANDBY
                and (st.hosted_head.worker_pid is not None or not warm)]

    def run(ctx) -> None:
        up = standing(ctx)
        if wait and not up:
            deadline = time.monotonic() + 120
            while not (up := standing(ctx)):
                if time.monotonic() > deadline:
                    raise TimeoutError("the supervisor placed no standby head within 120 s")
                time.sleep(0.2)
            session_up = next(t for t, text in ctx.events if text.startswith("session up"))
            ctx.event(f"standby placed: ready {time.time() - session_up:.2f} s after the session was up")
        if wait:
            time.sleep(settle)
        ctx.event(f"at the fault: standby head {'on ' + ', '.join(up) if up else 'not up yet'}")
        inject(ctx)

    return run


def _read(path: str) -> list[str]:
    p = Path(path)
    return p.read_text().splitlines() if path and p.exists() else []


def _fmt(xs: list[float]) -> str:
    if not xs:
        return "-"
    return f"{statistics.median(xs):.2f} ({min(xs):.2f}-{max(xs):.2f})"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5, help="runs of each order (alternating)")
    ap.add_argument("--orders", default="all,host-first",
                    help="comma-separated rejoin orders to alternate (all, host-first)")
    ap.add_argument("--standby", action="store_true", help="shorthand for --modes off,standby")
    ap.add_argument("--modes", default="off",
                    help="comma-separated modes to alternate: off, standby (a bare standby keeper), "
                         "supervised (the session's supervisor with its keeper: it elects on loss by itself), "
                         "default (what a user gets: supervisor and standby by default, no waiting for it), "
                         "default-early (the same, the head lost at the payload's first unit), "
                         "default-nokeepalive, default-nowarm (see the module docstring)")
    ap.add_argument("--layouts", default="separate",
                    help="comma-separated head layouts to alternate: separate (a head-only allocation), "
                         "default (the head's allocation computes too)")
    ap.add_argument("--settle", type=float, default=0.0, metavar="S",
                    help="default modes: seconds to wait after the standby is ready before the fault")
    args = ap.parse_args(argv)
    orders = [o.strip() for o in args.orders.split(",") if o.strip()]
    bad = [o for o in orders if o not in ("all", "host-first")]
    if bad or not orders:
        ap.error(f"--orders: unknown order(s) {bad}; use all and/or host-first")
    modes = ["off", "standby"] if args.standby else [m.strip() for m in args.modes.split(",") if m.strip()]
    bad = [m for m in modes if m not in MODES]
    if bad or not modes:
        ap.error(f"--modes: unknown mode(s) {bad}; use {', '.join(MODES)}")
    layouts = [x.strip() for x in args.layouts.split(",") if x.strip()]
    bad = [x for x in layouts if x not in ("separate", "default")]
    if bad or not layouts:
        ap.error(f"--layouts: unknown layout(s) {bad}; use separate and/or default")
    combos = [(o, m, x) for o in orders for m in modes for x in layouts]

    def label(o: str, m: str, x: str) -> str:
        parts = [p for p, many in ((o, len(orders) > 1), (m, len(modes) > 1), (x, len(layouts) > 1)) if many]
        return "/".join(parts) or o

    # How each driver's wait ended (seen by its exit, the heartbeat or a paced look; its stop's length).
    import logging
    drivers_log = logging.getLogger("elastic_ray.coordinator")
    drivers_log.setLevel(logging.INFO)
    shown = logging.StreamHandler(sys.stdout)
    shown.setFormatter(logging.Formatter("  [drivers %(asctime)s] %(message)s"))
    shown.addFilter(lambda record: any(word in record.getMessage() for word in (
        "driver_head_gone", "event=election ", "head_switched", "election_skipped", "head_found")))
    drivers_log.addHandler(shown)

    labctl = lab_ops.labctl
    started = not labctl.is_up()
    if started:
        labctl.up(4)
    import os
    os.environ["SLURM_CONF"] = str(labctl.settings_from_env().conf)
    base = labctl.settings_from_env().shared_dir / "bench-capacity"
    base.mkdir(parents=True, exist_ok=True)
    table: dict[str, list[dict[str, float | None]]] = {label(o, m, x): [] for o, m, x in combos}
    problems: list[str] = []
    try:
        for i in range(args.runs):
            for order, mode, layout in combos:
                sc = replace(BY_NAME["head-cancel"], agent_env={"ELASTIC_AGENT_REJOIN_ORDER": order},
                             ray_head_only=layout == "separate")
                if mode in ("standby", "supervised"):
                    sc = replace(sc, inject=with_standby(sc.inject, supervised=mode == "supervised"))
                elif mode.startswith("default"):
                    if mode == "default-nowarm":   # the standby without its worker
                        sc = replace(sc, agent_env={**sc.agent_env, "ELASTIC_AGENT_STANDBY_WORKER": "off"})
                    # --settle: enough units that the payload still runs at the fault (4 CPUs, 0.5 s units)
                    # (and 6 s more: the standby's worker joins after it)
                    sc = replace(sc, supervise=True, units=sc.units + int(16 * (args.settle + 6)),
                                 inject=noting_standby(sc.inject, wait=mode != "default-early", settle=args.settle,
                                                       warm=mode != "default-nowarm"),
                                 fault_after_units=1 if mode == "default-early" else sc.fault_after_units,
                                 network_keepalive_ms=None if mode == "default-nokeepalive"
                                 else sc.network_keepalive_ms)
                res = run_scenario(sc, base)
                ph = phases(res)
                name = label(order, mode, layout)
                table[name].append(ph)
                if not res.ok:
                    problems.append(f"run {i + 1} {name}: {'; '.join(res.failures)}")
                print(f"run {i + 1} {name:18} " + "  ".join(
                    f"{k}={'-' if v is None else f'{v:.2f}'}" for k, v in ph.items()), flush=True)
    finally:
        if started:
            labctl.down()

    print(f"\nhead cancelled -> phases, seconds after scancel; median (range) of {args.runs} runs per column, "
          f"columns alternating run by run")
    print(f"| phase | {' | '.join(table)} |")
    print(f"|---|{'---|' * len(table)}")
    for phase in PHASES:
        cells = [_fmt([r[phase] for r in table[c] if r[phase] is not None]) for c in table]
        print(f"| {phase} | {' | '.join(cells)} |")
    for p in problems:
        print(f"problem: {p}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
