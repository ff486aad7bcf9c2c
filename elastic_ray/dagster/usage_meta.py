"""What the run held, as a ``compute.run`` materialization's metadata, in both modes.

The figures come as one :class:`~elastic_ray.history.summary.UsageSummary`:
read here from the session directory in the cluster mode, asked of the
cluster side in the SSH mode (where the event log is). :func:`figures_metadata`
is the one place that names the keys and rounds the figures, so the two
modes cannot drift apart. Only the timeline differs: a local page is a
``MetadataValue.path``; a page on the cluster is named by where it is there
(``host:/path``), with the command that copies it here.

A log that cannot be read, or an older cluster side that does not know the
call, costs the figures (one ``elastic_ray/usage_error`` key saying what
failed), never the step: the payload already ran.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dagster import MetadataValue

from ..errors import ElasticRayError
from ..history.summary import UsageSummary, draw_command, read_summary

if TYPE_CHECKING:
    from ..remote import RemoteSession

USAGE_ERROR = "elastic_ray/usage_error"


def figures_metadata(summary: UsageSummary) -> dict[str, Any]:
    """Pure: node-hours, GPU-hours held and idle (and the idle share), head moves; no timeline."""
    held, idle = summary.gpu_hours_held, summary.gpu_hours_idle
    out: dict[str, Any] = {
        "elastic_ray/node_hours": round(summary.node_hours, 4),
        "elastic_ray/gpu_hours_held": round(held, 4),
        "elastic_ray/head_moves": summary.head_moves,
    }
    if idle is not None:
        out["elastic_ray/gpu_hours_idle"] = round(idle, 4)
        if held > 0:
            out["elastic_ray/gpu_idle_share"] = round(idle / held, 4)
    return out


def _unavailable(what: str, exc: BaseException) -> dict[str, Any]:
    return {USAGE_ERROR: f"{what}: {type(exc).__name__}: {exc}"[:200]}


def usage_metadata(session: Path) -> dict[str, Any]:
    """The cluster mode: the figures from ``session``'s event log; the timeline page drawn anew there
    when the ``timeline`` extra is installed, else the command that draws it."""
    try:
        summary = read_summary(session)
    except (OSError, ValueError) as exc:
        return _unavailable(f"reading the event log of {session}", exc)
    timeline = MetadataValue.path(summary.timeline) if summary.timeline \
        else MetadataValue.text(draw_command(session))
    return {**figures_metadata(summary), "elastic_ray/timeline": timeline}


def fetch_command(host: str, user: str | None, port: int | None, remote_path: str) -> str:
    """Pure: an ``scp`` that copies a cluster-side file here (the user's ssh config does the rest)."""
    where = f"{user}@{host}" if user else host
    return shlex.join(["scp", *(["-P", str(port)] if port else []), f"{where}:{remote_path}", "."])


def remote_usage_metadata(remote: "RemoteSession") -> dict[str, Any]:
    """The SSH mode: the figures computed on the cluster side from the session's own log.

    With the ``timeline`` extra installed there, the page is drawn there
    too: ``elastic_ray/timeline`` names it as ``host:/path`` and
    ``elastic_ray/timeline_fetch`` is the command that copies it here;
    without it, the command that draws it on the cluster."""
    target = remote.conn.target
    try:
        summary = remote.usage()
    except (ElasticRayError, OSError, ValueError) as exc:   # an older cluster side: ProtocolError "unknown op"
        return _unavailable(f"usage of {remote.path} over ssh to {target.host}", exc)
    out = figures_metadata(summary)
    if summary.timeline:
        out["elastic_ray/timeline"] = MetadataValue.text(f"{target.host}:{summary.timeline}")
        out["elastic_ray/timeline_fetch"] = MetadataValue.text(
            fetch_command(target.host, target.user, target.port, summary.timeline))
    else:
        out["elastic_ray/timeline"] = MetadataValue.text(f"on {target.host}: {draw_command(remote.path)}")
    return out
