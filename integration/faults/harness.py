"""One scenario of the fault matrix, run from start to teardown with its invariants checked.

The run is the seed's loop, as a user writes it: start the committing
payload; when the run ends with ``SlurmAllocationEnded`` (or the head drains
with ``SlurmStepDrained``), ``replace_head()`` and start it again. A second
thread injects the fault once the payload made progress, a third samples
the session's own view (node states, ``session status``) so the figures
are what the session reported, not what the harness knows.

Figures, all from wall clocks on the one host:

* *work again*: fault → the first commit of a unit whose computation started
  after the fault (so it includes one unit's compute time, 0.5 s);
* *longest stall*: the longest time after the fault in which no unit started
  anywhere (a lost node can stall every task later than the first commit);
* *rejoined*: fault → the last moment every worker node was JOINED to the
  current head after at least one sample showed it was not (``—`` if never
  back; ``no drop`` if the session never saw a node leave);
* *redone*: attempts minus distinct units (work computed twice, committed
  once); *lost*: units not committed when the run ended.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import traceback
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from elastic_ray import Session, SlurmAllocationEnded, SlurmRunAllocationConfig, SlurmStepDrained
from elastic_ray import SlurmWorkerAllocationConfig
from elastic_ray.config.launcher import RayLauncher
from elastic_ray.polling import wait_for
from elastic_ray.protocol.disk.records import AgentState

from . import lab_ops

REPO = Path(__file__).resolve().parents[2]
UNIT_SECONDS = 0.5
TOTAL_UNITS = 120
FAULT_AFTER_UNITS = 16
HEAD = SlurmRunAllocationConfig(partition="cpu", time_limit="30", mem="1G", cpus_per_task=1)
WORKERS = (
    SlurmWorkerAllocationConfig(partition="gpu-a", num_nodes=1, cpus_per_task=2, mem="1G", time_limit="30"),
    SlurmWorkerAllocationConfig(partition="gpu-b", num_nodes=1, cpus_per_task=2, mem="1G", time_limit="30"),
)
AGENT_ENV = {"ELASTIC_AGENT_POLL_INTERVAL": "0.5", "ELASTIC_AGENT_BACKOFF_BASE": "1"}


def _set(event: threading.Event) -> threading.Event:
    event.set()
    return event


@dataclass
class Ctx:
    """What a scenario's fault and checks can use."""

    session: Session
    workdir: Path
    head_job: str
    worker_jobs: list[str]
    worker_nodes: dict[str, str]  # job -> node
    t_start: float = 0.0
    t_fault: float | None = None
    events: list[tuple[float, str]] = field(default_factory=list)
    extra_jobs: set[str] = field(default_factory=set)  # jobs the scenario itself learned of
    cleanup: list[Callable[[], None]] = field(default_factory=list)
    status_seen: list[dict] = field(default_factory=list)
    node_states_seen: set[tuple[str, str, str]] = field(default_factory=set)  # (job, node, state) after the fault
    agent_status_seen: list[str] = field(default_factory=list)
    # Cleared by a fault that must win a race against the payload loop's own replace_head()
    # (the killed elector): the loop waits for it before electing.
    loop_may_elect: threading.Event = field(default_factory=lambda: _set(threading.Event()))

    def event(self, text: str) -> None:
        t = time.time()
        self.events.append((t, text))
        print(f"  [{t - self.t_start:6.1f}s] {text}", flush=True)

    def fault_now(self, text: str) -> None:
        if self.t_fault is None:
            self.t_fault = time.time()
        self.event(f"FAULT: {text}")

    @property
    def job_ids(self) -> set[str]:
        ids = {self.head_job, *self.worker_jobs, *self.extra_jobs}
        try:
            rec = self.session.record()
            ids |= {rec.head_job, *rec.workers, *rec.predecessors} - {None}
            if rec.successor:
                ids.add(rec.successor)
        except Exception:  # noqa: BLE001 - a damaged record is one of the faults
            pass
        return {j for j in ids if j}


@dataclass(frozen=True)
class Scenario:
    name: str
    family: str
    title: str
    inject: Callable[[Ctx], None]
    ci: bool = False
    status_check: Callable[[Ctx], str | None] | None = None  # None = ok, else what is wrong
    expect_failure: str | None = None  # a payload that cannot recover must fail naming this
    keep_capacity: bool = False
    timeout: float = 360.0
    head: SlurmRunAllocationConfig = HEAD
    agent_env: dict[str, str] = field(default_factory=dict)
    workdir_factory: Callable[[Path], Any] | None = None  # a context manager giving the session's parent dir
    units: int = TOTAL_UNITS
    unit_seconds: float = UNIT_SECONDS
    fault_after_units: int = FAULT_AFTER_UNITS
    ray_env: dict[str, str] = field(default_factory=dict)  # RAY_* for every node (launcher env) and the driver
    network_keepalive_ms: int | None = RayLauncher.network_keepalive_ms  # the launcher's; None: Ray's own
    supervise: bool = False  # the session's own supervisor (and with it the warm standby head) in the harness
    ray_head_only: bool = True  # False: the default layout (the head's allocation computes too)


@dataclass
class Result:
    name: str
    family: str
    title: str
    units: int = TOTAL_UNITS
    finished: bool = False
    outcome: str = ""
    work_again: float | None = None
    stall: float | None = None
    rejoined: float | None = None
    rejoin_note: str = ""
    redone: int = 0
    lost: int = 0
    duplicates: int = 0
    jobs_left: list[str] = field(default_factory=list)
    procs_left: list[str] = field(default_factory=list)
    status_problem: str | None = None
    status_excerpt: str = ""
    agent_excerpt: str = ""  # `elastic-agent status` on the hit node, its state line, where the scenario asked
    seconds: float = 0.0
    failures: list[str] = field(default_factory=list)
    events: list[str] = field(default_factory=list)
    # For benches that read the run's own logs afterwards (bench/bench_head_capacity.py).
    t0: float = 0.0
    t_fault: float | None = None
    session_dir: str = ""
    trace: str = ""

    @property
    def ok(self) -> bool:
        return not self.failures


def _parse_trace(path: Path) -> tuple[list[tuple[int, float, str]], list[tuple[int, float]]]:
    starts, commits = [], []
    if not path.exists():
        return starts, commits
    for line in path.read_text().splitlines():
        parts = line.split()
        try:
            if parts[0] == "start" and len(parts) >= 4:
                starts.append((int(parts[1]), float(parts[2]), parts[3]))
            elif parts[0] == "commit" and len(parts) >= 3:
                commits.append((int(parts[1]), float(parts[2])))
        except (ValueError, IndexError):
            continue
    return starts, commits


def work_again(trace: Path, t_fault: float) -> float | None:
    """Fault → first commit of a unit whose (last) start came after the fault."""
    starts, commits = _parse_trace(trace)
    last_start: dict[int, float] = {}
    for unit, t, _ in starts:
        last_start[unit] = max(t, last_start.get(unit, 0.0))
    after = [t for unit, t in commits if t > t_fault and last_start.get(unit, 0.0) > t_fault]
    return min(after) - t_fault if after else None


def longest_stall(trace: Path, t_fault: float) -> float | None:
    """The longest time after the fault with no unit starting anywhere.

    Ignores how fast the first unit came back: a task dispatched a moment
    after the fault can still start while the real stall (every task waiting
    on a lost node) comes later, as a network cut shows.
    """
    starts = sorted(t for _, t, _ in _parse_trace(trace)[0])
    before = [t for t in starts if t <= t_fault]
    after = [t for t in starts if t > t_fault]
    if not after:
        return None
    points = ([before[-1]] if before else []) + after
    return max(b - a for a, b in zip(points, points[1:])) if len(points) > 1 else after[0] - t_fault


def _session_status(ctx: Ctx) -> dict | None:
    cp = subprocess.run([sys.executable, "-m", "elastic_ray.cli", "session", "status", "--json",
                         str(ctx.session.path)], capture_output=True, text=True, timeout=60)
    if cp.returncode != 0:
        ctx.event(f"session status exited {cp.returncode}: {cp.stderr.strip()[-300:]}")
        return None
    try:
        return json.loads(cp.stdout)
    except ValueError:
        ctx.event(f"session status printed no JSON: {cp.stdout[:200]!r}")
        return None


def joined_on_ended(status: dict) -> list[str]:
    """Nodes shown JOINED although their job does not run: never allowed."""
    bad = []
    for row in status.get("jobs", []):
        if row.get("state") == "RUNNING":
            continue
        for node in row.get("nodes", []):
            shown = node.get("node_state") or node.get("agent_state")
            if shown == "JOINED" and not node.get("agent_exited"):
                bad.append(f"{row['role']} {row['job_id']} {row['state']}: {node['node']} JOINED")
    return bad


def _shown(node: dict) -> str:
    """A node as `session status` shows it: its derived state, and the agent's own word when they differ."""
    shown, agent = node.get("node_state") or node.get("agent_state"), node.get("agent_state")
    return shown if shown == agent or agent is None else f"{shown} (agent said {agent})"


def status_line(status: dict | None) -> str:
    if not status:
        return "no status"
    parts = [f"head {status['head']['job_id']} {status['head']['heartbeat']}"]
    for row in status.get("jobs", []):
        nodes = ",".join(f"{n['node']}:{_shown(n)}" for n in row.get("nodes", []))
        reason = f" ({row['reason']})" if row.get("reason") and row["reason"] != "None" else ""
        parts.append(f"{row['role']} {row['job_id']} {row['state']}{reason} [{nodes}]")
    return "; ".join(parts)


def _unusual(status: dict) -> bool:
    if status["head"]["heartbeat"] != "live":
        return True
    for row in status.get("jobs", []):
        if row["state"] != "RUNNING" and not row["role"].startswith("head (replaced"):
            return True
        if any((n.get("node_state") or n.get("agent_state")) != "JOINED" for n in row.get("nodes", [])):
            return True
    return False


def _most_telling(samples: list[dict]) -> dict | None:
    """The first sample that shows the fault (the head not live, a job not running, a node not JOINED)."""
    for st in samples:
        if _unusual(st):
            return st
    return samples[0] if samples else None


class Sampler(threading.Thread):
    """Samples the session's node states every 0.5 s and `session status` every 3 s after the fault."""

    def __init__(self, ctx: Ctx):
        super().__init__(daemon=True, name="fault-sampler")
        self.ctx = ctx
        self.stop = threading.Event()
        self.dropped = False
        self.rejoined_at: float | None = None
        self.baseline = 0
        self.last_status_at = 0.0

    def joined_count(self) -> tuple[int, int]:
        s = self.ctx.session
        pointer = s.head_pointer()
        jobs = [w.job_id for w in s.worker_allocations]
        live = s.query(jobs) if jobs else {}
        joined = 0
        expected = 0
        for job in jobs:
            info = live.get(job)
            if info is None or not info.state.is_active:
                continue
            expected += max(1, len(info.nodes or ()))
            for st in s.node_states(job).values():
                if self.ctx.t_fault is not None:
                    self.ctx.node_states_seen.add((job, st.node, "EXITED" if st.exited else st.state.value))
                if st.state is AgentState.JOINED and st.head_job == pointer and not st.exited:
                    joined += 1
        return joined, expected

    def run(self) -> None:
        ctx = self.ctx
        while not self.stop.wait(0.5):
            try:
                joined, _ = self.joined_count()
            except Exception as e:  # noqa: BLE001 - a damaged session dir is a scenario
                joined = -1
                err = f"{type(e).__name__}: {e}"
                if not ctx.events or ctx.events[-1][1] != f"sampler: {err}":
                    ctx.event(f"sampler: {err}")
            if ctx.t_fault is None:
                self.baseline = max(self.baseline, joined)
                continue
            if joined < self.baseline:
                self.dropped = True
            elif self.dropped and joined >= self.baseline:
                if self.rejoined_at is None:
                    ctx.event(f"all {joined} worker nodes JOINED to the current head again")
                self.rejoined_at = time.time()
                self.dropped = False
            now = time.time()
            if now - self.last_status_at >= 3.0 and now - ctx.t_fault < 60:
                self.last_status_at = now
                st = _session_status(ctx)
                if st:
                    ctx.status_seen.append(st)


def _seed_loop(ctx: Ctx, argv: list[str], env: dict[str, str], deadline: float, log_path: Path) -> str:
    """The seed's failover loop; returns 'finished' or raises what the user would see."""
    head = None
    relaunches = 0
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the payload did not finish before the scenario's deadline")
        try:
            with open(log_path, "a") as out:
                run = ctx.session.run(argv, head=head, env=env, stdout=out, stderr=subprocess.STDOUT)
            result = run.wait(timeout=left)
            ctx.event(f"payload finished (rc {result.returncode}) after {relaunches} relaunches")
            return "finished"
        except (SlurmAllocationEnded, SlurmStepDrained) as e:
            ctx.event(f"run ended: {type(e).__name__} state={getattr(e, 'allocation_state', None)}: {e}")
            relaunches += 1
            if relaunches > 6:
                raise
            ctx.loop_may_elect.wait(timeout=max(1.0, deadline - time.monotonic()))
            head = ctx.session.replace_head(timeout=max(10.0, deadline - time.monotonic()))
            ctx.event(f"replace_head() -> {head.job_id}")


def _wait(pred: Callable[[], bool], timeout: float, step: float = 0.5) -> bool:
    """True once ``pred`` holds, False when ``timeout`` passed (the project's one polling loop)."""
    return bool(wait_for(pred, timeout=timeout, interval=step, raising=False))


def run_scenario(sc: Scenario, base: Path) -> Result:
    """Set up a session, run the payload, inject ``sc``'s fault, tear down, check the invariants."""
    res = Result(sc.name, sc.family, sc.title, units=sc.units)
    t0 = res.t0 = time.time()
    print(f"\n=== {sc.name}: {sc.title}", flush=True)
    for node in lab_ops.all_nodes_ready():
        print(f"  (lab: {node} was left drained or down before this scenario; resumed)", flush=True)
    saved_env = {k: os.environ.get(k) for k in {**AGENT_ENV, **sc.agent_env}}
    os.environ.update(AGENT_ENV)
    os.environ.update(sc.agent_env)
    ctx: Ctx | None = None
    session = None
    fs_cm = sc.workdir_factory(base) if sc.workdir_factory else None
    parent = fs_cm.__enter__() if fs_cm else base
    try:
        session = Session.create(Path(parent) / f"{sc.name}-{uuid.uuid4().hex[:6]}", scheduler="slurm", head=sc.head,
                                 launcher=RayLauncher(object_store_memory=100_000_000, env=sc.ray_env,
                                                      network_keepalive_ms=sc.network_keepalive_ms),
                                 supervise=sc.supervise, ray_head_only=sc.ray_head_only)
        ctx = Ctx(session, Path(parent), session.record().head_job, [], {}, t_start=t0)
        res.session_dir = str(session.path)
        session.wait_for_head(timeout=120)
        handles = [session.add_worker_allocation(w, resubmit_on_failure=1 if sc.keep_capacity else 0)
                   for w in WORKERS]
        for h in handles:
            nodes = session.wait_for_worker_allocation(h, timeout=180)
            ctx.worker_jobs.append(h.job_id)
            ctx.worker_nodes[h.job_id] = next(iter(nodes))
        ctx.event(f"session up: head {ctx.head_job}, workers {ctx.worker_nodes}")

        out = base / f"{session.path.name}-work"  # never on a filesystem a scenario fills
        out.mkdir(parents=True)
        commits, trace = out / "commits.txt", out / "trace.txt"
        res.trace = str(trace)
        env = {"ELASTIC_RAY_PAYLOAD_TRACE": str(trace), "ELASTIC_RAY_PAYLOAD_UNIT_SECONDS": str(sc.unit_seconds),
               **sc.ray_env}
        argv = [sys.executable, "-m", "elastic_ray.demo.payload", str(commits), str(sc.units)]

        sampler = Sampler(ctx)
        sampler.start()
        injector_error: list[str] = []

        def inject() -> None:
            try:
                _wait(lambda: len(_parse_trace(trace)[1]) >= sc.fault_after_units, timeout=180, step=0.2)
                sc.inject(ctx)
            except Exception:  # noqa: BLE001 - reported as the scenario's failure
                injector_error.append(traceback.format_exc(limit=4))
                ctx.event(f"injector failed: {injector_error[-1].splitlines()[-1]}")

        injector = threading.Thread(target=inject, daemon=True, name="fault-injector")
        injector.start()
        try:
            res.outcome = _seed_loop(ctx, argv, env, time.monotonic() + sc.timeout, out / "payload.log")
            res.finished = True
        except Exception as e:  # noqa: BLE001 - what the user's loop would see
            res.outcome = f"{type(e).__name__}: {e}"
            ctx.event(f"payload loop ended with {res.outcome[:300]}")
        injector.join(timeout=120)
        if injector_error:
            res.failures.append(f"fault injection failed: {injector_error[0].splitlines()[-1]}")
        # Give the session a moment to bring everything back before the rejoin figure is read.
        _wait(lambda: ctx.t_fault is not None and not sampler.dropped, timeout=60)
        sampler.stop.set()
        sampler.join(timeout=30)
        final_status = _session_status(ctx)
        if final_status:
            ctx.status_seen.append(final_status)

        # Figures.
        starts, commit_lines = _parse_trace(trace)
        units = [int(x) for x in commits.read_text().split()] if commits.exists() else []
        counts = Counter(units)
        res.duplicates = sum(c - 1 for c in counts.values() if c > 1)
        res.lost = sc.units - len(counts)
        res.redone = len(starts) - len({u for u, _, _ in starts})
        res.t_fault = ctx.t_fault
        if ctx.t_fault is not None:
            res.work_again = work_again(trace, ctx.t_fault)
            res.stall = longest_stall(trace, ctx.t_fault)
            if sampler.rejoined_at is not None:
                res.rejoined = sampler.rejoined_at - ctx.t_fault
            elif sampler.dropped:
                res.rejoin_note = "not back"
            else:
                res.rejoin_note = "no drop"
        else:
            res.failures.append("the fault was never injected")

        # Invariants about the payload.
        if sc.expect_failure:
            if res.finished:
                pass  # recovering is better than the clear failure we would have accepted
            elif sc.expect_failure not in res.outcome:
                res.failures.append(f"the payload failed without naming the fault ({sc.expect_failure}): "
                                    f"{res.outcome[:200]}")
        elif not res.finished:
            # What the payload printed last says why (a trace of a lab run is gone with its clone).
            said = "\n".join((out / "payload.log").read_text(errors="replace").splitlines()[-30:]) \
                if (out / "payload.log").exists() else "(no payload.log)"
            res.failures.append(f"payload did not finish: {res.outcome[:300]}\n--- payload.log, last lines:\n{said}")
        if res.duplicates:
            res.failures.append(f"{res.duplicates} units committed more than once")
        if res.finished and res.lost:
            res.failures.append(f"{res.lost} units never committed although the run finished")
        if sc.status_check is not None:
            res.status_problem = sc.status_check(ctx)
            if res.status_problem:
                res.failures.append(f"status: {res.status_problem}")
        for st in ctx.status_seen:
            for bad in joined_on_ended(st):
                res.failures.append(f"status showed {bad}")
                break
        res.status_excerpt = status_line(_most_telling(ctx.status_seen))
        for text in ctx.agent_status_seen:
            state = [ln.strip() for ln in text.splitlines() if ln.strip().startswith("state")]
            if state:
                res.agent_excerpt = f"{text.split('$', 1)[0]}: {' '.join(state[0].split())}"
                break
    except Exception as e:  # noqa: BLE001 - the scenario's own set-up broke
        res.failures.append(f"harness: {type(e).__name__}: {e}")
        traceback.print_exc()
    finally:
        if ctx is not None:
            for undo in reversed(ctx.cleanup):
                try:
                    undo()
                except Exception as e:  # noqa: BLE001
                    res.failures.append(f"cleanup: {type(e).__name__}: {e}")
        if session is not None:
            _teardown_and_check(session, ctx, res)
        if fs_cm is not None:
            fs_cm.__exit__(None, None, None)
        for k, v in saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    if ctx is not None:
        res.events = [f"{t - t0:6.1f}s {text}" for t, text in ctx.events]
    res.seconds = time.time() - t0
    print(f"=== {sc.name}: {'OK' if res.ok else 'FAILED: ' + '; '.join(res.failures)} ({res.seconds:.0f}s)",
          flush=True)
    return res


def _squeue(job_ids: set[str]) -> list[str]:
    if not job_ids:
        return []
    cp = subprocess.run(["squeue", "-h", "-j", ",".join(sorted(job_ids)), "-o", "%i %T"], capture_output=True,
                        text=True, timeout=30)
    lines = [ln for ln in cp.stdout.splitlines() if ln.strip()]
    return [ln for ln in lines if ln.split()[1] not in ("COMPLETED", "CANCELLED", "FAILED", "TIMEOUT",
                                                        "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY", "BOOT_FAIL",
                                                        "DEADLINE")]


def _teardown_and_check(session: Session, ctx: Ctx | None, res: Result) -> None:
    ids = set(ctx.job_ids) if ctx else set()
    try:
        session.teardown()
    except Exception as e:  # noqa: BLE001 - teardown must not raise: an invariant
        res.failures.append(f"teardown raised {type(e).__name__}: {e}")
    if ctx is not None:
        ids |= ctx.job_ids
    # Slurm: nothing of the session still active (it may take a KillWait to end).
    if not _wait(lambda: not _squeue(ids), timeout=90, step=1.0):
        res.jobs_left = _squeue(ids)
        res.failures.append(f"jobs left after teardown: {res.jobs_left}")
        subprocess.run(["scancel", *sorted(ids)], check=False, capture_output=True, timeout=30)
    # Nodes: no agent, Ray or driver process of the session's jobs.
    since = ctx.t_start if ctx else 0.0
    if not _wait(lambda: not lab_ops.session_processes(ids, since), timeout=60, step=1.0):
        left = lab_ops.session_processes(ids, since)
        res.procs_left = [f"{p.kind}@{p.node} pid {p.pid} job {p.job}" for p in left]
        res.failures.append(f"processes left after teardown: {res.procs_left}")
        for p in left:  # ours by job id: end them so the next scenario starts clean
            try:
                os.kill(p.pid, 9)
            except OSError:
                pass
