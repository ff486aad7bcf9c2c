"""A run told as events, for the history tests (runs, usage, timeline, the CLI and the browser).

The run: head allocation 100 (cpu, 1 node, no GPU) from T0; worker 101
(gpu, 2 nodes x 4 GPUs) whose nodes start at T0+200 s and are still there
at NOW = T0+5600 s (1.5 h each); worker 102 (gpu-a, 1 node x 2 GPUs),
drained and removed after 1530 s on its node; the head's job fails at
T0+3600 without its node's leave line, an election names 101 (the head
moves to it), and one payload runs from T0+400 to T0+5000.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from elastic_ray.protocol.disk.events import Event, EventKind, EventSource

T0 = 1764620000.0          # 2025-12-01 20:13:20 UTC
NOW = T0 + 5600


def ev(offset: float, kind: EventKind, job: str | None = None, node: str | None = None, reason: str | None = None,
       by: EventSource = EventSource.COORDINATOR, **details: Any) -> Event:
    return Event(at=T0 + offset, kind=kind, by=by, job=job, node=node, reason=reason, details=details)


K = EventKind
AGENT = EventSource.AGENT


def scenario(t0: float = T0) -> list[Event]:
    """The run above, from ``t0`` (a run that is live now: ``scenario(time.time() - 5600)``)."""
    return [replace(e, at=e.at - T0 + t0) for e in _events()]


def _events() -> list[Event]:
    return [
        ev(0, K.SESSION_CREATED, session_id="s-1", name="er-demo", scheduler="local", layout="default"),
        ev(0, K.SUBMITTED, "100", role="head", partition="cpu", nodes=1, gpus_per_node=0, spec_id="h"),
        ev(10, K.PENDING, "100", reason="Resources"),
        ev(30, K.STARTED, "100", "cpu01", by=AGENT, role="head", pid=4242),
        ev(60, K.NODE_JOINED, "100", "cpu01", "head ready", by=AGENT, ray_node_id="aa", head_job="100"),
        ev(120, K.SUBMITTED, "101", role="worker", partition="gpu", nodes=2, gpus_per_node=4, spec_id="w1"),
        ev(200, K.STARTED, "101", "gpu01", by=AGENT, role="worker"),
        ev(200, K.STARTED, "101", "gpu02", by=AGENT, role="worker"),
        ev(240, K.NODE_JOINED, "101", "gpu01", "raylet registered", by=AGENT, head_job="100"),
        ev(245, K.NODE_JOINED, "101", "gpu02", "raylet registered", by=AGENT, head_job="100"),
        ev(300, K.SUBMITTED, "102", role="worker", partition="gpu-a", nodes=1, gpus_per_node=2, spec_id="w2"),
        ev(330, K.STARTED, "102", "a01", by=AGENT, role="worker"),
        ev(360, K.NODE_JOINED, "102", "a01", "raylet registered", by=AGENT, head_job="100"),
        ev(400, K.PAYLOAD_STARTED, name="train", run_id="r1", by=EventSource.DAGSTER),
        ev(1800, K.DRAIN_REQUESTED, "102", reason="request"),
        ev(1850, K.DRAIN_FINISHED, "102", "a01", by=AGENT),
        ev(1860, K.NODE_LEFT, "102", "a01", "drained", by=AGENT, state="LEFT", exit_code=0),
        ev(1870, K.REMOVED, "102", reason="removed by the run", state="CANCELLED"),
        ev(3600, K.FAILED, "100", reason="ended unasked", state="NODE_FAIL", resubmit=False),
        ev(3605, K.ELECTION_STARTED, reason="head lost", previous="100"),
        ev(3620, K.ELECTION_WON, "101", previous="100"),
        ev(3621, K.HEAD_MOVED, "101", previous="100"),
        ev(3650, K.NODE_JOINED, "101", "gpu01", "followed the head", by=AGENT, head_job="101", hosted=True),
        ev(5000, K.PAYLOAD_FINISHED, name="train", run_id="r1", ok=True, by=EventSource.DAGSTER),
    ]


def write_session(tmp_path, events) -> "Path":
    """A session directory as far as the history commands look: session.json, and the log by real appends."""
    from pathlib import Path

    from elastic_ray.protocol.disk import event_log

    directory = Path(tmp_path) / "session"
    directory.mkdir()
    (directory / "session.json").write_text("{}")
    for event in events:
        assert event_log.append(directory, event)
    return directory
