"""`elastic-ray session dashboard`: the SSH command that brings the head's Ray dashboard to a laptop.

A thin shell around :mod:`.dashboard_model`: it reads ``ray_head`` and that
job's ``head.json`` afresh on every call (the head may have moved since the
last one), needs no scheduler, and prints one command line on stdout, so
``$(elastic-ray session dashboard DIR)`` can be pasted or run. Hints go to
stderr.

There is no ``--open``: the command runs on the cluster side (where the
session directory is), while the browser is on the laptop, which must start
the tunnel first; a browser opened here would be on the wrong machine.
"""

from __future__ import annotations

import shlex
import socket
from pathlib import Path

import click

from ..protocol.disk.session_dir import SessionDir
from .dashboard_model import DEFAULT_LOCAL_PORT, locate_dashboard, tunnel_argv
from .output import JSON_OPTION, JsonCommand, echo_json, err_console, failures_as_click, session_directory


def this_host() -> str:
    """The login host when ``--login`` is left out: the host this command runs on,
    which sees the session directory and, normally, the compute nodes."""
    return socket.getfqdn() or socket.gethostname()


@click.command("dashboard", cls=JsonCommand)
@click.argument("directory", metavar="[DIR]", required=False, type=click.Path(file_okay=False, path_type=Path))
@click.option("--local-port", type=click.IntRange(1, 65535), default=DEFAULT_LOCAL_PORT, show_default=True,
              help="The laptop's port the dashboard appears on (http://localhost:PORT).")
@click.option("--login", "login", metavar="HOST",
              help="The host the laptop logs in to (a name, user@name or an ~/.ssh/config alias). "
                   "Default: the host this command runs on.")
@JSON_OPTION
@failures_as_click
def dashboard_cmd(directory: Path | None, local_port: int, login: str | None, as_json: bool) -> None:
    """Print the `ssh -N -L ...` command that forwards the current head's Ray
    dashboard to a laptop, through the login host.

    Run the printed command on the laptop, then open http://localhost:PORT.
    The head is looked up on every call, so after a head moved, run this
    again for the new tunnel. Fails, naming what is missing, while the
    session has no ready head or when its dashboard is off.
    """
    session = SessionDir.open(session_directory(directory))
    pointer = session.read_ray_head()                 # None when absent or damaged
    endpoint = session.read_head_endpoint(pointer) if pointer else None   # None when not ready or damaged
    place = locate_dashboard(pointer, endpoint, session.info().launcher)
    if place.address is None:
        raise click.ClickException(f"no dashboard to tunnel to: {place.problem}")
    login_host = login or this_host()
    try:
        argv = tunnel_argv(place.address, local_port, login_host)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    url = f"http://localhost:{local_port}"
    if as_json:
        echo_json("session dashboard", {**place.to_dict(), "login": login_host, "local_port": local_port,
                                        "argv": argv, "command": shlex.join(argv), "url": url})
        return
    click.echo(shlex.join(argv))
    token = (f"; it asks for the Ray token: the contents of {session.ray_token_file}"
             if session.info().launcher.get("auth_mode", "token") == "token" else "")
    err_console().print(f"head job {place.head_job} on {place.head_host}: dashboard at {place.address}. "
                        f"Run the command on your laptop, then open {url}{token}", markup=False)
