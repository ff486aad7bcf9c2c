"""Head failover on the real Slurm lab: the bare-Slurm floor against our Session.

Prints figures and a table; asserts nothing. Run it as

    export SLURM_CONF=/work/main/.lab/etc/slurm.conf
    python3 integration/lab up 4            # idempotent
    .venv/bin/python bench/bench_failover.py

(``BENCH_FAILOVER_RUNS`` sets the number of runs, default 3.)

Each run does two things one after the other, so both see the same lab:

FLOOR: bare ``sbatch`` + ``ray start`` driven by an oracle that knows everything
at once. A head job (cpu) runs ``ray start --head --block``; a worker job
(gpu-a) runs a small bash loop that watches an address file on the shared
filesystem and, whenever it changes, SIGKILLs the previous ``ray start``
(its own session, started with setsid) and starts ``ray start --address=<file>
--block``. Measured:

* join: ``sbatch`` of the worker (the file already names the live head A)
  until the worker is ALIVE in A's GCS;
* head move with rejoin: t0 = ``scancel`` of head A, and at t0 ``sbatch`` of
  head B; as soon as B's GCS port accepts a TCP connection the oracle writes
  B's address into the file; stop when the worker is ALIVE in B's GCS.

OURS: ``Session.create(scheduler="slurm", supervise=True)`` with a head on
cpu and one worker allocation on gpu-a. The session's own supervisor (a
thread of this process, default interval 30 s) is the only thing watching;
nobody calls ``replace_head``. t0 = ``scancel`` of the head job. Measured:

* (a) noticed: the supervisor's first ``head_draining`` / ``head_lost`` event;
* (b) new head ready: ``record().head_job`` changed and ``session.head`` (from
  a second, non-supervising Session on the same directory) names it;
* (c) all workers rejoined: every node state of the worker allocation is
  JOINED with ``head_job`` == the new head, and the node is ALIVE in the new
  GCS (``elastic_ray.agent.node.gcs.list_nodes``).

"ALIVE in the GCS" is polled with ``gcs.list_nodes`` (a probe process, about
1 s of CPU each, so polls are 0.5 s apart). Besides the time the poll saw the
node ("seen"), the node's own ``start_time_ms`` from the GCS is reported
("reg."): the raylet sets it just before it registers, so it does not depend
on the poll. All lab nodes share the host's clock.

Every job is cancelled in ``finally`` blocks (floor jobs by id, sessions by
``teardown()``), and the bench waits until squeue lists none of them. Scripts,
session directories and logs stay under
``.lab/test-work/bench-failover/<bench id>/`` for inspection.
"""

from __future__ import annotations

import logging
import os
import re
import shlex
import socket
import statistics
import subprocess
import sys
import threading
import time
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from elastic_ray import Session, SlurmRunAllocationConfig, SlurmWorkerAllocationConfig  # noqa: E402
from elastic_ray import polling  # noqa: E402
from elastic_ray.agent.node import gcs  # noqa: E402
from elastic_ray.config.launcher import RayLauncher  # noqa: E402
from elastic_ray.protocol.disk import paths  # noqa: E402

RUNS = int(os.environ.get("BENCH_FAILOVER_RUNS", "3"))
WORK = REPO / ".lab" / "test-work" / "bench-failover"
PYTHON = REPO / ".venv" / "bin" / "python"
RAY = REPO / ".venv" / "bin" / "ray"
SLURM_CONF = REPO / ".lab" / "etc" / "slurm.conf"

HEAD = SlurmRunAllocationConfig(partition="cpu", time_limit="30", mem="1G", cpus_per_task=1)
WORKER = SlurmWorkerAllocationConfig(partition="gpu-a", num_nodes=1, cpus_per_task=2, mem="1G", time_limit="20")
OBJECT_STORE = 100_000_000

START_TIMEOUT = 120.0      # a job to start and its Ray to answer
MOVE_TIMEOUT = 150.0       # head loss to rejoin
GCS_POLL_GAP = 0.5         # between two list_nodes probes
SETTLE = 3.0               # quiet time after a node joined, before the next measurement
RAY_STARTED = "Ray runtime started."
PUBLISHED = {"head lost -> replace_head() returned": 14.9, "head lost -> all workers rejoined": 44.7}
TARGET_NOTICE = 2.0
TARGET_RATIO = 1.3

_floor_jobs: list[str] = []          # every floor job id, scancelled in finally
_sessions: list[Session] = []        # every session, torn down in finally


# ---------------------------------------------------------------- small helpers

def say(text: str = "") -> None:
    print(text, flush=True)


def fmt(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def run(argv: list[str], timeout: float = 30.0) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)


def sbatch(script: Path, *, name: str, partition: str, cpus: int, output: Path) -> str:
    out = run(["sbatch", "--parsable", f"--job-name={name}", f"--partition={partition}",
               f"--cpus-per-task={cpus}", "--mem=1G", "--time=30", f"--output={output}", str(script)])
    if out.returncode != 0:
        raise RuntimeError(f"sbatch {script}: {out.stderr.strip()}")
    job = out.stdout.strip().split(";")[0]
    _floor_jobs.append(job)
    return job


def scancel(job_ids: list[str]) -> None:
    if job_ids:
        run(["scancel", *job_ids])


def active_jobs(name: str) -> list[str]:
    """Pending, running or completing jobs of this name ("id STATE")."""
    out = run(["squeue", "-h", f"--name={name}", "-o", "%i %T"])
    return [line for line in out.stdout.splitlines() if line.strip()]


def job_node(job: str) -> str:
    out = run(["squeue", "-h", "-j", job, "-o", "%N"])
    return out.stdout.strip()


def wait_gone(name: str, timeout: float = 90.0) -> float:
    t = time.time()
    while active_jobs(name) and time.time() - t < timeout:
        time.sleep(0.5)
    left = active_jobs(name)
    if left:
        say(f"  ! still listed after {timeout:.0f}s: {left}")
    return time.time() - t


def wait_for(cond: Callable[[], Any], timeout: float, interval: float = 0.05) -> Any:
    """``cond``'s first truthy value, or None after ``timeout`` (the bench reports, never fails)."""
    return polling.wait_for(cond, timeout=timeout, interval=interval, raising=False)


def tcp_open(address: str) -> bool:
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=0.5):
            return True
    except OSError:
        return False


def read_text(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text + "\n")
    os.replace(tmp, path)


def poll_worker_alive(address: str, worker_job: str, deadline: float) -> tuple[float, gcs.NodeRecord] | None:
    """(time the poll saw it, node) once a non-head node of ``worker_job`` is ALIVE in ``address``'s GCS."""
    while time.time() < deadline:
        try:
            nodes = gcs.list_nodes(address, timeout=10)
        except gcs.ProbeError:
            nodes = []
        hits = [n for n in nodes if n.alive and not n.is_head_node and n.labels.get("slurm.job-id") == worker_job]
        if hits:
            return time.time(), max(hits, key=lambda n: n.start_time_ms)
        time.sleep(GCS_POLL_GAP)
    return None


# ---------------------------------------------------------------- the floor

FREE_PORTS = ("/usr/bin/python3 -c 'import socket,sys\n"
              "s=[socket.socket() for _ in range(int(sys.argv[1]))]\n"
              "[x.bind((\"\",0)) for x in s]\n"
              "print(*[x.getsockname()[1] for x in s])' ")

HEAD_SCRIPT = """#!/bin/bash
# Floor head: plain ray start --head, address published on the shared FS first.
set -u
unset RAY_ADDRESS
D={dir}
IP=$(getent hosts "${{SLURMD_NODENAME:-$(hostname)}}" | awk 'NR==1{{print $1}}')
read -r GCS CLIENT DASH AGENT AMETRIC DMETRIC < <({free_ports} 6)
T=/tmp/bf/h$SLURM_JOB_ID
rm -rf "$T"; mkdir -p "$T"
export RAY_USAGE_STATS_ENABLED=0 RAY_AUTH_MODE=disabled RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S=0
export AUTOSCALER_METRIC_PORT=$AMETRIC DASHBOARD_METRIC_PORT=$DMETRIC
echo "$IP:$GCS" > "$D/head-$SLURM_JOB_ID.addr.tmp" && mv "$D/head-$SLURM_JOB_ID.addr.tmp" "$D/head-$SLURM_JOB_ID.addr"
echo "$(date +%s.%N) ray start --head on $IP:$GCS"
{ray} start --head --block --num-cpus=0 --num-gpus=0 --include-dashboard=false \\
    --node-ip-address="$IP" --port="$GCS" --ray-client-server-port="$CLIENT" --dashboard-port="$DASH" \\
    --dashboard-agent-listen-port="$AGENT" --min-worker-port=0 --max-worker-port=0 \\
    --object-store-memory={object_store} --memory=1073741824 --temp-dir="$T" \\
    --disable-usage-stats --log-color=false &
pid=$!
trap 'kill -TERM $pid 2>/dev/null' TERM INT
wait $pid; wait $pid
rm -rf "$T"
"""

WORKER_SCRIPT = """#!/bin/bash
# Floor worker: (re)start `ray start --address=$(cat FILE) --block` whenever FILE changes.
set -u
unset RAY_ADDRESS
D={dir}
F=$D/worker.addr
IP=$(getent hosts "${{SLURMD_NODENAME:-$(hostname)}}" | awk 'NR==1{{print $1}}')
export RAY_USAGE_STATS_ENABLED=0 RAY_AUTH_MODE=disabled RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S=0
export RAY_gcs_rpc_server_reconnect_timeout_s=10 RAY_gcs_server_port_wait_time_s=3
cur=""; sid=""; n=0
kill_session() {{
    # `setsid` made the previous ray start the leader of its own session:
    # every process Ray started for that node is in it.
    [ -n "$sid" ] || return 0
    kill -KILL -- "-$sid" 2>/dev/null
    for p in $(ps -eo pid=,sid= | awk -v s="$sid" '$2==s {{print $1}}'); do kill -KILL "$p" 2>/dev/null; done
}}
stop() {{ kill_session; rm -rf /tmp/bf/w$SLURM_JOB_ID.*; exit 0; }}
trap stop TERM INT
while :; do
    a=$(cat "$F" 2>/dev/null) || a=""
    if [ -n "$a" ] && [ "$a" != "$cur" ]; then
        kill_session
        n=$((n+1)); cur=$a
        T=/tmp/bf/w$SLURM_JOB_ID.$n; mkdir -p "$T"
        AGENT=$({free_ports} 1)
        echo "$(date +%s.%N) start $n -> $a" >> "$D/worker-events.log"
        setsid {ray} start --address="$a" --block --node-ip-address="$IP" --temp-dir="$T" \\
            --num-cpus=2 --num-gpus=0 --memory=1073741824 --object-store-memory={object_store} \\
            --labels=slurm.job-id=$SLURM_JOB_ID --min-worker-port=0 --max-worker-port=0 \\
            --dashboard-agent-listen-port="$AGENT" --disable-usage-stats --log-color=false \\
            > "$D/worker-ray-$n.log" 2>&1 &
        sid=$!
    fi
    sleep 0.1
done
"""


def floor_run(index: int, base: Path, name: str) -> dict[str, Any]:
    d = base / f"floor-{index}"
    d.mkdir(parents=True)
    values = dict(dir=shlex.quote(str(d)), ray=shlex.quote(str(RAY)), free_ports=FREE_PORTS,
                  object_store=OBJECT_STORE)
    head_sh, worker_sh = d / "head.sh", d / "worker.sh"
    head_sh.write_text(HEAD_SCRIPT.format(**values))
    worker_sh.write_text(WORKER_SCRIPT.format(**values))
    result: dict[str, Any] = {}
    jobs: list[str] = []
    try:
        head_a = sbatch(head_sh, name=name, partition="cpu", cpus=1, output=d / "head-%j.out")
        jobs.append(head_a)
        addr_a = wait_for(lambda: read_text(d / f"head-{head_a}.addr"), START_TIMEOUT)
        # A live head: its GCS answers and `ray start --head` has finished (as
        # for ours, whose head publishes its endpoint only then).
        if not addr_a or not wait_for(lambda: RAY_STARTED in read_text(d / f"head-{head_a}.out"), START_TIMEOUT,
                                      0.2) or gcs.gcs_ready(addr_a, timeout=20) is None:
            say(f"  floor {index}: head A {head_a} did not answer; skipped")
            return result
        time.sleep(SETTLE)
        write_atomic(d / "worker.addr", addr_a)

        # join: sbatch of the worker -> ALIVE in A's GCS
        t_sub = time.time()
        worker = sbatch(worker_sh, name=name, partition="gpu-a", cpus=2, output=d / "worker-%j.out")
        jobs.append(worker)
        seen = poll_worker_alive(addr_a, worker, t_sub + START_TIMEOUT)
        if seen is None:
            say(f"  floor {index}: worker {worker} never ALIVE in A; skipped")
            return result
        result["join_seen"] = seen[0] - t_sub
        result["join_reg"] = seen[1].start_time_ms / 1000 - t_sub
        wait_for(lambda: RAY_STARTED in read_text(d / "worker-ray-1.log"), 30, 0.2)
        time.sleep(SETTLE)

        # move: scancel A and sbatch B at t0; B's address goes to the file when its GCS answers
        a_node = job_node(head_a) or "?"
        t0 = time.time()
        scancel([head_a])
        head_b = sbatch(head_sh, name=name, partition="cpu", cpus=1, output=d / "head-%j.out")
        jobs.append(head_b)
        addr_b = wait_for(lambda: read_text(d / f"head-{head_b}.addr"), START_TIMEOUT, 0.02)
        if not addr_b or not wait_for(lambda: tcp_open(addr_b), START_TIMEOUT, 0.05):
            say(f"  floor {index}: head B {head_b} did not answer; skipped")
            return result
        t_b = time.time()
        write_atomic(d / "worker.addr", addr_b)
        seen = poll_worker_alive(addr_b, worker, t0 + MOVE_TIMEOUT)
        if seen is None:
            say(f"  floor {index}: worker never ALIVE in B; skipped")
            return result
        result.update(b_answers=t_b - t0, move_seen=seen[0] - t0, move_reg=seen[1].start_time_ms / 1000 - t0,
                      a_node=a_node, b_node=job_node(head_b) or "?")
        say(f"  floor {index}: join seen {fmt(result['join_seen'])}s (reg. {fmt(result['join_reg'])}s) | "
            f"move: B {head_b} answers {fmt(t_b - t0)}s, worker ALIVE in B seen {fmt(result['move_seen'])}s "
            f"(reg. {fmt(result['move_reg'])}s)")
        return result
    finally:
        scancel(jobs)


# ---------------------------------------------------------------- ours

LOG_LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) \w+ (.*)$")
KEEP_FIELDS = ("state", "previous", "reason", "kind", "seconds", "address", "head_job", "choice", "why",
               "graceful", "killed", "signal", "job_state", "lookup", "deadline_in", "error", "head", "job",
               "hosted_on_worker", "accepted", "last_beat_age")


def parse_log(path: Path, who: str) -> list[tuple[float, str, str, dict[str, str]]]:
    """(time, who, event, fields) for every ``event=`` line of a log."""
    out = []
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return out
    for line in lines:
        m = LOG_LINE.match(line)
        if not m or "event=" not in m.group(2):
            continue
        t = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
        try:
            tokens = shlex.split(m.group(2))
        except ValueError:
            tokens = m.group(2).split()
        fields = dict(tok.split("=", 1) for tok in tokens if "=" in tok)
        out.append((t, who, fields.pop("event", "?"), fields))
    return out


RAY_LOG_LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\s+\w+ .*? -- (Local node IP|Ray runtime started)")


def parse_ray_log(path: Path) -> list[tuple[float, str]]:
    """(time, "Local node IP" | "Ray runtime started") from one of the agent's `ray start` logs."""
    out = []
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return out
    for line in lines:
        m = RAY_LOG_LINE.match(line)
        if m:
            out.append((datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp(), m.group(2)))
    return out


def first(events, who: str | None, event: str, t_from: float, pred: Callable[[dict], bool] = lambda f: True):
    for t, w, e, f in events:
        if t >= t_from and e == event and (who is None or w == who) and pred(f):
            return t
    return None


class _CoordinatorLog:
    """The coordinator's log lines of one run, in the session directory."""

    def __init__(self, path: Path):
        self.handler = logging.FileHandler(path)
        self.handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
        self.logger = logging.getLogger("elastic_ray")
        self.logger.addHandler(self.handler)

    def close(self) -> None:
        self.logger.removeHandler(self.handler)
        self.handler.close()


def ours_run(index: int, base: Path) -> dict[str, Any]:
    path = base / f"ours-{index}"
    path.mkdir(parents=True)
    coord_log = _CoordinatorLog(path / "coordinator.log")
    result: dict[str, Any] = {}
    session: Session | None = None
    observer: Session | None = None
    try:
        t_create = time.time()
        session = Session.create(path / "session", scheduler="slurm", head=HEAD,
                                 launcher=RayLauncher(object_store_memory=OBJECT_STORE), supervise=True)
        _sessions.append(session)
        # Token auth is on: the GCS probes below inherit the session's settings.
        os.environ.update(session.ray_client_env())
        session.wait_for_head(timeout=START_TIMEOUT)
        t_head = time.time()
        worker = session.add_worker_allocation(WORKER)
        session.wait_for_worker_allocation(worker, timeout=START_TIMEOUT + 60)
        t_worker = time.time()
        observer = Session.open(session.path, supervise=False)
        old_head = session.record().head_job
        assert old_head is not None
        # The supervisor must have heard the head's heartbeat before it can
        # call it lost; the observer too.
        if not wait_for(lambda: session.observe_head().alive and observer.head is not None, 20, 0.2):
            say(f"  ours {index}: the head's heartbeat was never heard; skipped")
            return result
        time.sleep(SETTLE)
        say(f"  ours {index}: session {session.job_name}: head {old_head} ready {t_head - t_create:.1f}s after "
            f"create, worker {worker.job_id} joined {t_worker - t_head:.1f}s after add")

        t0 = time.time()
        scancel([old_head])
        new_head: str | None = None
        t_record = t_elected = t_joined = None
        alive: dict[str, Any] = {}
        poller: threading.Thread | None = None
        deadline = t0 + MOVE_TIMEOUT
        while time.time() < deadline:
            now = time.time()
            rec = session.record()
            if new_head is None and rec.head_job != old_head:
                new_head, t_record = rec.head_job, now
            if new_head is not None and t_elected is None:
                head = observer.head
                if head is not None and head.job_id == new_head:
                    t_elected = time.time()

                    def watch(address=head.address):
                        seen = poll_worker_alive(address, worker.job_id, deadline)
                        if seen is not None:
                            alive.update(seen=seen[0], reg=seen[1].start_time_ms / 1000, node_id=seen[1].node_id)

                    poller = threading.Thread(target=watch, daemon=True)
                    poller.start()
            if new_head is not None and t_joined is None:
                states = session.node_states(worker.job_id)
                if states and all(s.state.value == "JOINED" and s.head_job == new_head
                                  for s in states.values()):
                    t_joined = time.time()
                    result["joined_ids"] = sorted(s.node_id for s in states.values())
            if t_joined is not None and poller is not None and not poller.is_alive():
                break
            time.sleep(0.05)
        t_end = time.time()
        noticed = [(t, what) for t, what in (session.supervisor.noticed if session.supervisor else [])
                   if t >= t0]
        notice = next(((t, w) for t, w in noticed if w in ("head_draining", "head_lost")), None)
        ready_event = next((t for t, w in noticed if w == "head_ready"), None)
        result.update(
            old_head=old_head, new_head=new_head, worker=worker.job_id,
            noticed=None if notice is None else notice[0] - t0, noticed_what=notice[1] if notice else "-",
            record=None if t_record is None else t_record - t0,
            elected=None if t_elected is None else t_elected - t0,
            supervisor_ready=None if ready_event is None else ready_event - t0,
            joined=None if t_joined is None else t_joined - t0,
            alive_seen=alive["seen"] - t0 if "seen" in alive else None,
            alive_reg=alive["reg"] - t0 if "reg" in alive else None,
            alive_matches=alive.get("node_id") in result.get("joined_ids", []),
        )
        if t_joined is not None and "seen" in alive:
            result["rejoined"] = max(t_joined, alive["seen"]) - t0
        say(f"  ours {index}: (a) {result['noticed_what']} {fmt(result['noticed'])}s | "
            f"(b) head {new_head} elected: record {fmt(result['record'])}s, session.head {fmt(result['elected'])}s "
            f"(supervisor head_ready {fmt(result['supervisor_ready'])}s) | (c) JOINED {fmt(result['joined'])}s, "
            f"ALIVE in new GCS seen {fmt(result['alive_seen'])}s (reg. {fmt(result['alive_reg'])}s"
            f"{'' if result['alive_matches'] else ', node id differs from node_states!'})")
        result["timeline"] = timeline(session, path / "coordinator.log", t0, t_end, old_head, worker.job_id)
        return result
    except Exception as exc:  # report and go on with the next run
        say(f"  ours {index}: failed: {type(exc).__name__}: {exc}")
        return result
    finally:
        if observer is not None:
            observer.close()
        if session is not None:
            session.teardown()
            wait_gone(session.job_name)
        coord_log.close()


def timeline(session: Session, coord_path: Path, t0: float, t_end: float, old_head: str,
             worker_job: str) -> dict[str, Any]:
    """Where the time went, from the agents' and the coordinator's logs."""
    logs = sorted(paths.log_dir(session.path).iterdir())
    events = parse_log(coord_path, "coord")
    for p in logs:
        if (named := paths.parse_agent_log_name(p.name)) is None:
            continue
        job = named[0]
        who = "head" if job == old_head else ("worker" if job == worker_job else f"job{job}")
        events += parse_log(p, who)
    events.sort(key=lambda e: e[0])
    window = [e for e in events if t0 - 0.2 <= e[0] <= t_end + 2.0]
    lines = []
    for t, who, event, fields in window:
        if event in ("request",) and fields.get("kind") == "status":
            continue
        detail = " ".join(f"{k}={fields[k]}" for k in KEEP_FIELDS if k in fields and k != "job")
        lines.append(f"      {t - t0:+7.2f}s {who:<6} {event:<20} {detail[:150]}")
    w = lambda ev, who="worker", **kw: first(events, who, ev, t0, **kw)  # noqa: E731
    marks = {
        "head agent got SIGTERM": w("signal", "head"),
        "head agent drains (scheduler lookup done)": w("signal_drain", "head"),
        "head Ray stopped": w("ray_stopped", "head"),
        "election started (claim won, choice made)": first(events, "coord", "election", t0),
        "worker agent: host_head request": w("request", pred=lambda f: f.get("kind") == "host_head"),
        "worker agent: hosted head ready": w("hosted_head_ready"),
        "coordinator: pointer switched": first(events, "coord", "head_switched", t0),
        "worker agent: follow request (nudge)": w("request", pred=lambda f: f.get("kind") == "follow"),
        "worker agent: pointer read": w("head_pointer", pred=lambda f: f.get("head_job") == worker_job),
        "worker agent: leaves old head": w("state_changed", pred=lambda f: f.get("state") in
                                           ("WAITING_FOR_HEAD", "FOLLOWING", "STARTING")),
        "worker agent: old worker Ray stopped": w("ray_stopped"),
        "worker agent: starts worker Ray for new head": w("state_changed", pred=lambda f: f.get("state") in
                                                          ("FOLLOWING", "STARTING") and worker_job in
                                                          f.get("reason", "")),
        "worker agent: ray_joined (new head)": None,
        "worker agent: JOINED": None,
    }
    start = marks["worker agent: starts worker Ray for new head"] or t0
    marks["worker agent: ray_joined (new head)"] = first(events, "worker", "ray_joined", start)
    marks["worker agent: JOINED"] = first(events, "worker", "state_changed", start,
                                          lambda f: f.get("state") == "JOINED")
    # `ray start`'s own progress, from its logs (timestamps of Ray's CLI).
    ray_logs = [(p, named) for p in logs if (named := paths.parse_ray_log_name(p.name)) and named[0] == worker_job]
    hosted = [x for p, (_, _, role, on_host) in ray_logs if role == "head" and on_host for x in parse_ray_log(p)]
    rejoin = [x for p, (_, _, role, on_host) in ray_logs if role == "worker" and not on_host
              for x in parse_ray_log(p) if x[0] >= start]
    for label, entries in (("hosted head", hosted), ("worker Ray (new head)", rejoin)):
        for what in ("Local node IP", "Ray runtime started"):
            marks[f"{label}: ray start printed '{what}'"] = next((t for t, w in sorted(entries) if w == what), None)
    return {"lines": lines, "marks": {k: (None if v is None else v - t0) for k, v in marks.items()}}


# ---------------------------------------------------------------- main

def med(values: list[float | None]) -> tuple[float | None, list[float]]:
    got = [v for v in values if v is not None]
    return (statistics.median(got) if got else None), got


def main() -> int:
    os.environ.setdefault("SLURM_CONF", str(SLURM_CONF))
    os.environ.pop("RAY_ADDRESS", None)
    for key in [k for k in os.environ if k.startswith("ELASTIC_AGENT_")]:
        os.environ.pop(key)   # the agents' defaults (pointer poll 1 s, backoff base 2 s)
    logging.getLogger("elastic_ray").setLevel(logging.INFO)
    warn = logging.StreamHandler(sys.stderr)
    warn.setLevel(logging.WARNING)
    logging.getLogger().addHandler(warn)

    if run(["sinfo", "-h"]).returncode != 0:
        say("the Slurm lab is not up: run `python3 integration/lab up 4` first")
        return 1
    bench_id = time.strftime("%Y%m%d-%H%M%S") + "-" + uuid.uuid4().hex[:4]
    base = WORK / bench_id
    base.mkdir(parents=True)
    floor_name = f"bf-floor-{bench_id[-4:]}"
    say(f"bench_failover: {RUNS} run(s); work dir {base}")
    say(f"host: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}; other jobs on the lab now: "
        f"{len(run(['squeue', '-h']).stdout.splitlines())}")
    started = time.time()
    floors: list[dict[str, Any]] = []
    ours: list[dict[str, Any]] = []
    try:
        for i in range(1, RUNS + 1):
            say(f"run {i}/{RUNS} (load average {os.getloadavg()[0]:.2f})")
            try:
                floors.append(floor_run(i, base, floor_name))
            except Exception as exc:
                say(f"  floor {i}: failed: {type(exc).__name__}: {exc}")
                floors.append({})
            finally:
                scancel(_floor_jobs)
                wait_gone(floor_name)
            ours.append(ours_run(i, base))
    finally:
        scancel(_floor_jobs)
        for session in _sessions:
            try:
                session.teardown()
            except Exception as exc:
                say(f"teardown of {session.job_name} failed: {exc}")
        wait_gone(floor_name)
        for session in _sessions:
            wait_gone(session.job_name)

    # ------------------------------------------------------------ report
    for i, r in enumerate(ours, 1):
        tl = r.get("timeline")
        if not tl:
            continue
        say(f"\nours run {i}: where the time went (t0 = scancel of head {r.get('old_head')}; "
            f"new head {r.get('new_head')}, worker {r.get('worker')})")
        for name, t in tl["marks"].items():
            say(f"    {fmt(t, 2):>7}s  {name}")
        if i == 1 or os.environ.get("BENCH_FAILOVER_VERBOSE"):
            say("    log lines (agents and coordinator):")
            for line in tl["lines"]:
                say(line)

    def span(a: float | None, b: float | None) -> float | None:
        return None if a is None or b is None else b - a

    phase_rows: list[tuple[str, list[float | None]]] = [
        ("floor: t0 -> B's GCS port answers (sbatch, schedule, gcs_server up)", [f.get("b_answers") for f in floors]),
        ("floor: address written -> worker registered (reg.)",
         [span(f.get("b_answers"), f.get("move_reg")) for f in floors]),
    ]
    spans = [
        ("ours: t0 -> noticed", None, "noticed"),
        ("ours: noticed -> election started (query, claim, choice)", "noticed",
         "election started (claim won, choice made)"),
        ("ours: election -> hosted ray start printed 'Local node IP'", "election started (claim won, choice made)",
         "hosted head: ray start printed 'Local node IP'"),
        ("ours: ... -> hosted 'Ray runtime started'", "hosted head: ray start printed 'Local node IP'",
         "hosted head: ray start printed 'Ray runtime started'"),
        ("ours: ... -> hosted head ready (own-node probe, endpoint)",
         "hosted head: ray start printed 'Ray runtime started'", "worker agent: hosted head ready"),
        ("ours: hosted head ready -> pointer switched", "worker agent: hosted head ready",
         "coordinator: pointer switched"),
        ("ours: pointer switched -> worker agent starts Ray", "coordinator: pointer switched",
         "worker agent: starts worker Ray for new head"),
        ("ours: worker starts Ray -> registered in new GCS (reg.)", "worker agent: starts worker Ray for new head",
         "reg"),
        ("ours: registered -> JOINED (startup line + own-node probe)", "reg", "worker agent: JOINED"),
    ]
    for label, a, b in spans:
        values = []
        for o in ours:
            marks = dict((o.get("timeline") or {}).get("marks") or {})
            marks["noticed"] = o.get("noticed")
            marks["reg"] = o.get("alive_reg")
            values.append(span(0.0 if a is None else marks.get(a), marks.get(b)))
        phase_rows.append((label, values))
    say(f"\n{'where the time goes (critical path)':<68} {'median':>7}   samples")
    for label, values in phase_rows:
        m, got = med(values)
        say(f"{label:<68} {fmt(m):>7}   {', '.join(fmt(v) for v in got)}")

    rows = [
        ("floor: join (sbatch -> ALIVE, seen)", [f.get("join_seen") for f in floors]),
        ("floor: join (sbatch -> ALIVE, reg.)", [f.get("join_reg") for f in floors]),
        ("floor: head move, B's GCS answers", [f.get("b_answers") for f in floors]),
        ("floor: head move with rejoin (seen)", [f.get("move_seen") for f in floors]),
        ("floor: head move with rejoin (reg.)", [f.get("move_reg") for f in floors]),
        ("ours (a) head loss noticed", [o.get("noticed") for o in ours]),
        ("ours (b) new head ready", [o.get("elected") for o in ours]),
        ("ours     supervisor head_ready event", [o.get("supervisor_ready") for o in ours]),
        ("ours (c) JOINED in node_states", [o.get("joined") for o in ours]),
        ("ours (c) ALIVE in new GCS (seen)", [o.get("alive_seen") for o in ours]),
        ("ours (c) ALIVE in new GCS (reg.)", [o.get("alive_reg") for o in ours]),
        ("ours (c) all workers rejoined", [o.get("rejoined") for o in ours]),
    ]
    ratios = []
    ratios_reg = []
    for f, o in zip(floors, ours):
        ratios.append(o["rejoined"] / f["move_seen"] if o.get("rejoined") and f.get("move_seen") else None)
        ratios_reg.append(o["alive_reg"] / f["move_reg"] if o.get("alive_reg") and f.get("move_reg") else None)
    say(f"\n{'metric (seconds from t0 / from sbatch)':<42} {'median':>7}   samples")
    for label, values in rows:
        m, got = med(values)
        missing = len(values) - len(got)
        say(f"{label:<42} {fmt(m):>7}   {', '.join(fmt(v) for v in got)}"
            f"{f'  ({missing} missing)' if missing else ''}")
    for label, values in (("ratio ours (c) rejoined / floor move (seen)", ratios),
                          ("ratio ours / floor, both reg. in the GCS", ratios_reg)):
        m, got = med(values)
        say(f"{label:<42} {fmt(m, 2):>7}   {', '.join(fmt(v, 2) for v in got)}")
    m_notice, _ = med([o.get("noticed") for o in ours])
    m_ratio, _ = med(ratios)
    say("\npublished implementation: " + "; ".join(f"{k} {v} s" for k, v in PUBLISHED.items()))
    say(f"targets: noticed <= {TARGET_NOTICE:.0f} s (median here {fmt(m_notice)} s); "
        f"rejoined <= {TARGET_RATIO}x floor (median ratio here {fmt(m_ratio, 2)})")
    moves = ", ".join(str(f.get("a_node", "?")) + "->" + str(f.get("b_node", "?")) for f in floors)
    say(f"floor head nodes (A->B): {moves}")
    say(f"total runtime {time.time() - started:.0f} s; logs under {base}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
