"""`elastic-ray session ...`: look at and steer a running session from a shell.

Every command opens the session directory like any other process of the run
would (a CLI is one more holder of the Session), does one thing, and exits.
The pure parts (options to a config, ``NAME=AMOUNT`` parsing, the status
model and its rendering) are separate functions so they are tested without
a scheduler; the commands are thin shells around the coordinator.

Output rule: results go to stdout in a form a script can read (a job id, a
state, JSON with ``--json``); progress and human context go to stderr, so
``JOB=$(elastic-ray session add-worker ...)`` works. Errors are one line:
exit status 2 for a bad argument, 1 for a failure.
"""

from __future__ import annotations

import functools
import inspect
import json
import math
import re
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import click
from rich import box
from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from .config import SlurmWorkerAllocationConfig
from .coordinator.headwatch import HeadObservation
from .coordinator.session import Session
from .errors import ConfigError, ElasticRayError
from .protocol.records import AllocationRecord, HeadEndpoint, SessionInfo, WorkerRecord, is_job_id
from .scheduler.base import JobInfo, JobState, Scheduler

# An agent rewrites its node file at least every few seconds while it runs;
# older than this (and not exited) it is shown as stale.
AGENT_STALE_AFTER = 30.0
# Extra listening for the head's heartbeat. The first observation already
# waits up to the heartbeat's loss window for a beat, so this stays small.
HEARTBEAT_WAIT = 0.5
STATE_POLL = 0.5
_ACTIVE_STATES = frozenset(s.value for s in JobState if s.is_active)


# =============================================================== pure: options -> config

# The CLI option that sets each config field, so a ConfigError (which names
# the field) is reported against what the user actually typed.
FIELD_OPTIONS: Mapping[str, str] = {
    "partition": "--partition",
    "num_nodes": "--nodes",
    "gpus_per_node": "--gpus-per-node",
    "cpus_per_task": "--cpus-per-task",
    "mem": "--mem",
    "mem_per_cpu": "--mem-per-cpu",
    "time_limit": "--time",
    "time_min": "--time-min",
    "signal_before_timeout": "--signal",
    "nodelist": "--nodelist",
    "exclude": "--exclude",
    "qos": "--qos",
    "account": "--account",
    "reservation": "--reservation",
    "constraint": "--constraint",
    "extra_sbatch_directives": "--sbatch-arg",
    "ray_resources": "--ray-resource",
    "ray_start_args": "--ray-start-arg",
    "rejoin_timeout": "--rejoin-timeout",
}


def option_for_field(field: str) -> str:
    """``"ray_resources['a40']"`` -> ``"--ray-resource"``; unknown fields are returned as they are."""
    base = re.split(r"[\[.]", field, maxsplit=1)[0]
    return FIELD_OPTIONS.get(base, field)


def parse_ray_resource(text: str) -> tuple[str, float]:
    """``"accelerator:a40=1"`` -> ``("accelerator:a40", 1.0)``. Raises ValueError with a reason.

    The amount follows the last ``=``, so a name may hold anything but ``=``.
    Reserved names are left to the config's own check, which says why.
    """
    name, sep, amount = text.rpartition("=")
    name = name.strip()
    if not sep or not name:
        raise ValueError(f"{text!r} is not NAME=AMOUNT (for example a40=1)")
    try:
        value = float(amount)
    except ValueError:
        raise ValueError(f"{text!r}: the amount {amount!r} is not a number") from None
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{text!r}: the amount must be finite and not negative")
    return name, value


def parse_ray_resources(values: Iterable[str]) -> dict[str, float]:
    """Every ``--ray-resource`` given; a name given twice is refused (which one was meant?)."""
    out: dict[str, float] = {}
    for text in values:
        name, amount = parse_ray_resource(text)
        if name in out:
            raise ValueError(f"{name!r} is given twice")
        out[name] = amount
    return out


class OptionError(click.UsageError):
    """A bad option value: exit status 2, message ``--option: what is wrong``."""

    def __init__(self, option: str, message: str, ctx: click.Context | None = None):
        self.option = option
        super().__init__(f"{option}: {message}", ctx=ctx)


def worker_config(options: Mapping[str, Any]) -> SlurmWorkerAllocationConfig:
    """Build the worker config from option values keyed by config field.

    ``None`` (and an empty tuple or mapping) means the option was not given,
    so the field stays unset and is inherited by the session. Raises
    :class:`OptionError` naming the option.
    """
    unknown = sorted(set(options) - set(FIELD_OPTIONS))
    if unknown:
        raise ValueError(f"not config fields: {unknown}")
    if options.get("mem") is not None and options.get("mem_per_cpu") is not None:
        raise OptionError("--mem-per-cpu", "--mem and --mem-per-cpu are exclusive; give one")
    given = {k: v for k, v in options.items() if v is not None and not (isinstance(v, (tuple, list, Mapping))
                                                                        and len(v) == 0)}
    try:
        return SlurmWorkerAllocationConfig(**given)
    except ConfigError as exc:
        raise OptionError(option_for_field(exc.field), f"{exc.value!r}: {exc.reason}") from None


# =============================================================== pure: the status model

def _job_sort_key(job_id: str) -> tuple[int, str]:
    return (int(job_id), job_id) if job_id.isdigit() else (sys.maxsize, job_id)


def _time_left(info: JobInfo | None, now: float) -> float | None:
    if info is None or not info.state.is_active:
        return None
    if info.time_left is not None:
        return max(0.0, info.time_left)
    if info.end_time is not None and math.isfinite(info.end_time) and info.state.is_running:
        return max(0.0, info.end_time - now)
    return None


def _node_rows(info: JobInfo | None, states: Mapping[str, Mapping[str, Any]], now: float) -> list[dict[str, Any]]:
    """One entry per node: the scheduler's node list, plus any node whose agent published a state."""
    names = list(info.nodes) if info else []
    names += sorted(n for n in states if n not in names)
    rows = []
    for name in names:
        state = states.get(name) or {}
        updated = state.get("updated_at")
        age = now - updated if isinstance(updated, (int, float)) else None
        exited = bool(state.get("exited"))
        agent = state.get("state") if isinstance(state.get("state"), str) else None
        rows.append({
            "node": name,
            "ray_node_id": state.get("node_id") if isinstance(state.get("node_id"), str) else None,
            "agent_state": agent,
            "agent_exited": exited,
            # Stale only matters while the job runs; after it, the job's state says enough.
            "agent_stale": (bool(agent) and not exited and age is not None and age > AGENT_STALE_AFTER
                            and info is not None and info.state.is_active),
            "agent_updated_age": None if age is None else round(age, 1),
        })
    return rows


def _drain(worker: WorkerRecord | None) -> dict[str, Any] | None:
    if worker is None:
        return None
    return {"state": worker.state, "requested_at": worker.drain_requested_at, "deadline": worker.drain_deadline}


def _heartbeat(pointer: str | None, jobs: Mapping[str, JobInfo], endpoint: HeadEndpoint | None,
               observation: HeadObservation | None) -> str:
    if pointer is None:
        return "no head"
    info = jobs.get(pointer)
    if info is not None and info.state.is_final:
        return "job ended"
    if endpoint is None:
        return "not ready"
    if observation is None or observation.job != pointer:
        return "unknown"
    return "live" if observation.alive else "silent"


def build_status(*, path: str | Path, info: SessionInfo, record: AllocationRecord, jobs: Mapping[str, JobInfo],
                 nodes: Mapping[str, Mapping[str, Mapping[str, Any]]], pointer: str | None,
                 endpoint: HeadEndpoint | None, observation: HeadObservation | None,
                 now: float) -> dict[str, Any]:
    """Everything ``session status`` shows, as one JSON-ready dict. Pure.

    ``jobs`` is the answer of one scheduler query; ``nodes`` maps a job id
    to its agents' published states; ``pointer`` is what ``ray_head`` names;
    ``observation`` is the head's heartbeat as observed (None if not asked).
    A job the scheduler was not asked about is shown as ``UNKNOWN``.
    """
    roles: dict[str, str] = {}
    for job in record.predecessors:
        roles[job] = "head (replaced)"
    if record.successor:
        roles[record.successor] = "head (successor)"
    for job in record.workers:
        roles[job] = "worker"
    if record.head_job:
        roles[record.head_job] = "worker+head" if record.head_job in record.workers else "head"
    if pointer and pointer not in roles:
        roles[pointer] = "head (pointer)"
    for job in jobs:
        roles.setdefault(job, "unrecorded")

    order = {"head": 0, "worker+head": 0, "head (pointer)": 1, "head (successor)": 2,
             "head (replaced)": 3, "worker": 4, "unrecorded": 5}
    rows = []
    for job_id in sorted(roles, key=lambda j: (order[roles[j]], _job_sort_key(j))):
        job = jobs.get(job_id)
        worker = record.workers.get(job_id)
        config = worker.config if worker else {}
        rows.append({
            "role": roles[job_id],
            "job_id": job_id,
            "partition": (job.partition if job and job.partition else None) or config.get("partition"),
            "state": job.state.value if job else "UNKNOWN",
            "reason": job.reason if job else "",
            "time_left": None if (left := _time_left(job, now)) is None else round(left, 1),
            "nodes": _node_rows(job, nodes.get(job_id, {}), now),
            "drain": _drain(worker),
        })

    heartbeat = _heartbeat(pointer, jobs, endpoint, observation)
    age = observation.last_beat_age if observation is not None and observation.job == pointer else None
    election = record.election
    return {
        "session": {"path": str(path), "job_name": info.job_name, "session_id": info.session_id,
                    "scheduler": info.scheduler.get("kind")},
        "head": {
            "job_id": pointer,
            "recorded_job_id": record.head_job,
            "address": endpoint.address if endpoint else None,
            "heartbeat": heartbeat,
            "last_beat_age": None if age is None else round(age, 2),
            "draining": bool(observation and observation.job == pointer and observation.draining),
        },
        "election": None if election is None else {
            "claimant": election.claimant, "since": election.since, "expires": election.expires,
            "live": election.is_live(now)},
        "successor": record.successor,
        "jobs": rows,
        "active_jobs": sum(1 for r in rows if r["state"] in _ACTIVE_STATES),
        "observed_at": now,
    }


def format_duration(seconds: float | None) -> str:
    """``4000`` -> ``"1h06m"``, ``75`` -> ``"1m15s"``; ``"-"`` for unknown."""
    if seconds is None:
        return "-"
    s = int(round(seconds))
    if s >= 86400:
        return f"{s // 86400}d{(s % 86400) // 3600:02d}h"
    if s >= 3600:
        return f"{s // 3600}h{(s % 3600) // 60:02d}m"
    if s >= 60:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s}s"


_STATE_STYLE = {"RUNNING": "green", "PENDING": "yellow", "COMPLETING": "yellow", "SUSPENDED": "yellow",
                "COMPLETED": "dim", "UNKNOWN": "magenta", "ENDED_UNKNOWN": "magenta"}


def _drain_text(drain: Mapping[str, Any] | None, job_state: str, now: float) -> str:
    if drain is None:
        return ""
    deadline = drain.get("deadline")
    # Once the job has ended its drain deadline no longer means anything.
    if drain["state"] == "submitted" or deadline is None or job_state not in _ACTIVE_STATES:
        return drain["state"]
    if deadline >= now:
        return f"{drain['state']}, deadline in {format_duration(deadline - now)}"
    return f"{drain['state']}, deadline passed {format_duration(now - deadline)} ago"


def _agent_text(node: Mapping[str, Any]) -> str:
    state = node["agent_state"] or "-"
    if node["agent_exited"]:
        return f"{state} (exited)"
    if node["agent_stale"]:
        return f"{state} (stale {format_duration(node['agent_updated_age'])})"
    return state


def render_status(status: Mapping[str, Any]) -> Group:
    """The status as a header line, a head line and a table of every job. Pure (builds renderables)."""
    now = status["observed_at"]
    sess, head = status["session"], status["head"]
    header = Text.assemble(("session ", "bold"), (sess["job_name"], "bold cyan"),
                           f"  {sess['path']}  (scheduler {sess['scheduler']})")
    head_line = Text("head: ", style="bold")
    if head["job_id"] is None:
        head_line.append("none")
    else:
        head_line.append(f"job {head['job_id']}")
        head_line.append(f" at {head['address']}" if head["address"] else " (no address published)")
        beat = head["heartbeat"]
        style = {"live": "green", "silent": "red", "job ended": "red"}.get(beat, "yellow")
        head_line.append(", heartbeat ")
        head_line.append(beat, style=style)
        if head["last_beat_age"] is not None and beat != "live":
            head_line.append(f" (last {format_duration(head['last_beat_age'])} ago)")
        if head["draining"]:
            head_line.append(", draining", style="yellow")
        if head["recorded_job_id"] not in (None, head["job_id"]):
            head_line.append(f"; the record names job {head['recorded_job_id']}", style="yellow")
    extra = []
    if status["election"] is not None:
        e = status["election"]
        extra.append(Text(f"election by {e['claimant']} "
                          + ("in progress" if e["live"] else "expired"), style="yellow"))

    # No vertical rules: the table stays readable when grepped or piped.
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    for column in ("role", "job", "partition", "state", "nodes", "ray node id", "agent", "time left", "drain"):
        table.add_column(column, no_wrap=column in ("job", "state", "ray node id"))
    for row in status["jobs"]:
        nodes = row["nodes"]
        state = Text(row["state"], style=_STATE_STYLE.get(row["state"], "red"))
        if row["reason"] and row["state"] == "PENDING":
            state.append(f" ({row['reason']})", style="dim")
        table.add_row(
            row["role"], row["job_id"], row["partition"] or "-", state,
            "\n".join(n["node"] for n in nodes) or "-",
            "\n".join((n["ray_node_id"] or "-")[:12] for n in nodes) or "-",
            "\n".join(_agent_text(n) for n in nodes) or "-",
            format_duration(row["time_left"]),
            _drain_text(row["drain"], row["state"], now),
        )
    return Group(header, head_line, *extra, table)


# =============================================================== effects: session access

def _scheduler_override(ctx: click.Context) -> Scheduler | None:
    """Tests (and embedding programs) may hand in a scheduler through ``obj``."""
    obj = ctx.find_root().obj
    return obj.get("scheduler") if isinstance(obj, dict) else None


def open_session(path: Path, scheduler: Scheduler | None) -> Session:
    """Open without background supervision: a CLI must never elect a head on its own.

    Adapter: ``Session.open`` grows a ``supervise`` flag; older versions
    have none (and never supervise).
    """
    kwargs: dict[str, Any] = {}
    if "supervise" in inspect.signature(Session.open).parameters:
        kwargs["supervise"] = False
    return Session.open(path, scheduler, **kwargs)


def close_session(session: Session) -> None:
    close = getattr(session, "close", None)
    if callable(close):
        close()
    else:  # pragma: no cover - Session versions without close()
        watch = getattr(session, "_watch", None)
        if watch is not None:
            watch.close()


def collect_status(session: Session, heartbeat_wait: float = HEARTBEAT_WAIT) -> dict[str, Any]:
    """Read the session and ask the scheduler ONCE about all of its jobs."""
    record = session.record()
    extra = [*record.predecessors, *([record.successor] if record.successor else [])]
    jobs = session.query(extra=extra)
    nodes = {job: session.node_states(job) for job in sorted(set(jobs) | set(record.workers)
                                                              | ({record.head_job} if record.head_job else set()))}
    pointer = session.dir.read_ray_head()
    endpoint = session.dir.read_head_endpoint(pointer) if pointer else None
    observation = None
    pointer_info = jobs.get(pointer) if pointer else None
    # A heartbeat is only worth listening for from a head whose job still runs.
    if endpoint is not None and (pointer_info is None or pointer_info.state.is_active):
        try:
            observation = session.observe_head(wait=heartbeat_wait)
        except (ElasticRayError, OSError):
            observation = None  # shown as "unknown"; the rest of the status still stands
    return build_status(path=session.path, info=session.info, record=record, jobs=jobs, nodes=nodes,
                        pointer=pointer, endpoint=endpoint, observation=observation, now=time.time())


# =============================================================== effects: output and errors

def _out() -> Console:
    # Wide enough for the table when piped (a log, a test), natural width on a terminal.
    return Console(width=None if sys.stdout.isatty() else 160, highlight=False)


def _err() -> Console:
    return Console(stderr=True, highlight=False, width=None if sys.stderr.isatty() else 160)


def one_line(exc: BaseException) -> str:
    """An error as one line: the first line of the message, a log tail replaced by its path."""
    text = str(exc).strip() or type(exc).__name__
    first = text.splitlines()[0]
    return re.sub(r"last lines of (\S+):$", r"see \1", first)


def failures_as_click(func: Callable[..., Any]) -> Callable[..., Any]:
    """Expected failures become one-line errors with exit status 1, never tracebacks."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except click.ClickException:
            raise
        except (ElasticRayError, TimeoutError, OSError, ValueError) as exc:
            # ElasticRayError covers ConfigError, SessionDirError, SchedulerError,
            # AllocationFailed; ValueError is what the Session raises for a bad handle.
            raise click.ClickException(one_line(exc)) from None

    return wrapper


class Progress:
    """A spinner with the latest progress text on a terminal; on anything else
    (a log file, CI) each new text as a timestamped line on stderr."""

    def __init__(self, console: Console, initial: str):
        self.console = console
        self.initial = initial
        self._status: Any = None
        self._last = ""

    def __enter__(self) -> "Progress":
        if self.console.is_terminal:
            self._status = self.console.status(self.initial)
            self._status.__enter__()
        else:
            self(self.initial)
        return self

    def __call__(self, text: str) -> None:
        if text == self._last:
            return
        self._last = text
        if self._status is not None:
            self._status.update(text)
        else:
            self.console.print(f"{time.strftime('%H:%M:%S')} {text}", markup=False)

    def __exit__(self, *exc: object) -> None:
        if self._status is not None:
            self._status.__exit__(*exc)


def _session_path(ctx: click.Context, directory: Path) -> Session:
    return open_session(directory, _scheduler_override(ctx))


_DIR = click.argument("directory", metavar="DIR", type=click.Path(file_okay=False, path_type=Path))
_POSITIVE = click.FloatRange(min=0, min_open=True)


# =============================================================== commands

@click.group("session")
def session_group() -> None:
    """Look at and change a running session (its directory is DIR)."""


@session_group.command("status")
@_DIR
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of the table.")
@click.pass_context
@failures_as_click
def status_cmd(ctx: click.Context, directory: Path, as_json: bool) -> None:
    """The head and every worker allocation: Slurm state, nodes, Ray node ids,
    time left, drain state, and whether the head's heartbeat is live.

    Asks the scheduler once, however many allocations the session has.
    """
    session = _session_path(ctx, directory)
    try:
        status = collect_status(session)
    finally:
        close_session(session)
    if as_json:
        click.echo(json.dumps(status, indent=2, sort_keys=True))
    else:
        _out().print(render_status(status))


def _ray_resources_callback(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> dict[str, float]:
    try:
        return parse_ray_resources(values)
    except ValueError as exc:
        raise click.BadParameter(str(exc), ctx=ctx, param=param) from None


@session_group.command("add-worker")
@_DIR
@click.option("--partition", help="Slurm partition (or a comma-separated list).")
@click.option("--nodes", "num_nodes", type=int, help="Number of nodes.")
@click.option("--gpus-per-node", type=int, help="GPUs on each node.")
@click.option("--cpus-per-task", type=int, help="CPUs on each node (one task per node).")
@click.option("--mem", help="Memory per node, e.g. 64G.")
@click.option("--mem-per-cpu", help="Memory per CPU, e.g. 4G (instead of --mem).")
@click.option("--time", "time_limit", help="Walltime, e.g. 2:00:00 or 1-00 (Slurm's forms).")
@click.option("--time-min", help="Shortest walltime Slurm may grant (backfill).")
@click.option("--signal", "signal_before_timeout", metavar="SIG@S",
              help="Signal sent S seconds before the walltime, which starts the drain, e.g. TERM@600.")
@click.option("--account", help="Slurm account.")
@click.option("--qos", help="Slurm QoS.")
@click.option("--reservation", help="Slurm reservation.")
@click.option("--constraint", help="Slurm node features, e.g. a40|a100.")
@click.option("--nodelist", help="Nodes to use (a Slurm host list).")
@click.option("--exclude", help="Nodes to avoid (a Slurm host list).")
@click.option("--sbatch-arg", "extra_sbatch_directives", multiple=True, metavar="--OPT[=VALUE]",
              help="An extra sbatch option the session does not manage; repeatable.")
@click.option("--ray-resource", "ray_resources", multiple=True, metavar="NAME=AMOUNT",
              callback=_ray_resources_callback, help="A custom Ray resource on every node; repeatable.")
@click.option("--ray-start-arg", "ray_start_args", multiple=True, metavar="--OPT[=VALUE]",
              help="Passed to `ray start` last, so it wins; repeatable.")
@click.option("--rejoin-timeout", type=float,
              help="Seconds without a live head before the allocation gives itself up [default: 600].")
@click.option("--wait/--no-wait", default=True, show_default=True,
              help="Wait until every node has joined the Ray cluster.")
@click.option("--timeout", type=_POSITIVE, default=3600.0, show_default=True, help="Seconds --wait waits.")
@click.pass_context
@failures_as_click
def add_worker_cmd(ctx: click.Context, directory: Path, wait: bool, timeout: float, **options: Any) -> None:
    """Submit a worker allocation to the session and print its job id.

    Options left out are inherited from the session's first worker
    allocation (or its head). With --wait (the default) it then waits until
    every node joined and prints one line per node: NODE RAY_NODE_ID.
    """
    try:
        config = worker_config(options)
    except OptionError as exc:
        exc.ctx = ctx
        raise
    session = _session_path(ctx, directory)
    err = _err()
    try:
        handle = session.add_worker_allocation(config)
        click.echo(handle.job_id)
        resolved = handle.config
        err.print(f"submitted worker allocation {handle.job_id} "
                  f"({resolved.num_nodes or 1} node(s) on {resolved.partition or 'the default partition'})",
                  markup=False)
        if not wait:
            return
        with Progress(err, f"job {handle.job_id}: waiting for its nodes to join") as progress:
            joined = session.wait_for_worker_allocation(handle, timeout=timeout, progress=progress)
        for node, node_id in joined.items():
            click.echo(f"{node} {node_id}")
    finally:
        close_session(session)


@session_group.command("remove-worker")
@_DIR
@click.argument("job")
@click.option("--drain-timeout", type=_POSITIVE, default=900.0, show_default=True,
              help="Seconds the nodes get to drain before they are stopped.")
@click.option("--wait/--no-wait", default=True, show_default=True,
              help="Wait until the allocation has ended.")
@click.pass_context
@failures_as_click
def remove_worker_cmd(ctx: click.Context, directory: Path, job: str, drain_timeout: float, wait: bool) -> None:
    """Drain worker allocation JOB out of the Ray cluster (cancel it if it
    still pends) and print its final Slurm state (with --no-wait: the state now)."""
    if not is_job_id(job):
        raise click.BadParameter(f"{job!r} is not a job id", ctx=ctx, param_hint="JOB")
    session = _session_path(ctx, directory)
    try:
        if job not in session.record().workers:
            raise click.BadParameter(f"job {job} is not a worker allocation of this session",
                                     ctx=ctx, param_hint="JOB")
        with Progress(_err(), f"job {job}: draining") as progress:
            state = session.remove_worker_allocation(job, drain_timeout=drain_timeout, wait=wait,
                                                     progress=progress)
        click.echo(state)
        if not wait:
            _err().print(f"job {job}: drain requested; its nodes leave within {format_duration(drain_timeout)}",
                         markup=False)
    finally:
        close_session(session)


@session_group.command("replace-head")
@_DIR
@click.option("--timeout", type=_POSITIVE, default=3600.0, show_default=True,
              help="Seconds to wait for a healthy head.")
@click.pass_context
@failures_as_click
def replace_head_cmd(ctx: click.Context, directory: Path, timeout: float) -> None:
    """Make sure the session has a healthy head, electing one if it has none;
    print the head's job id and address.

    A healthy head is left as it is. Safe to run next to other processes of
    the run: they agree on one election.
    """
    session = _session_path(ctx, directory)
    try:
        with Progress(_err(), "checking the head") as progress:
            head = session.replace_head(timeout=timeout, progress=progress)
        click.echo(f"{head.job_id} {head.address}")
    finally:
        close_session(session)


@session_group.command("teardown")
@_DIR
@click.option("--timeout", type=_POSITIVE, default=120.0, show_default=True,
              help="Seconds to wait for every job to end after the cancel.")
@click.pass_context
@failures_as_click
def teardown_cmd(ctx: click.Context, directory: Path, timeout: float) -> None:
    """Cancel every job of the session, then wait until none is active."""
    session = _session_path(ctx, directory)
    try:
        record = session.record()
        extra = [*record.predecessors, *([record.successor] if record.successor else [])]
        before = session.query(extra=extra)
        cancelled = sorted((j for j, i in before.items() if i.state.is_active), key=_job_sort_key)
        session.teardown()
        deadline = time.monotonic() + timeout
        with Progress(_err(), f"cancelling {len(cancelled)} job(s)") as progress:
            while True:
                jobs = session.query(extra=extra)
                active = sorted((j for j, i in jobs.items() if i.state.is_active), key=_job_sort_key)
                if not active:
                    break
                if time.monotonic() > deadline:
                    raise click.ClickException(
                        f"{len(active)} job(s) still active {timeout:.0f}s after the cancel: {', '.join(active)}")
                progress(f"waiting for {len(active)} job(s) to end: {', '.join(active)}")
                time.sleep(STATE_POLL)
    finally:
        close_session(session)
    click.echo(f"cancelled {len(cancelled)} job(s); none of the session's {len(jobs)} job(s) is active")
