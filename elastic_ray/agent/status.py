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

from ..protocol.atomic import atomic_write_json, read_json

# An agent rewrites its file at least this often while it runs; a live PID
# with an older file means the agent is stuck.
REFRESH_SECONDS = 5.0
HUNG_AFTER_SECONDS = 30.0


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


def render_text(views: list[AgentView], now: float | None = None) -> str:
    """Human-readable report: one block per agent."""
    now = time.time() if now is None else now
    if not views:
        return f"no elastic-agent has run on this node (no status files in {runtime_dir()})"
    lines = []
    for view in views:
        s = view.status
        if "error" in s:
            lines.append(f"{view.path.name}: {s['error']}")
            continue
        ports = s.get("ports") or {}
        port_text = " ".join(f"{k}={v}" for k, v in sorted(ports.items()) if v) or "-"
        retry = s.get("next_retry_at")
        drain = s.get("drain_deadline")
        lines.append(
            f"job {s.get('job_id')} node {s.get('node')} role {s.get('role')}  [{view.liveness}]\n"
            f"  state      {s.get('state')} ({s.get('reason', '')})\n"
            f"  head job   {s.get('head_job') or '-'} at {s.get('head_address') or '-'}\n"
            f"  ray node   {s.get('node_id') or '-'}\n"
            f"  ports      {port_text}\n"
            f"  restarts   {s.get('restarts', 0)} (failures under this head: {s.get('failures', 0)})"
            + (f", next retry in {_age(retry - now)}" if isinstance(retry, (int, float)) else "") + "\n"
            f"  drain      " + (f"deadline in {_age(drain - now)}" if isinstance(drain, (int, float)) else "-") + "\n"
            f"  uptime     {_age(now - s['started_at']) if isinstance(s.get('started_at'), (int, float)) else '-'}"
            f", pid {s.get('pid')}, updated {_age(now - s['updated_at']) if isinstance(s.get('updated_at'), (int, float)) else '-'} ago\n"
            f"  session    {s.get('session')}"
            + (f"\n  hosted head {s.get('hosted_head')}" if s.get("hosted_head") else "")
        )
    return "\n".join(lines)


def render_json(views: list[AgentView]) -> str:
    return json.dumps([v.to_dict() for v in views], indent=2, sort_keys=True)
