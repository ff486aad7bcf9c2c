"""`elastic-agent status`: what every agent on this node is doing.

Each agent keeps a small JSON file in a node-local runtime directory and
rewrites it on every state change and every few seconds. ``status`` reads
those files, so it works without arguments, needs no session path, and
still answers when an agent is hung or dead: it then says so, judging by
the recorded PID (with its start time, since PIDs are reused) and by how old
the file is.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from ..atomic import atomic_write_json, read_json

# An agent rewrites its file at least this often while it runs; a live PID
# with an older file means the agent is stuck.
REFRESH_SECONDS = 5.0
HUNG_AFTER_SECONDS = 30.0
# `status` hides agents that exited longer ago than this (--all shows them).
RECENT_EXIT_SECONDS = 3600.0
# Agents delete status files of agents that ended longer ago than this.
PRUNE_AFTER_SECONDS = 7 * 86400.0


def runtime_dir() -> Path:
    """Node-local directory for status files (a Slurm node's /tmp is its own)."""
    configured = os.environ.get("ELASTIC_AGENT_RUNTIME_DIR")
    return Path(configured) if configured else Path(f"/tmp/elastic-agent-{os.getuid()}")


def status_path(job_id: str, node: str, pid: int) -> Path:
    return runtime_dir() / f"{job_id}.{node}.{pid}.json"


def write_status(path: Path, status: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
    atomic_write_json(path, status, mode=0o644)


@dataclass(frozen=True)
class AgentView:
    """One agent as ``status`` reports it."""

    status: dict[str, Any]
    liveness: str  # "running", "not responding", "exited", "dead"
    path: Path

    def to_dict(self) -> dict[str, Any]:
        return {**self.status, "liveness": self.liveness, "status_file": str(self.path)}


def judge_liveness(status: dict[str, Any], now: float, pid_alive: bool) -> str:
    """Pure: what the recorded status plus the PID check say about an agent."""
    state = str(status.get("state", ""))
    if state in ("LEFT", "RELEASED", "FAILED") and status.get("exited"):
        return "exited"
    if not pid_alive:
        return "dead"
    updated = status.get("updated_at")
    if isinstance(updated, (int, float)) and now - updated > HUNG_AFTER_SECONDS:
        return "not responding"
    return "running"


def _pid_alive(status: dict[str, Any]) -> bool:
    pid, created = status.get("pid"), status.get("pid_create_time")
    if not isinstance(pid, int):
        return False
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        return not isinstance(created, (int, float)) or abs(proc.create_time() - created) < 1.0
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


def collect(directory: Path | None = None, now: float | None = None) -> list[AgentView]:
    directory = directory or runtime_dir()
    now = time.time() if now is None else now
    views: list[AgentView] = []
    for path in sorted(directory.glob("*.json")) if directory.is_dir() else []:
        try:
            data = read_json(path)
        except Exception as exc:  # a damaged file is reported, not fatal
            views.append(AgentView({"error": f"unreadable status file: {exc}"}, "unknown", path))
            continue
        if not isinstance(data, dict):
            views.append(AgentView({"error": "status file is not an object"}, "unknown", path))
            continue
        views.append(AgentView(data, judge_liveness(data, now, _pid_alive(data)), path))
    return views


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = max(0.0, seconds)
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"


def _clock(when: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(when))


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _when(at: float | None, now: float) -> str:
    """``in 3m (12:40:05)`` or ``12s ago (12:36:53)``."""
    if at is None:
        return "-"
    if at >= now:
        return f"in {_age(at - now)} ({_clock(at)})"
    return f"{_age(now - at)} ago ({_clock(at)})"


def select(views: list[AgentView], *, job: str | None = None, show_all: bool = False,
           now: float | None = None) -> tuple[list[AgentView], int]:
    """Pure: the views ``status`` shows, and how many exited ones it hides.

    Status files stay after an agent exits (so a node still tells what its
    last agents did), which makes a busy node's list long: by default agents
    that exited more than :data:`RECENT_EXIT_SECONDS` ago are left out.
    """
    now = time.time() if now is None else now
    shown, hidden = [], 0
    for view in views:
        if job is not None and str(view.status.get("job_id")) != job:
            continue
        updated = _number(view.status.get("updated_at"))
        if (not show_all and view.liveness == "exited" and updated is not None
                and now - updated > RECENT_EXIT_SECONDS):
            hidden += 1
            continue
        shown.append(view)
    return shown, hidden


def render_text(views: list[AgentView], now: float | None = None, hidden: int = 0) -> str:
    """Human-readable report: one block per agent."""
    now = time.time() if now is None else now
    if not views:
        text = f"no elastic-agent has run on this node (no status files in {runtime_dir()})"
        if hidden:
            text = f"no agent to show ({hidden} that exited earlier are hidden; --all shows them)"
        return text
    lines = []
    for view in views:
        s = view.status
        if "error" in s:
            lines.append(f"{view.path.name}: {s['error']}")
            continue
        role = s.get("role")
        ports = s.get("ports") or {}
        port_text = " ".join(f"{k}={v}" for k, v in sorted(ports.items()) if v) or "-"
        since = _number(s.get("since"))
        state = f"{s.get('state')}" + (f" for {_age(now - since)}" if since is not None else "")
        if role == "head":
            head = f"{s.get('head_job') or '-'} (this agent's own job) at {s.get('ray_address') or '-'}"
        else:
            head = f"{s.get('head_job') or '-'} at {s.get('head_address') or '-'}"
        ray = s.get("node_id") or "-"
        pids = [f"{name} pid {s[key]}" for name, key in (("ray start", "ray_pid"), ("raylet", "raylet_pid"))
                if s.get(key)]
        if pids:
            ray += f" ({', '.join(pids)})"
        restarts = f"{s.get('restarts', 0)} (Ray ended {s.get('failures', 0)} times under this head"
        if s.get("max_restarts") is not None:
            restarts += f"; {s.get('max_restarts')} restarts allowed"
        restarts += ")"
        retry = _number(s.get("next_retry_at"))
        if retry is not None:
            restarts += f", next start {_when(retry, now)}"
        if s.get("gave_up_on"):
            restarts += f"; gave up on head {s.get('gave_up_on')}"
        drain = _number(s.get("drain_deadline"))
        no_head = _number(s.get("no_head_since"))
        started, updated = _number(s.get("started_at")), _number(s.get("updated_at"))
        block = [
            f"job {s.get('job_id')} node {s.get('node')} role {role}  [{view.liveness}]",
            f"  state      {state} ({s.get('reason', '')})",
            f"  head job   {head}",
            f"  ray node   {ray}",
            f"  ports      {port_text}; agent {s.get('control') or '-'}",
            f"  restarts   {restarts}",
            "  drain      " + (f"deadline {_when(drain, now)}" if drain is not None else "-"),
        ]
        if no_head is not None and s.get("state") in ("WAITING_FOR_HEAD", "GAVE_UP"):
            rejoin = _number(s.get("rejoin_timeout"))
            block.append(f"  no head    since {_when(no_head, now)}"
                         + (f"; releases the allocation {_when(no_head + rejoin, now)}" if rejoin else ""))
        block.append(f"  uptime     {_age(now - started) if started is not None else '-'}, pid {s.get('pid')}, "
                     f"updated {_age(now - updated) if updated is not None else '-'} ago"
                     + (f", exit code {s.get('exit_code')}" if s.get("exited") else ""))
        recent = [t for t in s.get("transitions") or [] if isinstance(t, dict)][-4:]
        for index, t in enumerate(recent):
            at = _number(t.get("at"))
            block.append(f"  {'recent' if index == 0 else '':<10} {_clock(at) if at is not None else '?'} "
                         f"{t.get('from')}->{t.get('to')}: {t.get('reason')}")
        requests = s.get("requests")
        if isinstance(requests, dict) and requests.get("rejected"):
            block.append(f"  requests   {requests.get('accepted', 0)} accepted, {requests.get('rejected')} rejected "
                         f"{requests.get('rejected_by_reason') or ''}")
        hosted = s.get("hosted_head")
        if isinstance(hosted, dict):
            at = _number(hosted.get("at"))
            block.append(f"  hosted     a head for the run: {hosted.get('state')}"
                         + (f" at {hosted['address']}" if hosted.get("address") else "")
                         + (f" since {_clock(at)}" if at is not None else "")
                         + (f" ({hosted['reason']})" if hosted.get("reason") else ""))
        handover = _number(s.get("handover_deadline"))
        if handover is not None:
            block.append(f"  handover   keeps the run's head until the session moves it, at most {_when(handover, now)}")
        block.append(f"  session    {s.get('session')}")
        lines.append("\n".join(block))
    if hidden:
        lines.append(f"({hidden} agents that exited more than {_age(RECENT_EXIT_SECONDS)} ago are hidden; "
                     "--all shows them)")
    return "\n".join(lines)


def render_json(views: list[AgentView]) -> str:
    return json.dumps([v.to_dict() for v in views], indent=2, sort_keys=True)


def prune(directory: Path | None = None, now: float | None = None, max_age: float = PRUNE_AFTER_SECONDS) -> int:
    """Delete the files of agents that exited more than ``max_age`` ago
    (called by every agent at start, so a node's list does not grow forever);
    returns how many went."""
    directory = directory or runtime_dir()
    now = time.time() if now is None else now
    removed = 0
    for view in collect(directory, now):
        updated = _number(view.status.get("updated_at"))
        if view.liveness in ("exited", "dead") and updated is not None and now - updated > max_age:
            try:
                view.path.unlink()
                removed += 1
            except OSError:
                pass
    return removed
