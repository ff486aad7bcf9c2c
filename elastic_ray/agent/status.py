"""`elastic-agent status`: what every agent on this node is doing.

Each agent keeps a small JSON file in a node-local runtime directory and
rewrites it on every state change and every few seconds. ``status`` reads
those files, so it works without arguments, needs no session path, and
still answers when an agent is hung or dead: it then says so, judging by
the recorded PID (with its start time, since PIDs are reused) and by how old
the file is.

A status file holds the same record the agent publishes in the session
directory (:class:`NodeState`), read and validated the same way; one that
fails validation is shown as unreadable, never trusted in part.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from .. import defaults, knobs
from ..atomic import atomic_write_json, read_record
from ..errors import CorruptFileError, UnsafePathError
from ..protocol.disk.records import AgentState, HostedHeadState, NodeState
from .node.private_dirs import ensure_private_dir, user_runtime_dir

# An agent rewrites its file at least this often while it runs (and at
# every state change); a live PID with a file older than HUNG_AFTER_SECONDS
# means the agent is stuck: three missed refreshes, not one slow disk. A
# rewrite may come up to STATUS_SLACK early, on a wakeup the agent has
# anyway (see agent.wakeups). 20 s, not 10: the two rewrites (this file and
# the session's node file) were about a quarter of an idle agent's CPU
# (py-spy, issue 11), and nothing reads freshness finer than "hung".
REFRESH_SECONDS = defaults.STATUS_REFRESH
STATUS_SLACK = 2.0
HUNG_AFTER_SECONDS = defaults.AGENT_STALE_AFTER
# `status` hides agents that exited longer ago than this (--all shows them).
RECENT_EXIT_SECONDS = defaults.STATUS_HIDE_EXITED_AFTER
# Agents delete status files of agents that ended longer ago than this.
PRUNE_AFTER_SECONDS = 7 * 86400.0


def runtime_dir() -> Path:
    """Node-local directory for status files (a Slurm node's /tmp is its own).

    One per user, mode 0700 (see ``private_dirs``): other users can neither
    read what our agents do nor plant files for ``status`` to show.
    """
    configured = knobs.RUNTIME_DIR.read()
    return Path(configured) if configured else user_runtime_dir()


def status_path(job_id: str, node: str, pid: int) -> Path:
    return runtime_dir() / f"{job_id}.{node}.{pid}.json"


def write_status(path: Path, state: NodeState) -> None:
    """Replace the status file (atomic: a planted symlink or FIFO under its
    name is replaced, never followed or opened).

    Not fsynced: the file describes a running process on this node, so a
    power loss that could undo the rename also ends the process it
    describes; a rename survives any crash of the agent itself. Two fsyncs
    every refresh were most of an idle agent's disk work."""
    ensure_private_dir(path.parent)
    atomic_write_json(path, state.to_dict(), mode=0o600, durable=False)


def read_status(path: Path) -> NodeState:
    """One status file, validated. CorruptFileError for any malformed content
    or anything but a regular file (read without following a symlink and
    without blocking on a FIFO); FileNotFoundError when gone."""
    return read_record(path, NodeState.from_dict)


@dataclass(frozen=True)
class AgentView:
    """One agent as ``status`` reports it: its record, or why there is none."""

    status: NodeState | None
    liveness: str  # "running", "not responding", "exited", "dead"; "unknown" without a record
    path: Path
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        if self.status is None:
            return {"error": self.error, "liveness": self.liveness, "status_file": str(self.path)}
        return {**self.status.to_dict(), "liveness": self.liveness,
                "shown_state": shown_state(self.status, self.liveness), "status_file": str(self.path)}


_ENDED = frozenset({AgentState.LEFT, AgentState.RELEASED, AgentState.FAILED})


def judge_liveness(status: NodeState, now: float, pid_alive: bool) -> str:
    """Pure: what the recorded status plus the PID check say about an agent."""
    if status.state in _ENDED and status.exited:
        return "exited"
    if not pid_alive:
        return "dead"
    if now - status.updated_at > HUNG_AFTER_SECONDS:
        return "not responding"
    return "running"


def shown_state(status: NodeState, liveness: str) -> str:
    """Pure: the state ``status`` shows for an agent, never a dead agent's last word.

    The file keeps whatever the agent wrote last: one killed while JOINED
    says JOINED forever. With its process gone it is ``DEAD``, naming the
    PID and the state it last recorded; a live process that stopped
    rewriting its file is ``NOT RESPONDING``. Otherwise the recorded state.
    """
    state = status.state.value
    if liveness == "dead":
        return f"DEAD (agent pid {status.pid} gone; last state {state})"
    if liveness == "not responding":
        return f"NOT RESPONDING (agent pid {status.pid} alive, file not refreshed; last state {state})"
    return state


def _pid_alive(status: NodeState) -> bool:
    try:
        proc = psutil.Process(status.pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        created = status.pid_create_time
        return created is None or abs(proc.create_time() - created) < 1.0
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


def collect(directory: Path | None = None, now: float | None = None) -> list[AgentView]:
    """Every status file in ``directory`` (default: this user's runtime dir).

    UnsafePathError when the directory is not ours alone (its files could be
    anyone's); an absent directory means no agent ran here.
    """
    directory = directory or runtime_dir()
    now = time.time() if now is None else now
    views: list[AgentView] = []
    if not os.path.lexists(directory):
        return views
    ensure_private_dir(directory, create=False)
    for path in sorted(directory.glob("*.json")):
        try:
            state = read_status(path)
        except FileNotFoundError:
            continue   # pruned or replaced while we listed
        except (CorruptFileError, OSError) as exc:  # a damaged (or newer elastic-ray's) file is reported, not fatal
            reason = exc.reason if isinstance(exc, CorruptFileError) else str(exc)   # the path is shown apart
            views.append(AgentView(None, "unknown", path, error=f"unreadable status file: {reason}"))
            continue
        views.append(AgentView(state, judge_liveness(state, now, _pid_alive(state)), path))
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
        if job is not None and (view.status is None or view.status.job_id != job):
            continue
        if (not show_all and view.liveness == "exited" and view.status is not None
                and now - view.status.updated_at > RECENT_EXIT_SECONDS):
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
        if s is None:
            lines.append(f"{view.path.name}: {view.error}")
            continue
        port_text = " ".join(f"{k}={v}" for k, v in sorted(s.ports.items()) if v) or "-"
        shown = shown_state(s, view.liveness)
        state = (f"{s.state.value} for {_age(now - s.since)}" if shown == s.state.value
                 else f"{shown}, recorded {_age(now - s.updated_at)} ago")
        if s.role == "head":
            head = f"{s.head_job or '-'} (this agent's own job) at {s.ray_address or '-'}"
        else:
            head = f"{s.head_job or '-'} at {s.head_address or '-'}"
        ray = s.node_id or "-"
        pids = [f"{name} pid {pid}" for name, pid in (("ray start", s.ray_pid), ("raylet", s.raylet_pid)) if pid]
        if pids:
            ray += f" ({', '.join(pids)})"
        restarts = (f"{s.restarts} (Ray ended {s.failures} times under this head; "
                    f"{s.max_restarts} restarts allowed)")
        if s.next_retry_at is not None:
            restarts += f", next start {_when(s.next_retry_at, now)}"
        if s.gave_up_on:
            restarts += f"; gave up on head {s.gave_up_on}"
        block = [
            f"job {s.job_id} node {s.node} role {s.role}  [{view.liveness}]",
            f"  state      {state} ({s.reason})",
            f"  head job   {head}",
            f"  ray node   {ray}",
            f"  ports      {port_text}; agent {s.control or '-'}",
            f"  restarts   {restarts}",
            "  drain      " + (f"deadline {_when(s.drain_deadline, now)}" if s.drain_deadline is not None else "-"),
        ]
        if s.no_head_since is not None and s.state in (AgentState.WAITING_FOR_HEAD, AgentState.GAVE_UP):
            release = s.no_head_since + s.rejoin_timeout
            block.append(f"  no head    since {_when(s.no_head_since, now)}"
                         + (f"; releases the allocation {_when(release, now)}" if s.rejoin_timeout else ""))
        block.append(f"  uptime     {_age(now - s.started_at)}, pid {s.pid}, updated {_age(now - s.updated_at)} ago"
                     + (f", exit code {s.exit_code}" if s.exited else ""))
        for index, t in enumerate(s.transitions[-4:]):
            block.append(f"  {'recent' if index == 0 else '':<10} {_clock(t.at)} "
                         f"{t.from_state.value}->{t.to_state.value}: {t.reason}")
        if s.requests.rejected:
            block.append(f"  requests   {s.requests.accepted} accepted, {s.requests.rejected} rejected "
                         f"{dict(s.requests.rejected_by_reason) or ''}")
        hosted = s.hosted_head
        if hosted is not None:
            what = "a standby head (not the run's head)" if hosted.state is HostedHeadState.STANDBY \
                else "a head for the run"
            block.append(f"  hosted     {what}: {hosted.state.value}"
                         + (f" at {hosted.address}" if hosted.address else "")
                         + f" since {_clock(hosted.at)}"
                         + (f" ({hosted.reason})" if hosted.reason else ""))
        if s.handover_deadline is not None:
            block.append("  handover   keeps the run's head until the session moves it, "
                         f"at most {_when(s.handover_deadline, now)}")
        block.append(f"  session    {s.session}")
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
        if view.status is None and (view.path.is_symlink() or not view.path.is_file()):
            # A link or FIFO under a status file's name: never an agent's (they
            # write regular files by rename), so it goes.
            try:
                view.path.unlink()
                removed += 1
            except OSError:
                pass
            continue
        if (view.liveness in ("exited", "dead") and view.status is not None
                and now - view.status.updated_at > max_age):
            try:
                view.path.unlink()
                removed += 1
            except OSError:
                pass
    return removed


def prune_in_background() -> threading.Thread:
    """:func:`prune` on a thread of its own, so the agent's ``ray start`` never
    waits for it: it reads every status file of the node (hundreds on a busy
    one, 0.2-0.3 s measured), and nothing about the start depends on it."""
    def run() -> None:
        try:
            prune()
        except (OSError, UnsafePathError) as exc:
            logging.getLogger("elastic_ray.agent").warning("event=status_prune_failed error=%s", exc)

    thread = threading.Thread(target=run, name="agent-prune", daemon=True)
    thread.start()
    return thread
