"""Where the current head's Ray dashboard is, and the SSH tunnel that reaches it.

Pure: no files, no sockets, no click. The session's files are read by the
caller (:mod:`.dashboard`, and ``session status``) and handed in here, so
every answer (a dashboard to tunnel to, or the one thing missing) is tested
from a table.

Why a tunnel through the login host: a compute node is seldom reachable
from a laptop, but the login host reaches the nodes and the laptop reaches
the login host. ``ssh -N -L LOCAL:NODE:PORT LOGIN`` makes the login host
open the connection to the head node's dashboard, so nothing has to run on
the compute node, and the laptop's browser opens ``http://localhost:LOCAL``.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..protocol.disk.records import HeadEndpoint

#: The laptop's port when ``--local-port`` is left out: Ray's own dashboard port.
DEFAULT_LOCAL_PORT = 8265
#: How to turn the dashboard on, said wherever it is off.
TURN_ON = ("set include_dashboard=True in the session's RayLauncher (include_dashboard = true under "
           "[launcher] in a session file) when the session is created")


@dataclass(frozen=True)
class DashboardPlace:
    """The answer for one look at the session: ``address`` (``ip:port`` of
    the current head's dashboard) or ``problem`` (why there is none), never both."""

    head_job: str | None
    head_host: str | None
    address: str | None
    problem: str | None

    def to_dict(self) -> dict[str, Any]:
        return {"head_job": self.head_job, "head_host": self.head_host, "address": self.address,
                "problem": self.problem}


def locate_dashboard(pointer: str | None, endpoint: HeadEndpoint | None,
                     launcher: Mapping[str, Any]) -> DashboardPlace:
    """The current head's dashboard: ``pointer`` is what ``ray_head`` names,
    ``endpoint`` that job's ``head.json`` (None: not written, or unreadable),
    ``launcher`` the session's launcher settings from session.json."""
    if pointer is None:
        return DashboardPlace(None, None, None, "no head yet: the session's ray_head names no job "
                                                "(its head job has not started Ray)")
    if endpoint is None or endpoint.job_id != pointer:
        return DashboardPlace(pointer, None, None, f"head job {pointer} has not published its endpoint "
                                                   f"(jobs/{pointer}/head.json): its Ray head is not ready yet")
    if endpoint.dashboard is not None:
        return DashboardPlace(pointer, endpoint.host, endpoint.dashboard, None)
    if launcher.get("include_dashboard"):
        return DashboardPlace(pointer, endpoint.host, None,
                              f"head job {pointer} published no dashboard address (its agent predates the "
                              "field); the head that follows it will")
    return DashboardPlace(pointer, endpoint.host, None, f"the dashboard is off: {TURN_ON}")


def split_address(address: str) -> tuple[str, int]:
    """``ip:port`` (or ``[v6]:port``) -> (host, port); ValueError naming it otherwise."""
    host, sep, port = address.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not sep or not host or not (port.isascii() and port.isdigit()) or not 0 < int(port) < 65536:
        raise ValueError(f"dashboard address {address!r} is not host:port")
    return host, int(port)


def check_login_host(login: str) -> str:
    """A host for ssh's last argument: a name, ``user@name`` or an alias of ~/.ssh/config.

    A value that starts with ``-`` would be read by ssh as an option, and one
    with blanks is no host: both are refused, naming ``--login``.
    """
    if not login or login.startswith("-") or any(c.isspace() for c in login) or "\x00" in login:
        raise ValueError(f"--login: {login!r} is not a host name")
    return login


def tunnel_argv(address: str, local_port: int, login: str) -> list[str]:
    """``ssh -N -L LOCAL:HOST:PORT LOGIN``: the command a laptop runs to reach ``address``.

    ``-N``: no remote command, only the forward. An IPv6 host is bracketed,
    as ssh's ``-L`` needs.
    """
    host, port = split_address(address)
    if isinstance(local_port, bool) or not isinstance(local_port, int) or not 0 < local_port < 65536:
        raise ValueError(f"--local-port: {local_port!r} is not a TCP port (1-65535)")
    target = f"[{host}]" if ":" in host else host
    return ["ssh", "-N", "-L", f"{local_port}:{target}:{port}", check_login_host(login)]


def tunnel_command(address: str, local_port: int, login: str) -> str:
    """:func:`tunnel_argv` as one line to paste into a shell."""
    return shlex.join(tunnel_argv(address, local_port, login))


def status_line(place: DashboardPlace) -> str:
    """The dashboard's line in ``session status`` (only shown when there is a head)."""
    if place.address is not None:
        return f"{place.address} (a tunnel to it: elastic-ray session dashboard)"
    return place.problem or "unknown"
