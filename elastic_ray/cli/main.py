"""`elastic-ray`: the user's command line.

Commands that wait show progress; every error is one clear line naming the
bad argument, with exit status 2 for usage errors and 1 for failures.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

import click
from rich.console import Console

from .. import __version__, knobs
from .autoscale import autoscale_cmd
from .create import create_cmd, render_cmd
from .events_cmd import events_cmd
from .history import timeline_cmd, usage_cmd
from .dashboard import dashboard_cmd
from .session import session_group
from ..errors import ElasticRayError
from ..log_format import FORMATS, formatter
from ..scheduler.factory import KINDS, make_scheduler


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="elastic-ray")
@click.option("--log-format", envvar=knobs.LOG_FORMAT.name, type=click.Choice(FORMATS),
              default=knobs.LOG_FORMAT.default, show_default=True,
              help=f"Log lines on stderr as text or one JSON object each [${knobs.LOG_FORMAT.name}]; "
                   "results and progress are not log lines (see --json).")
def main(log_format: str) -> None:
    """Elastic Ray clusters on Slurm."""
    if log_format == "json":
        # Text keeps Python's own last-resort handler (warnings and errors, message only).
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(formatter("json"))
        handler.setLevel(logging.WARNING)
        logging.getLogger().addHandler(handler)


@main.command()
@click.option("--scheduler", type=click.Choice(KINDS), default="local", show_default=True,
              help="local: the embedded emulation (no Slurm needed); slurm: the real Slurm CLI.")
@click.option("--workdir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where job scripts and outputs go (must be on a filesystem every node sees). "
                   "Default: ./demo-session")
@click.option("--sleep", type=click.FloatRange(min=0, max=600), default=6.0, show_default=True,
              help="How long each node's command runs.")
@click.option("--allocations-only", is_flag=True,
              help="Only the scheduler part: three allocations watched as a table (no Ray).")
def demo(scheduler: str, workdir: Path | None, sleep: float, allocations_only: bool) -> None:
    """An elastic Ray run: workers join and leave, the head fails over, the payload finishes."""
    from ..demo.allocations import run_demo

    console = Console(width=None if sys.stdout.isatty() else 130)
    workdir = (workdir or Path.cwd() / "demo-session").absolute()
    if not allocations_only:
        from ..demo.main_demo import run_main_demo

        try:
            ok = run_main_demo(scheduler, workdir, console)
        except ElasticRayError as exc:
            raise click.ClickException(str(exc)) from None
        console.print("[green]demo passed[/]" if ok else "[red]demo failed[/]")
        sys.exit(0 if ok else 1)
    try:
        sched = make_scheduler(scheduler, state_dir=workdir / "local-scheduler",
                               slurm_conf=os.environ.get("SLURM_CONF"))
        final = run_demo(sched, workdir, console, sleep=sleep)
    except ElasticRayError as exc:
        raise click.ClickException(str(exc)) from None
    console.print("final states: " + ", ".join(f"{k}: {v.value}" for k, v in final.items()))
    expected = {"cpu x2": "COMPLETED", "gpu-a 2 GPUs": "COMPLETED", "gpu-a 4 GPUs": "CANCELLED"}
    if {k: v.value for k, v in final.items()} != expected:
        console.print(f"[red]unexpected final states; expected {expected}[/]")
        sys.exit(1)


session_group.add_command(create_cmd)
session_group.add_command(autoscale_cmd)
session_group.add_command(events_cmd)
session_group.add_command(timeline_cmd)
session_group.add_command(usage_cmd)
session_group.add_command(dashboard_cmd)
main.add_command(session_group)
main.add_command(render_cmd)


if __name__ == "__main__":  # pragma: no cover
    main()
