"""What Ray waits for, asked of the current head's GCS by a probe process that stays.

The probe is the agent's (``python -m elastic_ray.agent.node.gcs_probe
resource-state --serve``): a process of its own that imports Ray, so the
supervising process never imports Ray and never hangs on a GCS that went
away with its head. It stays while this process holds the autoscaler's
lease and answers one line a turn, so a turn costs one GCS call, not an
interpreter start and ``import ray`` (about a second of CPU); the price is
its memory (about 80 MB measured) while the lease is held. It is started again when
the head moves (another address), when an answer is late (it is killed by
its PID: our own child), or when it says the GCS is unreachable. The reply
is read by :func:`elastic_ray.autoscale.demand.read_state`.
"""

from __future__ import annotations

import json
import logging
import os
import select
import subprocess
import time
from typing import Any, Protocol

from ...agent.node.gcs import STARTUP_ALLOWANCE, probe_argv, probe_env
from ...autoscale.demand import RayState, StateError, read_state
from ...errors import ElasticRayError
from ...protocol.disk.session_dir import SessionDir

log = logging.getLogger("elastic_ray.coordinator")

#: Seconds an answer may take (the first one includes the probe's start and its connection).
PROBE_TIMEOUT = 15.0
#: Error kinds after which the probe is started afresh (a GCS that went away, a token it lacks).
_RESTART_ON = frozenset({"unreachable", "auth", "timeout", "malformed"})


class DemandUnknown(ElasticRayError):
    """No demand could be read this turn (no ready head, a probe that failed, a reply refused)."""


class DemandSource(Protocol):
    @property
    def dir(self) -> SessionDir: ...

    def ray_client_env(self) -> dict[str, str]: ...


class DemandWatcher:
    """The probe of the head ``ray_head`` names now; :meth:`read` asks it once."""

    def __init__(self, timeout: float = PROBE_TIMEOUT):
        self.timeout = timeout
        self._proc: subprocess.Popen[bytes] | None = None
        self._key: tuple[Any, ...] | None = None
        self.starts = 0     # probes started so far (status, tests)

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    def read(self, session: DemandSource) -> tuple[str, RayState]:
        """``(head job, Ray's state)``; DemandUnknown when there is no ready head or no valid answer."""
        head = session.dir.read_ray_head()
        endpoint = session.dir.read_head_endpoint(head) if head else None
        if head is None or endpoint is None:
            self.close()
            raise DemandUnknown(f"no ready head to ask (ray_head names {head or 'none'})")
        env = session.ray_client_env()
        key = (endpoint.address, tuple(sorted(env.items())))
        if self._proc is None or self._key != key or self._proc.poll() is not None:
            self.close()
            self._start(endpoint.address, env)
            self._key = key
        answer = self._ask(head, endpoint.address)
        try:
            return head, read_state(answer.get("state") or {}, answer.get("requested"))
        except StateError as exc:
            raise DemandUnknown(f"head {head}: Ray's resource state refused: {exc}") from None

    def _start(self, address: str, env: dict[str, str]) -> None:
        argv = probe_argv("resource-state", ["--address", address, "--serve"],
                          max(1.0, self.timeout - STARTUP_ALLOWANCE))
        self._proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      stderr=subprocess.DEVNULL, env=probe_env(env), close_fds=True)
        self.starts += 1
        log.info("event=autoscale_probe_started pid=%s address=%s", self._proc.pid, address)

    def _ask(self, head: str, address: str) -> dict[str, Any]:
        proc = self._proc
        assert proc is not None and proc.stdin is not None and proc.stdout is not None
        try:
            proc.stdin.write(b"\n")
            proc.stdin.flush()
            line = _read_line(proc.stdout.fileno(), time.monotonic() + self.timeout)
        except OSError as exc:
            self.close()
            raise DemandUnknown(f"head {head} at {address}: the probe went away ({exc})") from None
        if line is None:
            self.close()
            raise DemandUnknown(f"head {head} at {address}: no answer within {self.timeout:g} s (probe stopped)")
        try:
            answer = json.loads(line)
        except ValueError:
            answer = None
        if not isinstance(answer, dict) or answer.get("op") != "resource-state" or not isinstance(answer.get("ok"),
                                                                                                   bool):
            self.close()
            raise DemandUnknown(f"head {head} at {address}: the probe answered {line[:200]!r}")
        if not answer["ok"]:
            kind = str(answer.get("error") or "error")
            if kind in _RESTART_ON:
                self.close()
            raise DemandUnknown(f"head {head} at {address}: {kind}: {answer.get('message', '')}"[:500])
        return answer

    def close(self) -> None:
        """End the probe: its stdin closes (it ends by itself), then it is killed if it lingers."""
        proc, self._proc, self._key = self._proc, None, None
        if proc is None:
            return
        try:
            if proc.stdin is not None:
                proc.stdin.close()
            proc.wait(timeout=2.0)
        except (OSError, subprocess.TimeoutExpired):
            proc.kill()               # our own child, not reaped yet: the PID is still ours
            proc.wait()
        finally:
            if proc.stdout is not None:
                proc.stdout.close()


def _read_line(fd: int, deadline: float) -> str | None:
    """One line from ``fd`` by ``deadline``; None when it did not come (or the probe ended)."""
    data = b""
    while not data.endswith(b"\n"):
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            return None
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            return None
        data += chunk
    return data.decode(errors="replace").strip()


__all__ = ["DemandUnknown", "DemandWatcher", "PROBE_TIMEOUT"]
