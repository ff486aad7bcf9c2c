"""How ``elastic-ray session status`` looks on a terminal: rich renderables. Pure.

Takes the dict of ``status_model.build_status`` and nothing else, so the
same model serves ``--json`` and the table.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rich import box
from rich.console import Group
from rich.table import Table
from rich.text import Text

from .status_model import ACTIVE_STATES

#: A Slurm reason up to this long stays next to the state (``PENDING (Resources)``);
#: a longer one (``ReqNodeNotAvail,_UnavailableNodes:...``) goes to the notes, which wrap.
SHORT_REASON = 24


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
    # "submitted" is the session's intent for every allocation it has not asked
    # to drain: next to Slurm's own state it would only repeat the obvious.
    if drain is None or drain["state"] == "submitted":
        return ""
    deadline = drain.get("deadline")
    # Once the job has ended its drain deadline no longer means anything.
    if deadline is None or job_state not in ACTIVE_STATES:
        return drain["state"]
    if deadline >= now:
        return f"{drain['state']}, deadline in {format_duration(deadline - now)}"
    return f"{drain['state']}, deadline passed {format_duration(now - deadline)} ago"


def _agent_text(node: Mapping[str, Any]) -> str:
    state = node["agent_state"] or "-"
    shown = node.get("node_state")
    if shown is not None and shown != node["agent_state"]:
        # The job is not running (or the head was replaced): never show the agent's stale JOINED.
        last = f"last {state}" + (", exited" if node["agent_exited"] else "")
        return f"{shown} ({node['node_state_reason']}; {last})"
    if node["agent_exited"]:
        return f"{state} (exited)"
    if node["agent_stale"]:
        return f"{state} (stale {format_duration(node['agent_updated_age'])})"
    return state


def _hosted_text(nodes: list[Mapping[str, Any]], now: float) -> str:
    """A note for a warm standby head (or a hosted head that failed) on one of the job's nodes."""
    states = {n.get("hosted_head") for n in nodes}
    if "STANDBY" in states:
        warm = any(n.get("hosted_head") == "STANDBY" and n.get("hosted_head_worker_pid") for n in nodes)
        return "standby head (with its worker)" if warm else "standby head"
    failed = next((n for n in nodes if n.get("hosted_head") == "FAILED"), None)
    if failed is None:
        return ""
    retry_at = failed.get("hosted_head_retry_at")
    if retry_at is None:
        return "hosted head FAILED"
    count = failed.get("hosted_head_failures") or 1
    when = f"in {format_duration(retry_at - now)}" if retry_at > now else "due"
    why = failed.get("hosted_head_reason")
    return f"hosted head FAILED {count}x in a row{f' ({why})' if why else ''}; a standby's next try {when}"


def oom_text(nodes: list[Mapping[str, Any]], job_state: str = "RUNNING", driver_steps: Sequence[str] = ()) -> str:
    """A note for processes of the job that the OOM killer ended (each node's agent
    counts its own node's part of the job), for a job Slurm ended for it, and for
    payload drivers' steps on it that Slurm ended OUT_OF_MEMORY."""
    kills = sum(n.get("oom_kills") or 0 for n in nodes)
    parts = []
    if kills:
        parts.append(f"OOM killer ended {kills} process{'es' if kills > 1 else ''} of this job (over its memory grant)")
    elif job_state == "OUT_OF_MEMORY":
        parts.append("went over its memory grant (OOM killer)")
    if driver_steps:
        parts.append(f"payload driver step{'s' if len(driver_steps) > 1 else ''} {', '.join(driver_steps)} "
                     f"ended OUT_OF_MEMORY (over the grant; OOM killer)")
    return "; ".join(parts)


def _failure_text(failure: Mapping[str, Any] | None) -> str:
    """What the state cell adds about a failed or resubmitted worker allocation."""
    if failure is None:
        return ""
    parts = []
    if failure["ended"] is not None:
        ended = failure["ended"]
        parts.append(f"ended {ended['state']} unasked" + (f" ({ended['reason']})" if ended["reason"] else ""))
    if failure["replaced_by"]:
        parts.append(f"resubmitted as {failure['replaced_by']}")
    elif failure["ended"] is not None and failure["resubmit_left"]:
        parts.append(f"to be resubmitted ({failure['resubmit_left']} left)")
    if failure["replaces"]:
        parts.append(f"replaces {failure['replaces']}")
    return "; ".join(parts)


def autoscale_lines(scale: Mapping[str, Any] | None, now: float) -> list[Text]:
    """The autoscaler's lines (none for a session that never had a policy)."""
    if scale is None:
        return []
    if not scale["on"]:
        lines = [Text.assemble(("autoscaler: ", "bold"), "off")]
    else:
        pools = scale["policy"]["pools"]
        text = f"on ({len(pools)} pool{'s' if len(pools) != 1 else ''}: " + ", ".join(
            str(p["config"].get("partition") or f"pool {i}") for i, p in enumerate(pools)) + ")"
        if scale["holder"]:
            text += f", run by {scale['holder']}"
        else:
            text += ", run by no process (no supervising process holds its lease)"
        if scale["turn_age"] is not None:
            text += f", last turn {format_duration(scale['turn_age'])} ago"
        if scale["unserved"]:
            text += f", {scale['unserved']} unserved"
        lines = [Text.assemble(("autoscaler: ", "bold"), text)]
    for note in scale["notes"]:
        lines.append(Text(f"  waiting: {note}", style="yellow"))
    if scale["recent"]:
        last = scale["recent"][-1]
        age = format_duration(max(0.0, now - last["at"])) if isinstance(last.get("at"), (int, float)) else "?"
        lines.append(Text(f"  last decision ({age} ago): {last.get('reason', '')}"))
    for error in ([scale["error"]] if scale["error"] else []) + list(scale["read_errors"]):
        lines.append(Text(f"  error: {error}", style="red"))
    return lines


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
    if (lost := head.get("election_failed")) is not None:
        extra.append(Text(f"no head can be had ({format_duration(max(0.0, now - lost['at']))} ago): {lost['reason']}",
                          style="red"))
    if head["job_id"] is not None and head.get("dashboard_note"):
        extra.append(Text.assemble(("dashboard: ", "bold"), head["dashboard_note"]))
    failures = status.get("failures") or []
    if failures:
        extra.append(Text(f"{len(failures)} worker allocation(s) ended without being asked: " + ", ".join(
            f"{f['job_id']} {f['state']}" + (f" (resubmitted as {f['replaced_by']})" if f["replaced_by"] else "")
            for f in failures), style="red"))
    extra += autoscale_lines(status.get("autoscale"), now)
    if status["election"] is not None:
        e = status["election"]
        extra.append(Text(f"election by {e['claimant']} "
                          + ("in progress" if e["live"] else "expired"), style="yellow"))

    # No vertical rules: the table stays readable when grepped or piped.
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    for column in ("role", "job", "partition", "state", "nodes", "ray node id", "agent", "time left", "notes"):
        # notes fold: a long squeue reason has no blanks to wrap at, and must never end in "…".
        table.add_column(column, no_wrap=column in ("job", "state", "ray node id"),
                         overflow="fold" if column == "notes" else "ellipsis")
    for row in status["jobs"]:
        nodes = row["nodes"]
        state = Text(row["state"], style=_STATE_STYLE.get(row["state"], "red"))
        # squeue prints "None" for a job that has no reason: nothing to show.
        reason = row["reason"] if row["state"] != "RUNNING" and row["reason"] != "None" else ""
        if reason and len(reason) <= SHORT_REASON:
            state.append(f" ({reason})", style="dim")
        failure = _failure_text(row.get("failure"))
        drain = _drain_text(row["drain"], row["state"], now)
        notes = "; ".join(t for t in (drain, failure,
                                      _hosted_text(nodes, now), oom_text(nodes, row["state"], row.get("driver_oom_steps") or ()),
                                      f"reason: {reason}" if len(reason) > SHORT_REASON else "") if t)
        table.add_row(
            row["role"], row["job_id"], row["partition"] or "-", state,
            "\n".join(n["node"] for n in nodes) or "-",
            "\n".join((n["ray_node_id"] or "-")[:12] for n in nodes) or "-",
            "\n".join(_agent_text(n) for n in nodes) or "-",
            format_duration(row["time_left"]),
            notes,
        )
    return Group(header, head_line, *extra, table)
