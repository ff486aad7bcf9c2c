"""`elastic-ray session autoscale`: set, stop or show a session's autoscaling policy from a shell.

The policy is stored in the session directory like ``Session.autoscale``
stores it; a supervising process of the run acts on it (this command starts
none and exits). A refused policy changes nothing and names its field
(exit 2, like a bad option).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import click

from ..config.autoscale import AutoscalePolicy
from ..config.session_file import tomllib
from ..coordinator.scaling import store
from ..coordinator.scaling.status import autoscale_status
from ..errors import ConfigError
from .output import JSON_OPTION, JsonCommand, echo_json, failures_as_click, session_directory
from .session import open_session, scheduler_override


def policy_from_toml(data: Any) -> AutoscalePolicy:
    """A policy file's content: the policy's fields at the top, or a session file's ``[autoscale]`` table."""
    if isinstance(data, dict) and "autoscale" in data:
        data = data["autoscale"]
    return AutoscalePolicy.from_dict(data)


@click.command("autoscale", cls=JsonCommand)
@click.argument("directory", metavar="[DIR]", required=False, type=click.Path(file_okay=False, path_type=Path))
@click.option("--policy", "policy_file", metavar="FILE", type=click.Path(dir_okay=False, path_type=Path),
              help="Scale with the policy in this TOML file (its fields at the top, or an [autoscale] table).")
@click.option("--off", is_flag=True, help="Stop scaling; the allocations stay as they are.")
@JSON_OPTION
@click.pass_context
@failures_as_click
def autoscale_cmd(ctx: click.Context, directory: Path | None, policy_file: Path | None, off: bool,
                  as_json: bool) -> None:
    """Set (--policy FILE) or stop (--off) the session's autoscaling; without either, show it.

    A supervising process of the run (the one that created it, a Dagster
    step, the SSH mode's detached supervisor) acts on the policy; `session
    status` shows which one.
    """
    if off and policy_file is not None:
        raise click.UsageError("give --policy FILE or --off, not both")
    session = open_session(session_directory(directory), scheduler_override(ctx))
    try:
        if policy_file is not None:
            try:
                with open(policy_file, "rb") as handle:
                    policy = policy_from_toml(tomllib.load(handle))
            except (OSError, tomllib.TOMLDecodeError) as exc:
                raise click.UsageError(f"{policy_file}: {exc}") from None
            except ConfigError as exc:
                raise click.UsageError(f"{policy_file}: {exc}") from None
            session.autoscale(policy)
        elif off:
            session.autoscale(None)
        shown = autoscale_status(session.path, session.record(), time.time())
    finally:
        session.close()
    if as_json:
        echo_json("session autoscale", {"autoscale": shown})
        return
    if shown is None or not shown["on"]:
        click.echo("autoscaling: off")
        return
    pools = ", ".join(str(p["config"].get("partition") or f"pool {i}") for i, p in enumerate(shown["policy"]["pools"]))
    click.echo(f"autoscaling: on ({pools}); run by {shown['holder'] or 'no process yet'}")


__all__ = ["autoscale_cmd", "policy_from_toml"]
