"""`elastic-ray session ...`: look at and steer a running session from a shell.

Every command opens the session directory like any other process of the run
would (a CLI is one more holder of the Session), does one thing, and exits.
The pure parts (options to a config, ``NAME=AMOUNT`` parsing, the status
model and its rendering) are separate functions so they are tested without
a scheduler; the commands are thin shells around the coordinator.

Output and errors follow :mod:`.output`: results on stdout (with ``--json``
one JSON object and nothing else), progress on stderr, so
``JOB=$(elastic-ray session add-worker ...)`` works. ``DIR`` may be left out
when ``$ELASTIC_RAY_SESSION`` names the session.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.live import Live

from ..history.read import run_usage
from .. import defaults
from ..coordinator.allocations.pacing import STATUS_MAX_AGE, watch_max_age
from ..coordinator.session import Session
from ..errors import ElasticRayError, SchedulerError, TeardownIncomplete
from ..protocol.disk import event_log
from ..protocol.disk.records import is_job_id
from ..protocol.disk.recovery import describe
from ..protocol.disk.session_dir import SessionDir
from ..scheduler.base import Scheduler
from .options import OptionError, parse_ray_resources, worker_config
from .output import (JSON_OPTION, JsonCommand, Progress, echo_json, err_console, failures_as_click, one_line,
                     out_console, session_directory)
from ..coordinator.scaling.status import autoscale_status
from .status_model import answer_outdated, build_status, driver_oom_steps, failed_election, health, job_sort_key
from .status_view import format_duration, render_status

__all__ = ["session_group", "collect_status", "open_session", "one_line", "Progress"]

# Extra listening for the head's heartbeat. The first observation already
# waits up to the heartbeat's loss window for a beat, so this stays small.
HEARTBEAT_WAIT = 0.5

# =============================================================== effects: session access

def scheduler_override(ctx: click.Context) -> Scheduler | None:
    """Tests (and embedding programs) may hand in a scheduler through ``obj``."""
    obj = ctx.find_root().obj
    return obj.get("scheduler") if isinstance(obj, dict) else None


def open_session(path: Path, scheduler: Scheduler | None) -> Session:
    """Open without background supervision: a CLI must never elect a head on its own."""
    return Session.open(path, scheduler, supervise=False)


def collect_status(session: Session, heartbeat_wait: float = HEARTBEAT_WAIT,
                   max_age: float = 0.0) -> dict[str, Any]:
    """Read the session and ask the scheduler ONCE about all of its jobs, or
    take the session's shared answer if it is at most ``max_age`` s old: a
    ``status`` every second from many shells must not load the controller."""
    record = session.record()
    extra = [*record.predecessors, *([record.successor] if record.successor else [])]
    jobs = session.query(extra=extra, max_age=max_age)
    answer = session.jobs.last_answer
    # The query may have recorded a failed worker allocation (and its replacement): show the record after it.
    record = session.record()
    nodes = {job: session.node_states(job) for job in sorted(set(jobs) | set(record.workers)
                                                              | ({record.head_job} if record.head_job else set()))}
    if answer is not None and max_age > 0 and answer_outdated(jobs, nodes, answer.asked_at):
        jobs = session.query(extra=extra, max_age=0.0)
        answer = session.jobs.last_answer
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
    now = time.time()
    status = build_status(path=session.path, info=session.info, record=record, jobs=jobs, nodes=nodes,
                          pointer=pointer, endpoint=endpoint, observation=observation, now=now)
    status["scheduler_answer_age"] = None if answer is None else round(max(0.0, answer.age(now)), 1)
    status["autoscale"] = autoscale_status(session.path, record, now)
    add_logged_facts(status, session.path)
    return status


def add_logged_facts(status: dict[str, Any], path: Path) -> None:
    """What only the event log tells: each job row's ``driver_oom_steps`` (the payload drivers'
    steps on it that the OOM killer ended) and the head's ``election_failed`` (the last election
    found no head to be had, and none came after). A log that cannot be read shows neither."""
    try:
        events = event_log.read(path).events
    except (OSError, ValueError):
        events = []
    steps = driver_oom_steps(events)
    for row in status["jobs"]:
        row["driver_oom_steps"] = steps.get(row["job_id"], [])
    status["head"]["election_failed"] = failed_election(events)


def run_usage_so_far(path: Path) -> dict[str, Any] | None:
    """``session usage --json``'s figures, for ``status --json`` (None if the event log cannot be read)."""
    try:
        return run_usage(path)[1].to_dict()
    except (OSError, ValueError):
        return None


def _session_path(ctx: click.Context, directory: Path | None) -> Session:
    return open_session(session_directory(directory), scheduler_override(ctx))


# DIR may be left out when $ELASTIC_RAY_SESSION names the session (output.session_directory).
_DIR = click.argument("directory", metavar="[DIR]", required=False,
                      type=click.Path(file_okay=False, path_type=Path))
_POSITIVE = click.FloatRange(min=0, min_open=True)


# =============================================================== commands

@click.group("session")
def session_group() -> None:
    """Look at and change a session (its directory is DIR, or $ELASTIC_RAY_SESSION)."""


def _status_table(status: dict[str, Any]) -> Any:
    return render_status(status)


def _watch_sleep(seconds: float) -> None:
    time.sleep(seconds)       # a module attribute, so a test can end the watch as Ctrl-C would


def watch_status(session: Session, interval: float, max_age: float, console: Console) -> None:
    """Redraw the status in place every ``interval`` s until Ctrl-C.

    Each refresh takes the session's shared scheduler answer if it is at
    most ``max_age`` s old, so a watch (or ten) costs the controller one
    query per ``max_age``, not one per refresh.
    """
    status = collect_status(session, max_age=max_age)
    with Live(_status_table(status), console=console, auto_refresh=False, transient=False) as live:
        try:
            while True:
                _watch_sleep(interval)
                status = collect_status(session, heartbeat_wait=0.0, max_age=max_age)
                live.update(_status_table(status), refresh=True)
        except KeyboardInterrupt:
            pass


@session_group.command("status", cls=JsonCommand)
@_DIR
@JSON_OPTION
@click.option("--max-age", type=click.FloatRange(min=0), default=STATUS_MAX_AGE, show_default=True,
              help="Accept the session's shared scheduler answer up to this many seconds old (0: ask Slurm).")
@click.option("--check", is_flag=True,
              help="Exit 0 if healthy, 3 if the head is lost, 4 if a worker allocation failed, "
                   "5 if the head is still starting.")
@click.option("--watch", type=_POSITIVE, is_flag=False, flag_value=2.0, default=None, metavar="[SECONDS]",
              help="Redraw the status in place every SECONDS (default 2) until Ctrl-C.")
@click.pass_context
@failures_as_click
def status_cmd(ctx: click.Context, directory: Path | None, as_json: bool, max_age: float, check: bool,
               watch: float | None) -> None:
    """The head and every worker allocation: Slurm state, nodes, Ray node ids,
    time left, drain state, and whether the head's heartbeat is live.

    Asks the scheduler once, however many allocations the session has, and
    not at all when another process of the session asked within ``--max-age``.
    """
    if watch is not None and (as_json or check):
        raise click.UsageError("--watch: not with --json or --check (it redraws a table until Ctrl-C)")
    session = _session_path(ctx, directory)
    try:
        if watch is not None:
            watch_status(session, watch, watch_max_age(max_age), out_console())
            return
        status = collect_status(session, max_age=watch_max_age(max_age))
    finally:
        session.close()
    code, reasons = health(status)
    if as_json:
        status["usage"] = run_usage_so_far(session.path)
        echo_json("session status", {**status, **({"check": {"code": code, "reasons": reasons}} if check else {})})
    else:
        out_console().print(render_status(status))
        if status["scheduler_answer_age"] is not None:
            err_console().print(f"scheduler answer: {status['scheduler_answer_age']:.1f} s old")
        if check:
            for reason in reasons:
                err_console().print(f"check: {reason}", markup=False)
    if check:
        ctx.exit(code)


def _ray_resources_callback(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> dict[str, float]:
    try:
        return parse_ray_resources(values)
    except ValueError as exc:
        raise click.BadParameter(str(exc), ctx=ctx, param=param) from None


@session_group.command("add-worker", cls=JsonCommand)
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
              help=f"Seconds without a live head before the allocation gives itself up "
                   f"[default: {defaults.REJOIN_TIMEOUT:g}].")
@click.option("--resubmit-on-failure", type=click.IntRange(min=0), default=0, show_default=True, metavar="N",
              help="Submit the same allocation again, up to N times, when its job fails on its own "
                   "(a session process that polls, e.g. the supervisor, does it).")
@click.option("--wait/--no-wait", default=True, show_default=True,
              help="Wait until every node has joined the Ray cluster.")
@click.option("--timeout", type=_POSITIVE, default=defaults.WAIT_TIMEOUT, show_default=True,
              help="Seconds --wait waits.")
@JSON_OPTION
@click.pass_context
@failures_as_click
def add_worker_cmd(ctx: click.Context, directory: Path | None, wait: bool, timeout: float,
                   resubmit_on_failure: int, as_json: bool, **options: Any) -> None:
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
    err = err_console()
    try:
        handle = session.add_worker_allocation(config, resubmit_on_failure=resubmit_on_failure)
        if not as_json:
            click.echo(handle.job_id)
        resolved = handle.config
        err.print(f"submitted worker allocation {handle.job_id} "
                  f"({resolved.num_nodes or 1} node(s) on {resolved.partition or 'the default partition'})",
                  markup=False)
        joined = None
        if wait:
            with Progress(err, f"job {handle.job_id}: waiting for its nodes to join") as progress:
                joined = session.wait_for_worker_allocation(handle, timeout=timeout, progress=progress)
        if as_json:
            echo_json("session add-worker", {"job_id": handle.job_id, "config": resolved.to_dict(),
                                             "resubmit_on_failure": resubmit_on_failure, "joined": joined})
        else:
            for node, node_id in (joined or {}).items():
                click.echo(f"{node} {node_id}")
    finally:
        session.close()


@session_group.command("remove-worker", cls=JsonCommand)
@click.argument("directory", metavar="[DIR]", required=False)
@click.argument("job", required=False)
@click.option("--drain-timeout", type=_POSITIVE, default=defaults.DRAIN_TIMEOUT, show_default=True,
              help="Seconds the nodes get to drain before they are stopped.")
@click.option("--wait/--no-wait", default=True, show_default=True,
              help="Wait until the allocation has ended.")
@JSON_OPTION
@click.pass_context
@failures_as_click
def remove_worker_cmd(ctx: click.Context, directory: str | None, job: str | None, drain_timeout: float,
                      wait: bool, as_json: bool) -> None:
    """Drain worker allocation JOB out of the Ray cluster (cancel it if it
    still pends) and print its final Slurm state (with --no-wait: the state now)."""
    if job is None:     # one argument: it is JOB, and the session comes from $ELASTIC_RAY_SESSION
        if directory is None:
            raise click.UsageError("missing argument JOB", ctx=ctx)
        directory, job = None, directory
    if not is_job_id(job):
        raise click.BadParameter(f"{job!r} is not a job id", ctx=ctx, param_hint="JOB")
    session = _session_path(ctx, None if directory is None else Path(directory))
    try:
        if job not in session.record().workers:
            raise click.BadParameter(f"job {job} is not a worker allocation of this session",
                                     ctx=ctx, param_hint="JOB")
        with Progress(err_console(), f"job {job}: draining") as progress:
            state = session.remove_worker_allocation(job, drain_timeout=drain_timeout, wait=wait,
                                                     progress=progress)
        if as_json:
            echo_json("session remove-worker", {"job_id": job, "state": state, "waited": wait})
        else:
            click.echo(state)
        if not wait:
            err_console().print(f"job {job}: drain requested; its nodes leave within {format_duration(drain_timeout)}",
                         markup=False)
    finally:
        session.close()


@session_group.command("replace-head", cls=JsonCommand)
@_DIR
@click.option("--timeout", type=_POSITIVE, default=defaults.WAIT_TIMEOUT, show_default=True,
              help="Seconds to wait for a healthy head.")
@JSON_OPTION
@click.pass_context
@failures_as_click
def replace_head_cmd(ctx: click.Context, directory: Path | None, timeout: float, as_json: bool) -> None:
    """Make sure the session has a healthy head, electing one if it has none;
    print the head's job id and address.

    A healthy head is left as it is. Safe to run next to other processes of
    the run: they agree on one election.
    """
    session = _session_path(ctx, directory)
    try:
        with Progress(err_console(), "checking the head") as progress:
            head = session.replace_head(timeout=timeout, progress=progress)
        if as_json:
            echo_json("session replace-head", {"job_id": head.job_id, "address": head.address})
        else:
            click.echo(f"{head.job_id} {head.address}")
    finally:
        session.close()


@session_group.command("teardown", cls=JsonCommand)
@_DIR
@click.option("--timeout", type=_POSITIVE, default=defaults.TEARDOWN_TIMEOUT, show_default=True,
              help="Seconds to wait for every job to end after the cancel.")
@JSON_OPTION
@click.pass_context
@failures_as_click
def teardown_cmd(ctx: click.Context, directory: Path | None, timeout: float, as_json: bool) -> None:
    """Cancel every job of the session, then wait until none is active.

    The session's jobs are the ids it recorded (and any job its own
    submissions marked), of the user who submitted them: a job of another
    session or user that carries the same name is neither cancelled nor
    waited for.
    """
    session = _session_path(ctx, directory)
    incomplete: TeardownIncomplete | None = None
    try:
        try:
            record = session.record()
            extra = [*record.predecessors, *([record.successor] if record.successor else [])]
        except ElasticRayError as exc:      # a damaged record: teardown finds the jobs without it
            err_console().print(f"warning: {one_line(exc)}", markup=False)
            extra = []
        try:
            cancelled = sorted(session.teardown(extra), key=job_sort_key)
        except TeardownIncomplete as exc:
            incomplete, cancelled = exc, sorted(exc.cancelled, key=job_sort_key)
        # The same wait as Session.teardown(wait=True), on the cancelled ids themselves
        # (not through the record, which may be damaged).
        with Progress(err_console(), f"cancelling {len(cancelled)} job(s)") as progress:
            try:
                jobs = session.jobs.wait_ended(set(extra) | set(cancelled), timeout=timeout, progress=progress)
            except SchedulerError as exc:
                raise click.ClickException(str(exc)) from None
    finally:
        session.close()
    if incomplete is not None:
        raise click.ClickException(f"cancelled {len(cancelled)} job(s), but: {'; '.join(incomplete.errors)}")
    if as_json:
        echo_json("session teardown", {"cancelled": cancelled, "jobs": {
            job: info.state.value for job, info in sorted(jobs.items(), key=lambda kv: job_sort_key(kv[0]))},
            "active": []})
    else:
        click.echo(f"cancelled {len(cancelled)} job(s); none of the session's {len(jobs)} job(s) is active")


@session_group.command("repair", cls=JsonCommand)
@_DIR
@click.option("--yes", is_flag=True, help="Restore it; without --yes, only show what would be restored.")
@JSON_OPTION
@failures_as_click
def repair_cmd(directory: Path | None, yes: bool, as_json: bool) -> None:
    """Put a damaged allocation.json back from its newest good copy.

    A damaged record is restored on its own when the session directory
    shows that nothing newer is lost; this is for the case that was
    refused. It prints what would be restored and why it was not automatic;
    with --yes it restores it (the damaged file is kept next to it as
    allocation.json.corrupt-<time>). Needs no scheduler.
    """
    session_dir = SessionDir.open(session_directory(directory))
    plan = session_dir.repair_plan()
    result: dict[str, Any] = {"file": str(session_dir.allocation_file), "damaged": plan is not None,
                              "plan": None if plan is None else describe(plan),
                              "source": None if plan is None or plan.source is None else str(plan.source.source),
                              "restored": False, "generation": None}
    if plan is None:
        if as_json:
            echo_json("session repair", result)
        else:
            click.echo(f"{session_dir.allocation_file}: reads well; nothing to repair")
        return
    if not as_json:
        click.echo(describe(plan), err=True)   # unwrapped: paths and reasons stay whole
    if plan.source is None:
        raise click.ClickException("nothing to restore from; the session's jobs can still be cancelled with "
                                   f"`elastic-ray session teardown {session_dir.path}`")
    if yes:
        restored = session_dir.restore_allocation_backup()
        result.update(restored=True, generation=restored.generation)
    if as_json:
        echo_json("session repair", result)
    elif not yes:
        click.echo("run again with --yes to restore it", err=True)
    else:
        click.echo(f"restored {plan.source.source} as generation {restored.generation}")
