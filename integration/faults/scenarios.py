"""The fault matrix: every scenario, its fault, and what the session must have said during it.

Layout of every scenario (``harness``): a separate CPU head on partition
``cpu`` (node cpu-1) and two worker allocations with 2 CPUs each on
``gpu-a`` (gpua-1) and ``gpu-b`` (gpub-1). Faults aimed at "a worker" hit the
gpu-b one, so the gpu-a one is there to carry the run (and to be elected).
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

from . import lab_ops
from .harness import HEAD, Ctx, Scenario, _wait

NET_CUT_SECONDS = 20.0


# ------------------------------------------------------------ what status must have shown
def _saw_node_not_joined(ctx: Ctx, job: str) -> str | None:
    for st in ctx.status_seen:
        for row in st.get("jobs", []):
            if row["job_id"] != job:
                continue
            if row["state"] != "RUNNING":
                return None
            if any((n.get("node_state") or n.get("agent_state")) != "JOINED" for n in row.get("nodes", [])):
                return None
    if any(j == job and s != "JOINED" for j, _, s in ctx.node_states_seen):
        return None
    return f"no status sample showed job {job} or its node as anything but RUNNING/JOINED"


def _saw_head_lost(ctx: Ctx, old_head: str) -> str | None:
    for st in ctx.status_seen:
        if st["head"]["job_id"] == old_head and st["head"]["heartbeat"] in ("silent", "job ended"):
            return None
        if st["head"]["job_id"] != old_head:
            for row in st.get("jobs", []):
                if row["job_id"] == old_head and row["role"] in ("head (replaced)", "worker (was head)"):
                    return None
    return f"no status sample showed head {old_head} lost or replaced"


def _saw_no_head_can_be_had(ctx: Ctx) -> str | None:
    """A status sample (the last one is taken after the payload loop ended) said that no head
    can be had, with the reason."""
    if any((st["head"].get("election_failed") or {}).get("reason") for st in ctx.status_seen):
        return None
    return "no status sample said that no head can be had"


def _worker_b(ctx: Ctx) -> tuple[str, str]:
    job = ctx.worker_jobs[1]
    return job, ctx.worker_nodes[job]


def _agent_status(ctx: Ctx, node: str, job: str) -> None:
    cp = lab_ops.on_node(node, [sys.executable, "-m", "elastic_ray.agent", "status", "--job", job])
    text = (cp.stdout or cp.stderr).strip()
    ctx.agent_status_seen.append(f"{node}$ elastic-agent status --job {job}\n{text}")
    ctx.event(f"elastic-agent status on {node}: {' | '.join(text.splitlines()[1:3])[:200]}")


# ------------------------------------------------------------ family 1: processes
def _kill_on_worker(ctx: Ctx, kind: str, settle: float) -> None:
    """kill -9 the worker's ``kind`` process, then ask its node's agent status ``settle`` s later."""
    job, node = _worker_b(ctx)
    ctx.fault_now(f"kill -9 {kind} of worker {job} on {node}")
    p = lab_ops.kill_one({job}, kind, node, since=ctx.t_start)
    ctx.event(f"killed {kind} pid {p.pid}")
    time.sleep(settle)
    _agent_status(ctx, node, job)


def kill_worker_raylet(ctx: Ctx) -> None:
    _kill_on_worker(ctx, "raylet", 2.0)


def kill_worker_agent(ctx: Ctx) -> None:
    _kill_on_worker(ctx, "agent", 3.0)


def kill_head_agent(ctx: Ctx) -> None:
    ctx.fault_now(f"kill -9 agent of head {ctx.head_job}")
    p = lab_ops.kill_one({ctx.head_job}, "agent", since=ctx.t_start)
    ctx.event(f"killed head agent pid {p.pid} on {p.node}")


def kill_head_gcs(ctx: Ctx) -> None:
    ctx.fault_now(f"kill -9 gcs_server of head {ctx.head_job}")
    p = lab_ops.kill_one({ctx.head_job}, "gcs", since=ctx.t_start)
    ctx.event(f"killed gcs_server pid {p.pid} on {p.node}")


# ------------------------------------------------------------ family 2: a node lost
def kill_worker_slurmd(ctx: Ctx) -> None:
    job, node = _worker_b(ctx)
    ctx.fault_now(f"kill -9 slurmd on {node} (worker {job})")
    lab_ops.kill_slurmd(node)
    ctx.cleanup.append(lambda: (lab_ops.repair_lab(), lab_ops.wait_node_ready(node)))
    # Slurm declares the node down after SlurmdTimeout (20 s on the lab) and requeues the job.
    end = time.monotonic() + 60
    while time.monotonic() < end and not lab_ops.node_states().get(node, "").startswith("down"):
        time.sleep(1.0)
    ctx.event(f"Slurm says {node} is {lab_ops.node_states().get(node)}")
    time.sleep(15.0)  # the agent's turn to notice that its job does not run there any more
    procs = [p for p in lab_ops.session_processes({job}, ctx.t_start) if p.node == node]
    ctx.event(f"processes of job {job} still on {node}: {[f'{p.kind}:{p.pid}' for p in procs]}")
    lab_ops.repair_lab()
    ctx.event(f"slurmd restarted on {node}")
    _agent_status(ctx, node, job)


def cut_worker_network(ctx: Ctx) -> None:
    job, node = _worker_b(ctx)
    ctx.fault_now(f"link down on {node}'s veth for {NET_CUT_SECONDS:.0f}s (worker {job})")
    lab_ops.link(node, False)
    ctx.cleanup.append(lambda: lab_ops.link(node, True))
    time.sleep(NET_CUT_SECONDS)
    lab_ops.link(node, True)
    ctx.event(f"link up on {node}")
    time.sleep(3.0)
    _agent_status(ctx, node, job)


def cut_worker_network_for_good(ctx: Ctx) -> None:
    """The link goes down and stays down while the run lasts (restored only
    by the harness's clean-up, after the payload loop ended)."""
    job, node = _worker_b(ctx)
    ctx.fault_now(f"link down on {node}'s veth, not restored while the run lasts (worker {job})")
    lab_ops.link(node, False)
    ctx.cleanup.append(lambda: lab_ops.restore_node(node))
    # Slurm's word on it (SlurmdTimeout): the node down, its job ended or requeued.
    end = time.monotonic() + 90
    while time.monotonic() < end and not lab_ops.node_states().get(node, "").startswith("down"):
        time.sleep(1.0)
    ctx.event(f"Slurm says {node} is {lab_ops.node_states().get(node)}; "
              f"job {job} {getattr(ctx.session.job_info(job), 'state', None)}")


# ------------------------------------------------------------ family 3: the head job
def cancel_head(ctx: Ctx) -> None:
    ctx.fault_now(f"scancel head {ctx.head_job}")
    subprocess.run(["scancel", ctx.head_job], check=True, timeout=30)


def _head_walltime(ctx: Ctx) -> None:
    """No injection: the head's own time limit is the fault; mark when Slurm ends it."""
    info = ctx.session.job_info(ctx.head_job)
    ctx.event(f"head {ctx.head_job} {info.state.value if info else '?'}, waiting for its walltime")
    end = time.monotonic() + 400
    seen_drain = False
    while time.monotonic() < end:
        obs = ctx.session.observe_head(wait=0.0)
        if obs.job == ctx.head_job and obs.draining and not seen_drain:
            seen_drain = True
            ctx.fault_now(f"head {ctx.head_job} drains before its walltime")
        info = ctx.session.job_info(ctx.head_job)
        if info is None or not info.state.is_active:
            if ctx.t_fault is None:
                ctx.fault_now(f"head {ctx.head_job} ended at its walltime ({info.state.value if info else '?'})")
            else:
                ctx.event(f"head {ctx.head_job} ended: {info.state.value if info else '?'}")
            return
        time.sleep(0.5)
    raise TimeoutError(f"head {ctx.head_job} did not reach its walltime")


# ------------------------------------------------------------ family 4: elections
def _elector_code(path: Path, wait_for_go: bool = False) -> str:
    """A process that calls replace_head() on the session; with ``wait_for_go`` it first says
    "ready" (Python started, the session open) and waits for a line on stdin."""
    go = "print('ready', flush=True); sys.stdin.readline();" if wait_for_go else ""
    return ("import sys, json; from elastic_ray import Session;"
            f"s = Session.open({str(path)!r}, supervise=False);" + go +
            "h = s.replace_head(timeout=300); print(json.dumps(h.job_id))")


def _claimed_by(ctx: Ctx, pid: int) -> bool:
    """The session's election claim is held by process ``pid`` (a damaged record: not yet)."""
    try:
        claim = ctx.session.record().election
    except Exception:  # noqa: BLE001 - the record may be mid-write or damaged by another scenario
        return False
    return claim is not None and f":{pid}:" in claim.claimant


def killed_elector(ctx: Ctx) -> None:
    """scancel the head, start an elector and SIGKILL it once it holds the claim; three more race.

    The doomed elector is started (and its session opened) before the scancel, and the payload
    loop's own replace_head() waits until it held the claim (``Ctx.loop_may_elect``): a Python
    started after the scancel lost that race to the loop on a loaded machine (streak, 2026-12-07:
    the loop elected first and the doomed one never held the claim). The loop then races the
    three others for the election the killed one left behind."""
    doomed = subprocess.Popen([sys.executable, "-c", _elector_code(ctx.session.path, wait_for_go=True)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    ctx.cleanup.append(lambda: doomed.poll() is None and doomed.kill())
    assert doomed.stdout is not None and doomed.stdin is not None
    if doomed.stdout.readline().strip() != "ready":
        raise RuntimeError(f"the doomed elector did not start (exit {doomed.wait(timeout=30)})")
    ctx.loop_may_elect.clear()
    try:
        ctx.fault_now(f"scancel head {ctx.head_job}; an elector is killed holding the claim")
        subprocess.run(["scancel", ctx.head_job], check=True, timeout=30)
        doomed.stdin.write("go\n")
        doomed.stdin.flush()
        held = _wait(lambda: _claimed_by(ctx, doomed.pid), timeout=60, step=0.02)
        doomed.send_signal(signal.SIGKILL)
        doomed.wait()
    finally:
        ctx.loop_may_elect.set()
    ctx.event(f"elector pid {doomed.pid} killed {'holding the claim' if held else 'before it took the claim'}")
    if not held:
        raise RuntimeError("the doomed elector never held the claim")
    _race(ctx, 3)


def _race(ctx: Ctx, n: int) -> None:
    procs = [subprocess.Popen([sys.executable, "-c", _elector_code(ctx.session.path)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(n)]
    for p in procs:
        ctx.cleanup.append(lambda p=p: p.poll() is None and p.kill())
    answers = []
    for p in procs:
        out, err = p.communicate(timeout=360)
        answers.append(out.strip() or f"rc {p.returncode}: {err.strip()[-200:]}")
    heads = set(answers)
    ctx.event(f"{n} concurrent replace_head() returned {sorted(heads)}")
    if len(heads) != 1 or not all(a.startswith('"') for a in answers):
        raise RuntimeError(f"{n} electors disagreed or failed: {answers}")
    ctx.extra_jobs.update(a.strip('"') for a in answers)


def sixteen_electors(ctx: Ctx) -> None:
    ctx.fault_now(f"scancel head {ctx.head_job}; 16 processes call replace_head()")
    subprocess.run(["scancel", ctx.head_job], check=True, timeout=30)
    _race(ctx, 16)


# ------------------------------------------------------------ family 5: the scheduler
def restart_slurmctld(ctx: Ctx) -> None:
    ctx.fault_now("kill -9 slurmctld; restarted 20 s later")
    lab_ops.kill_slurmctld()
    ctx.cleanup.append(lab_ops.repair_lab)
    time.sleep(20.0)
    lab_ops.repair_lab()
    ctx.event("slurmctld restarted")


SCHEDULER_DOWN_SECONDS = 300.0


def slurmctld_down_for_long(ctx: Ctx) -> None:
    """slurmctld gone for 5 minutes: longer than an election claim (120 s) and
    many supervise periods (30 s). The payload runs on meanwhile (Ray does not
    need Slurm); nobody may release, resubmit or elect on a missing answer."""
    ctx.fault_now(f"kill -9 slurmctld; restarted {SCHEDULER_DOWN_SECONDS:.0f} s later")
    lab_ops.kill_slurmctld()
    ctx.cleanup.append(lab_ops.repair_lab)
    time.sleep(SCHEDULER_DOWN_SECONDS)
    lab_ops.repair_lab()
    ctx.event("slurmctld restarted")


def _nothing_acted_while_down(ctx: Ctx) -> str | None:
    """While slurmctld was away nobody elected, submitted, resubmitted or let a node go: a
    missing answer is not a lost job (the session's own event log, and the agents' states)."""
    from elastic_ray.protocol.disk import event_log
    from elastic_ray.protocol.disk.events import EventKind

    if ctx.t_fault is None:
        return "the fault was never injected"
    back = next((t for t, text in ctx.events if text == "slurmctld restarted"), ctx.t_fault + SCHEDULER_DOWN_SECONDS)
    acted = [f"{e.kind.value} {e.job or ''}".strip() for e in event_log.read(ctx.session.path, since=ctx.t_fault).events
             if e.at <= back and e.kind in (EventKind.ELECTION_STARTED, EventKind.SUBMITTED, EventKind.RESUBMITTED,
                                             EventKind.NODE_LEFT)]
    if acted:
        return f"while slurmctld was down: {', '.join(acted)}"
    return _saw_scheduler_unreachable(ctx)


def _saw_scheduler_unreachable(ctx: Ctx) -> str | None:
    """`session status` said that Slurm did not answer (or showed an old answer), never a wrong state."""
    for _, text in ctx.events:
        if text.startswith("session status exited") and ("slurm" in text.lower() or "scheduler" in text.lower()):
            return None
    for st in ctx.status_seen:
        age = st.get("scheduler_answer_age")
        if age is not None and age > 30:
            return None
    return "no status sample said that the scheduler did not answer"


# ------------------------------------------------------------ family 6: the session directory
def truncate_allocation_then_cancel_head(ctx: Ctx) -> None:
    path = ctx.session.path / "allocation.json"
    ctx.fault_now(f"truncate {path.name} to 10 bytes, then scancel head {ctx.head_job}")
    data = path.read_bytes()
    path.write_bytes(data[:10])
    subprocess.run(["scancel", ctx.head_job], check=True, timeout=30)


def garbage_pointer(ctx: Ctx) -> None:
    path = ctx.session.path / "ray_head"
    ctx.fault_now("ray_head replaced by garbage for 10 s")
    good = path.read_bytes()
    path.write_bytes(b"\x00garbage\xff not a job id\n")
    time.sleep(10.0)
    if path.read_bytes() != good:
        ctx.event("ray_head still garbage after 10 s; the harness puts it back")
        path.write_bytes(good)
    else:
        ctx.event("ray_head was repaired by the session/agents")


def fill_filesystem(ctx: Ctx) -> None:
    fs = getattr(ctx, "loopfs")
    ctx.fault_now("the session directory's filesystem full for 8 s")
    fs.fill()
    time.sleep(8.0)
    fs.free()
    ctx.event("space freed")


@contextmanager
def _loop_fs(base: Path):
    fs = lab_ops.LoopFs(base / "loopfs", size_mb=64)
    with fs:
        _LOOPFS[0] = fs
        yield fs.where
    _LOOPFS[0] = None


_LOOPFS: list = [None]


def _fill_with_current(ctx: Ctx) -> None:
    ctx.loopfs = _LOOPFS[0]  # type: ignore[attr-defined]
    fill_filesystem(ctx)


# ------------------------------------------------------------ family 7: two at once
def worker_lost_while_head_moves(ctx: Ctx) -> None:
    job, node = _worker_b(ctx)
    ctx.fault_now(f"link down on {node} (worker {job}) and scancel head {ctx.head_job} at once")
    lab_ops.link(node, False)
    ctx.cleanup.append(lambda: lab_ops.link(node, True))
    subprocess.run(["scancel", ctx.head_job], check=True, timeout=30)
    time.sleep(NET_CUT_SECONDS)
    lab_ops.link(node, True)
    ctx.event(f"link up on {node}")


QUEUES = ("cpu", "gpu-a", "gpu-b")


def lose_head_and_last_worker_with_no_queue(ctx: Ctx) -> None:
    """Worker b cancelled; then, every partition closed to new jobs, worker a
    (the last) and the head cancelled at once. No head, no worker, no queue:
    replace_head() must raise naming that, and the run fail with it."""
    a, b = ctx.worker_jobs
    subprocess.run(["scancel", b], check=True, timeout=30)
    if not _wait_ended(ctx, b, 60):
        raise RuntimeError(f"worker {b} did not end within 60 s of its scancel")
    ctx.event(f"worker {b} ended; closing the queues {', '.join(QUEUES)}")
    for partition in QUEUES:
        lab_ops.partition_state(partition, "INACTIVE")
        ctx.cleanup.append(lambda p=partition: lab_ops.partition_state(p, "UP"))
    ctx.fault_now(f"scancel the last worker {a} and the head {ctx.head_job} at once, no queue open")
    subprocess.run(["scancel", a, ctx.head_job], check=True, timeout=30)


def _wait_ended(ctx: Ctx, job: str, timeout: float) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        info = ctx.session.job_info(job)
        if info is None or not info.state.is_active:
            return True
        time.sleep(0.5)
    return False


def _failed_at_once(limit: float):
    """The payload loop ended with an error within ``limit`` s of the fault (replace_head() did not hang)."""
    def check(ctx: Ctx) -> str | None:
        ended = [t for t, text in ctx.events if text.startswith("payload loop ended with")]
        if ctx.t_fault is None or not ended:
            return "the payload loop did not end with an error"
        took = ended[0] - ctx.t_fault
        return None if took <= limit else f"the payload loop failed {took:.0f} s after the fault (limit {limit:.0f} s)"
    return check


def lose_standby_node_then_head(ctx: Ctx) -> None:
    """The warm standby's node cut off the network, the head cancelled 1 s later:
    the election may still pick the standby's allocation (Slurm says RUNNING),
    its head must fail there and the next election take the other one."""
    from elastic_ray.protocol.disk.records import HostedHeadState

    def standby_on() -> tuple[str, str] | None:
        for job in ctx.worker_jobs:
            for st in ctx.session.node_states(job).values():
                if st.hosted_head is not None and st.hosted_head.state is HostedHeadState.STANDBY:
                    return job, st.node
        return None

    end = time.monotonic() + 120
    found = standby_on()
    while found is None and time.monotonic() < end:
        time.sleep(0.5)
        found = standby_on()
    if found is None:
        raise RuntimeError("no warm standby head within 120 s")
    job, node = found
    ctx.event(f"standby head on {node} (worker {job})")
    ctx.fault_now(f"link down on {node} (the standby's, worker {job}); scancel head {ctx.head_job} 1 s later")
    lab_ops.link(node, False)
    ctx.cleanup.append(lambda: lab_ops.restore_node(node))
    time.sleep(1.0)
    subprocess.run(["scancel", ctx.head_job], check=True, timeout=30)


def _b(fn):
    return lambda ctx: fn(ctx, ctx.worker_jobs[1])


def _head(fn):
    return lambda ctx: fn(ctx, ctx.head_job)


def _fault_before_the_end(ctx: Ctx) -> str | None:
    """The fault came while the payload still ran (else the scenario tested nothing)."""
    done = next((t for t, text in ctx.events if text.startswith("payload finished")), None)
    if ctx.t_fault is not None and done is not None and done <= ctx.t_fault:
        return f"the payload had finished {ctx.t_fault - done:.0f} s before the fault"
    return None


def _all(*checks):
    """Every check holds; the first complaint otherwise."""
    return lambda ctx: next((problem for check in checks if (problem := check(ctx)) is not None), None)


SHORT_HEAD = replace(HEAD, time_limit="3")

SCENARIOS: list[Scenario] = [
    Scenario("worker-raylet-kill", "process", "kill -9 of a worker's raylet", kill_worker_raylet,
             status_check=_b(_saw_node_not_joined)),
    Scenario("worker-agent-kill", "process", "kill -9 of a worker's agent (its allocation resubmitted)",
             kill_worker_agent, keep_capacity=True,
             status_check=_b(_saw_node_not_joined)),
    Scenario("head-agent-kill", "process", "kill -9 of the head's agent", kill_head_agent,
             status_check=_head(_saw_head_lost)),
    Scenario("head-gcs-kill", "process", "kill -9 of the head's GCS", kill_head_gcs,
             status_check=_head(_saw_head_lost)),
    Scenario("worker-slurmd-kill", "node", "a worker node's slurmd killed (node down, job requeued)",
             kill_worker_slurmd, status_check=_b(_saw_node_not_joined)),
    Scenario("worker-network-cut", "node", f"a worker node's network cut for {NET_CUT_SECONDS:.0f} s",
             cut_worker_network, ci=True, status_check=_b(_saw_node_not_joined)),
    Scenario("worker-network-never", "node", "a worker node cut off the network for good",
             cut_worker_network_for_good, status_check=_b(_saw_node_not_joined)),
    Scenario("head-cancel", "head", "the head job cancelled mid-payload", cancel_head,
             status_check=_head(_saw_head_lost)),
    Scenario("head-walltime", "head", "the head job reaching its walltime, no signal", _head_walltime,
             head=SHORT_HEAD, agent_env={"ELASTIC_AGENT_HEAD_DRAIN_LEAD": "60"}, timeout=420, units=1000,
             status_check=_head(_saw_head_lost)),
    Scenario("head-walltime-signal", "head", "the head job reaching its walltime, signal 90 s before",
             _head_walltime, head=replace(SHORT_HEAD, signal_before_timeout="TERM@90"), timeout=420, units=700,
             status_check=_head(_saw_head_lost)),
    Scenario("elector-killed", "election", "the elector killed holding the claim, 3 others call replace_head()",
             killed_elector, ci=True),
    Scenario("sixteen-electors", "election", "16 processes call replace_head() while the head is lost",
             sixteen_electors),
    Scenario("slurmctld-restart", "scheduler", "slurmctld killed and restarted 20 s later", restart_slurmctld,
             ci=True),
    Scenario("slurmctld-down-5min", "scheduler", f"slurmctld down for {SCHEDULER_DOWN_SECONDS / 60:.0f} minutes",
             slurmctld_down_for_long, units=3000, timeout=900, supervise=True,
             status_check=_nothing_acted_while_down),
    Scenario("allocation-truncated", "session-dir", "allocation.json truncated, then the head cancelled",
             truncate_allocation_then_cancel_head),
    Scenario("pointer-garbage", "session-dir", "the ray_head pointer replaced by garbage for 10 s",
             garbage_pointer),
    Scenario("filesystem-full", "session-dir", "the session directory's filesystem full for 8 s",
             _fill_with_current, workdir_factory=_loop_fs),
    Scenario("worker-lost-head-moves", "combined", "a worker's network cut while the head is cancelled",
             worker_lost_while_head_moves, status_check=_head(_saw_head_lost)),
    Scenario("head-and-last-worker-no-queue", "combined",
             "the head and the last worker allocation lost, every queue closed", lose_head_and_last_worker_with_no_queue,
             expect_failure="no head can be had",
             status_check=_all(_failed_at_once(60.0), _head(_saw_head_lost), _saw_no_head_can_be_had)),
    Scenario("standby-node-then-head", "combined", "the warm standby's node cut off, the head cancelled 1 s later",
             lose_standby_node_then_head, supervise=True, units=1200,
             status_check=_all(_fault_before_the_end, _head(_saw_head_lost))),
]

BY_NAME = {s.name: s for s in SCENARIOS}
