"""How busy this node's GPUs are, in Ray's own terms, sampled cheaply.

Every Ray node exports its metrics on ``--metrics-export-port`` (the node's
metrics agent, in Prometheus text). Its ``ray_resources`` gauge says, for
this node's raylet, how much of each resource is USED (held by a task or an
actor) and AVAILABLE. An agent reads the GPU lines of that page once a
minute (one local HTTP request; measured at about 1 ms and a few KB) and
integrates them into GPU-seconds held and idle (:class:`UsageMeter`), which
it publishes in its node file and in its ``node_left`` event. Ray refreshes
the page every 10 s (its ``metrics_report_interval_ms``), so a busy spell
is seen up to that much late; over hours that washes out. "Idle" is
Ray's view: a GPU no task or actor asked for. A task that holds a GPU and
does not use it counts as busy; only the GPU's own counters could tell.

:func:`parse_gpu_load` and :class:`UsageMeter` are pure; :func:`read_gpu_load`
and :class:`GpuSampler` (a small thread) are the effects.
"""

from __future__ import annotations

import re
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from ...protocol.disk.records import GpuUsage

SAMPLE_INTERVAL = 60.0
READ_TIMEOUT = 1.0
#: A gap longer than this many intervals (the metrics agent was not there,
#: the node was not joined) is not counted: no one knows what it held then.
MAX_GAP_INTERVALS = 2.5

_LINE = re.compile(r'^ray_resources\{(?P<labels>[^}]*)\}\s+(?P<value>[-+0-9.eEinfNa]+)\s*$')
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


@dataclass(frozen=True)
class GpuLoad:
    """One look: GPUs this node's Ray holds for tasks (``used``) and has free (``available``)."""

    used: float
    available: float

    @property
    def total(self) -> float:
        return self.used + self.available


def parse_gpu_load(text: str) -> GpuLoad | None:
    """The raylet's GPU figures from a metrics page; None when it has none (no GPU, not yet exported)."""
    used = available = None
    for line in text.splitlines():
        match = _LINE.match(line)
        if match is None:
            continue
        labels = dict(_LABEL.findall(match.group("labels")))
        if labels.get("Name") != "GPU" or labels.get("Component", "raylet") != "raylet":
            continue
        try:
            value = float(match.group("value"))
        except ValueError:
            continue
        if value != value or value < 0:      # NaN or negative: not a reading
            continue
        if labels.get("State") == "USED":
            used = (used or 0.0) + value
        elif labels.get("State") == "AVAILABLE":
            available = (available or 0.0) + value
    if used is None and available is None:
        return None
    return GpuLoad(used or 0.0, available or 0.0)


@dataclass(frozen=True)
class UsageMeter:
    """GPU-seconds held and idle, integrated over looks.

    Each look counts for the time since the one before (what is seen now is
    taken to have held since then), but only when that time is at most
    :data:`MAX_GAP_INTERVALS` intervals; the first look, and the first after
    a gap, only starts the count.
    """

    interval: float = SAMPLE_INTERVAL
    usage: GpuUsage = GpuUsage()
    last_at: float | None = None

    def add(self, now: float, load: GpuLoad | None) -> "UsageMeter":
        if load is None:
            return replace(self, last_at=None)       # a gap: the next look starts again
        usage = self.usage
        if self.last_at is not None and 0 < now - self.last_at <= MAX_GAP_INTERVALS * self.interval:
            elapsed = now - self.last_at
            usage = replace(usage, held_gpu_seconds=usage.held_gpu_seconds + load.total * elapsed,
                            idle_gpu_seconds=usage.idle_gpu_seconds + max(load.available, 0.0) * elapsed)
        usage = replace(usage, samples=usage.samples + 1, first_at=usage.first_at if usage.first_at else now,
                        last_at=now)
        return replace(self, usage=usage, last_at=now)


MAX_PAGE_BYTES = 4 * 1024 * 1024


def read_gpu_load(port: int, host: str = "127.0.0.1", timeout: float = READ_TIMEOUT) -> GpuLoad | None:
    """One look at the node's metrics page; None when it cannot be read or has no GPU lines.

    A bare HTTP/1.0 GET on a socket: ``urllib`` would pull ``http.client``
    and ``email`` into every agent (tests/test_agent_start_imports.py keeps
    the agent's imports lean), for one request to a local page.
    """
    deadline = time.monotonic() + timeout
    try:
        with socket.create_connection((host, port), timeout=timeout) as conn:
            conn.sendall(f"GET /metrics HTTP/1.0\r\nHost: {host}:{port}\r\nAccept: text/plain\r\n\r\n".encode())
            chunks, size = [], 0
            while size <= MAX_PAGE_BYTES:
                conn.settimeout(max(deadline - time.monotonic(), 0.01))
                chunk = conn.recv(65536)
                if not chunk:
                    break
                chunks.append(chunk)
                size += len(chunk)
    except OSError:
        return None
    head, _, body = b"".join(chunks).partition(b"\r\n\r\n")
    status = head.split(b"\r\n", 1)[0].split()
    if len(status) < 2 or status[1] != b"200":
        return None
    return parse_gpu_load(body.decode("utf-8", "replace"))


class GpuSampler:
    """Looks every ``interval`` s while ``port()`` names a metrics port (the node is in the run)."""

    def __init__(self, port: Callable[[], int | None], *, interval: float = SAMPLE_INTERVAL, host: str = "127.0.0.1",
                 clock: Callable[[], float] = time.time) -> None:
        self._port, self._host, self._clock = port, host, clock
        self._meter = UsageMeter(interval)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="agent-gpu-load", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=READ_TIMEOUT + 1)

    def usage(self) -> GpuUsage | None:
        """What was measured so far; None before the first look that saw GPUs."""
        with self._lock:
            return self._meter.usage if self._meter.usage.samples else None

    def look(self) -> None:
        port = self._port()
        load = None if port is None else read_gpu_load(port, self._host)
        with self._lock:
            self._meter = self._meter.add(self._clock(), load)

    def _run(self) -> None:
        while not self._stop.wait(self._meter.interval):
            try:
                self.look()
            except Exception:     # a look must never end the agent; the next one tries again
                with self._lock:
                    self._meter = self._meter.add(self._clock(), None)
