"""`elastic-ray session create` and `elastic-ray render`: a session from a TOML file.

Both read the file with :mod:`elastic_ray.config.session_file`, which checks
all of it before anything happens. ``create`` then does what
``Session.from_config`` does, without a supervisor (the command exits;
``session status`` and ``replace-head`` look after the head from then on).
``render`` only prints the batch scripts the file would submit.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from .. import defaults
from ..config.session_file import SESSION_ENV, SessionFileError, load_session_file
from ..coordinator.session import Session
from .output import JSON_OPTION, JsonCommand, Progress, err_console, echo_json, failures_as_click
from .render_plan import plan_jobs
from .session import scheduler_override

_CONFIG = click.option("--config", "config_file", required=True, metavar="FILE",
                       type=click.Path(dir_okay=False, path_type=Path), help="The session file (TOML).")
_DIR_OPTION = click.option("--dir", "directory", metavar="DIR", type=click.Path(file_okay=False, path_type=Path),
                           help=f"The session directory [default: the file's path, else ${SESSION_ENV}].")


def _usage(exc: SessionFileError) -> click.UsageError:
    # A refused file is a bad argument (exit 2), like a bad option, and says which key.
    return click.UsageError(str(exc))


@click.command("create", cls=JsonCommand)
@_CONFIG
@_DIR_OPTION
@click.option("--wait/--no-wait", default=False, show_default=True,
              help="Wait until the head is ready and print its address.")
@click.option("--timeout", type=click.FloatRange(min=0, min_open=True), default=defaults.WAIT_TIMEOUT,
              show_default=True, help="Seconds --wait waits.")
@JSON_OPTION
@click.pass_context
@failures_as_click
def create_cmd(ctx: click.Context, config_file: Path, directory: Path | None, wait: bool, timeout: float,
               as_json: bool) -> None:
    """Create a session from a TOML file, submit its head and workers, print its directory.

    Nothing is created when the file has an error (exit 2, naming the key).
    """
    try:
        sf = load_session_file(config_file)
        path = sf.directory(directory)
    except SessionFileError as exc:
        raise _usage(exc) from None
    overrides: dict[str, Any] = {"path": path, "supervise": False}
    if (scheduler := scheduler_override(ctx)) is not None:
        overrides["scheduler"] = scheduler
    session = sf.create(Session, **overrides)
    err = err_console()
    try:
        record = session.record()
        err.print(f"created session {session.job_name} in {session.path}: head job {record.head_job}, "
                  f"worker allocation(s) {', '.join(sorted(record.workers)) or 'none'}", markup=False)
        address = None
        if wait:
            with Progress(err, "waiting for the head") as progress:
                address = session.wait_for_head(timeout=timeout, progress=progress)
        if as_json:
            echo_json("session create", {"path": str(session.path), "job_name": session.job_name,
                                         "session_id": session.info.session_id,
                                         "scheduler": session.info.scheduler.get("kind"),
                                         "head_job": record.head_job, "workers": sorted(record.workers),
                                         "head_address": address})
        else:
            click.echo(str(session.path))
            if address:
                click.echo(address)
    finally:
        session.close()


@click.command("render", cls=JsonCommand)
@_CONFIG
@_DIR_OPTION
@JSON_OPTION
@failures_as_click
def render_cmd(config_file: Path, directory: Path | None, as_json: bool) -> None:
    """Print the batch scripts a session file would submit at start (head, then
    worker allocations), without submitting anything or creating the directory."""
    try:
        sf = load_session_file(config_file)
        path = sf.directory(directory)
    except SessionFileError as exc:
        raise _usage(exc) from None
    jobs = plan_jobs(sf, path)
    if as_json:
        echo_json("render", {"path": str(path), "jobs": [
            {"role": j.role, "source": j.source, "resubmit_on_failure": j.resubmit_on_failure, "script": j.script}
            for j in jobs]})
        return
    if "job_name" not in sf.create_kwargs:
        err_console().print("note: the file sets no job_name; `session create` picks a new er-XXXXXXXX name",
                            markup=False)
    for index, job in enumerate(jobs):
        if index:
            click.echo()
        click.echo(f"# ===== {job.role} allocation, from [{job.source}]"
                   + (f" (resubmit_on_failure = {job.resubmit_on_failure})" if job.resubmit_on_failure else "")
                   + " =====")
        click.echo(job.script, nl=not job.script.endswith("\n"))
