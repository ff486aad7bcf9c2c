"""`elastic-ray session timeline` and `session usage`: a run's history, read from its event log.

Both only read ``events.jsonl`` (through ``event_log.read``): they need no
scheduler, take no lock and change nothing in the session, so they are safe
on a live run and on one long over, from any host that sees the directory.
The session is ``DIR`` or ``$ELASTIC_RAY_SESSION``, as for every session
command. A bad argument (a directory that is no session, an output suffix
that names no format) is refused before anything is read or written, exit 2.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
from rich import box
from rich.table import Table

from ..atomic import atomic_write_bytes
from ..errors import SchedulerError
from ..history.read import live_idle, read_history
from ..history.runs import RunHistory
from ..history.usage import RunUsage, usage
from ..protocol.disk import paths
from .output import JSON_OPTION, JsonCommand, echo_json, err_console, failures_as_click, out_console, session_directory

_DIR = click.argument("directory", metavar="[DIR]", required=False,
                      type=click.Path(file_okay=False, path_type=Path))


def session_path(directory: Path | None) -> Path:
    """DIR (or ``$ELASTIC_RAY_SESSION``), checked to be a session directory: a usage error otherwise."""
    path = session_directory(directory)
    if not path.is_dir():
        raise click.BadParameter(f"{path}: no such directory", param_hint="DIR")
    if not paths.session_file(path).is_file():
        raise click.BadParameter(f"{path}: not a session directory (it has no {paths.session_file(path).name})",
                                 param_hint="DIR")
    return path


def _warn_skipped(skipped: int) -> None:
    if skipped:
        err_console().print(f"warning: {skipped} line(s) of the event log could not be read and are left out",
                            markup=False)


@click.command("timeline", cls=JsonCommand)
@_DIR
@click.option("--output", "-o", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="The file to write; its suffix chooses the format: .html (one self-contained page: "
                   "the drawing, the allocations, the usage and the events), .png or .svg.")
@JSON_OPTION
@failures_as_click
def timeline_cmd(directory: Path | None, output: Path, as_json: bool) -> None:
    """Draw the run's history: one bar per node of each allocation (pending,
    starting, joined, draining), grouped by partition, with the head's
    periods, elections, head moves and payload runs, on a UTC time axis.

    Prints the path written (with --json: output, format, bytes, events,
    skipped_lines). Needs matplotlib: pip install 'elastic-ray[timeline]'.
    """
    from ..history.timeline import TimelineError, output_format, render, title_of

    try:
        fmt = output_format(output)
    except TimelineError as exc:
        raise click.BadParameter(str(exc).removeprefix("output: "), param_hint="--output") from None
    if not output.parent.is_dir():
        raise click.BadParameter(f"{output}: the directory {output.parent} does not exist", param_hint="--output")
    path = session_path(directory)
    history, skipped = read_history(path)
    if not as_json:
        _warn_skipped(skipped)
    data = render(history, fmt, title=title_of(history), skipped=skipped, live_idle=live_idle(path, history))
    atomic_write_bytes(output, data, mode=0o644, durable=False)
    if as_json:
        echo_json("session timeline", {"output": str(output), "format": fmt, "bytes": len(data),
                                       "events": len(history.events), "skipped_lines": skipped})
    else:
        click.echo(str(output))


def usage_table(figures: RunUsage) -> Table:
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    figures_columns = ("nodes", "node-hours", "GPU-hours held", "GPU-hours idle")
    for column in ("job", "role", "partition", *figures_columns, "ended"):
        table.add_column(column, justify="right" if column in figures_columns else "left", no_wrap=True)

    def figure(value: float | None) -> str:
        return "?" if value is None else f"{value:.2f}"

    for row in figures.allocations:
        table.add_row(row.job, row.role or "?", row.partition or "?", str(row.nodes), figure(row.node_hours),
                      figure(row.gpu_hours_held), figure(row.gpu_hours_idle), "live" if row.live else row.ended_how or "?")
    table.add_section()
    table.add_row("run", "", "", str(sum(r.nodes for r in figures.allocations)), figure(figures.node_hours),
                  figure(figures.gpu_hours_held), figure(figures.gpu_hours_idle), "")
    return table


def slurm_accounting(path: Path, jobs: list[str]) -> dict[str, Any] | None:
    """sacct's figures of the run's jobs, by job; None when the scheduler keeps no accounting.
    A job sacct has no line for is left out (see ``sacct_section``); a failed sacct raises SchedulerError."""
    from ..coordinator.session import Session

    session = Session.open(path, supervise=False)
    try:
        found = session.scheduler.accounting(jobs)
    finally:
        session.close()
    return None if found is None else {job: found[job].to_dict() for job in jobs if job in found}


def sacct_section(path: Path, figures: RunUsage) -> dict[str, Any]:
    """The ``sacct`` part of ``session usage --json``.

    ``missing``: the run's jobs sacct has no record of (slurmdbd hears of a job from slurmctld a
    few seconds after it is submitted or ends; or the record was purged). ``not_final``: jobs the
    event log saw end whose record still says they run (the same lag): their figures still move.
    ``error``: sacct failed (e.g. slurmdbd down); the event log's figures stand on their own.
    """
    jobs = [row.job for row in figures.allocations]
    try:
        found = slurm_accounting(path, jobs)
    except SchedulerError as exc:
        return {"accounting": True, "jobs": {}, "error": str(exc)}
    if found is None:
        return {"accounting": False, "jobs": {}}
    ended = {row.job for row in figures.allocations if not row.live}
    return {"accounting": True, "jobs": found, "missing": [job for job in jobs if job not in found],
            "not_final": [job for job in jobs if job in found and job in ended and not found[job]["final"]]}


def accounting_table(section: dict[str, Any]) -> Table:
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, title="Slurm accounting (sacct)")
    columns = ("job", "state", "elapsed", "nodes", "CPUs", "GPUs", "node-hours", "GPU-hours", "CPU time", "CPU efficiency")
    for column in columns:
        table.add_column(column, justify="left" if column in ("job", "state") else "right", no_wrap=True)
    for row in section["jobs"].values():
        efficiency = "?" if row["cpu_efficiency"] is None else f"{100 * row['cpu_efficiency']:.0f}%"
        cpu_time = "?" if row["cpu_seconds"] is None else f"{row['cpu_seconds']:.1f} s"
        state = row["state"] if row["final"] else f"{row['state'] or '?'} (so far)"
        table.add_row(row["job"], state, f"{row['elapsed_seconds']:.0f} s", str(row["nodes"]), str(row["cpus"]),
                      str(row["gpus"]), f"{row['node_hours']:.2f}", f"{row['gpu_hours']:.2f}", cpu_time, efficiency)
    for job in section["missing"]:
        table.add_row(job, "no record", *["?"] * (len(columns) - 2))
    return table


def print_sacct(section: dict[str, Any]) -> None:
    if not section["accounting"]:
        err_console().print("sacct: this cluster keeps no job accounting (AccountingStorageType none, or not "
                            "Slurm): only the event log's figures", markup=False)
        return
    if "error" in section:
        err_console().print(f"sacct: could not read Slurm's accounting: {section['error']}", markup=False)
        return
    out_console().print(accounting_table(section))
    for job in section["missing"]:
        err_console().print(f"sacct: no record of job {job} (slurmdbd hears of a job a few seconds after it "
                            "starts or ends, so ask again shortly; or its record was purged)", markup=False)
    for job in section["not_final"]:
        state = section["jobs"][job]["state"] or "?"
        err_console().print(f"sacct: job {job} has ended but its record still says {state}: its figures are not "
                            "final yet (slurmdbd lags the controller by a few seconds)", markup=False)


@click.command("usage", cls=JsonCommand)
@_DIR
@JSON_OPTION
@click.option("--sacct", "with_sacct", is_flag=True,
              help="Also ask Slurm's accounting (one sacct call) for each job's state, elapsed time, CPUs, "
                   "GPUs and CPU time; says so when the cluster keeps no accounting, and per job when sacct "
                   "has no record of it yet or its record is not final.")
@failures_as_click
def usage_cmd(directory: Path | None, as_json: bool, with_sacct: bool) -> None:
    """What the run held, per allocation and in total: node-hours (each node
    from its agent's start to its leaving; a live one up to now) and GPU-hours
    held (node-hours times GPUs per node) and idle (held while no Ray task or
    actor had them, as each node's agent measured it once a minute).

    "?" is a figure the event log does not tell (its oldest lines may be
    gone); "live" an allocation that has not ended.
    """
    path = session_path(directory)
    history, skipped = read_history(path)
    figures = usage(history, live_idle(path, history))
    section = sacct_section(path, figures) if with_sacct else None
    if as_json:
        fields: dict[str, Any] = {"session": str(path), "now": round(history.now, 3), **figures.to_dict(),
                                  "skipped_lines": skipped}
        if section is not None:
            fields["sacct"] = section
        echo_json("session usage", fields)
        return
    _warn_skipped(skipped)
    out_console().print(usage_table(figures))
    if figures.partial:
        err_console().print("note: some figures are incomplete: the event log lacks a node's start or an "
                            "allocation's GPU count", markup=False)
    if section is not None:
        print_sacct(section)
