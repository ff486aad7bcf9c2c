"""What Ray waits for, asked of the current head's GCS in a short-lived probe.

The probe is the agent's (``python -m elastic_ray.agent.node.gcs_probe
resource-state``): a process that imports Ray, asks once and exits, killed
by its PID when it does not answer in time. So the supervising process
never imports Ray and never hangs on a GCS that went away with its head;
the price is one interpreter start (about a second of CPU) per turn. The
reply is read by :func:`elastic_ray.autoscale.demand.read_state`.
"""

from __future__ import annotations

from typing import Protocol

from ...agent.node.gcs import run_probe
from ...autoscale.demand import RayState, StateError, read_state
from ...errors import ElasticRayError
from ...protocol.disk.session_dir import SessionDir

#: Seconds a probe may take, interpreter start included.
PROBE_TIMEOUT = 15.0


class DemandUnknown(ElasticRayError):
    """No demand could be read this turn (no ready head, a probe that failed, a reply refused)."""


class DemandSource(Protocol):
    @property
    def dir(self) -> SessionDir: ...

    def ray_client_env(self) -> dict[str, str]: ...


def read_demand(session: DemandSource, timeout: float = PROBE_TIMEOUT) -> tuple[str, RayState]:
    """``(head job, Ray's state)`` of the head ``ray_head`` names now; DemandUnknown otherwise."""
    head = session.dir.read_ray_head()
    endpoint = session.dir.read_head_endpoint(head) if head else None
    if head is None or endpoint is None:
        raise DemandUnknown(f"no ready head to ask (ray_head names {head or 'none'})")
    try:
        answer = run_probe("resource-state", ["--address", endpoint.address], timeout,
                           env=session.ray_client_env())
        return head, read_state(answer.get("state") or {}, answer.get("requested"))
    except StateError as exc:
        raise DemandUnknown(f"head {head}: Ray's resource state refused: {exc}") from None
    except ElasticRayError as exc:
        raise DemandUnknown(f"head {head} at {endpoint.address}: {exc}") from None


__all__ = ["DemandUnknown", "PROBE_TIMEOUT", "read_demand"]
