"""Who restarts Ray first when the run's head moves: the hosting node's worker.

After a head is lost every worker's Ray node has to start again against the
new head. When the nodes are separate machines that costs nothing extra: each
node starts on its own CPUs. When several nodes share one kernel (containers
on one host, the lab's namespaces, a node that runs more than one agent) they
also share its CPUs, and a dozen ``ray start`` at once make every one of them
slow, so the first task of the relaunched payload waits for all of them.

The node that hosts the new head is where capacity comes back cheapest: its
agent knows the head first (it started it) and needs no pointer read. So a
worker whose machine is the hosting node's machine waits its turn: it starts
once the hosting node's own worker has joined the new head, or after
:data:`MAX_WAIT` seconds at most, whichever comes first. Workers on other
machines, the hosting node itself, and the ``all`` order start at once.

"Same machine" is the kernel's boot id (``/proc/sys/kernel/random/boot_id``),
which the head agent publishes in its endpoint record: equal boot ids mean
one kernel and therefore one set of CPUs. A head that does not publish one
(an older agent) counts as another machine.

The decision is :func:`turn` (pure); :class:`RejoinTurn` asks it on the
thread that is about to run ``ray start``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ...polling import wait_for
from ...protocol.disk.records import AgentState
from ...protocol.disk.session_dir import SessionDir

ORDERS = ("host-first", "all")
#: The longest a worker waits for the hosting node's worker before starting
#: anyway (a host whose worker is slow or broken must not hold the others).
MAX_WAIT = 4.0
#: How often the waiting worker looks again at the host's published state.
RECHECK = 0.1
BOOT_ID_PATH = Path("/proc/sys/kernel/random/boot_id")


@dataclass(frozen=True)
class Turn:
    go: bool
    why: str


def turn(order: str, *, own_node: str, own_boot_id: str, head_job: str, host_node: str | None,
         host_boot_id: str, host_joined: bool, waited: float, host_has_worker: bool = True,
         max_wait: float = MAX_WAIT) -> Turn:
    """May this worker start its Ray node against ``head_job`` now?

    ``host_node`` is the node that runs the new head (from its endpoint),
    ``host_joined`` whether that node's own worker published JOINED to
    ``head_job``, ``host_has_worker`` False for a head allocation's node
    (nothing there to wait for), ``waited`` how long this worker has waited.
    """
    if order not in ORDERS:
        raise ValueError(f"rejoin order {order!r}: must be one of {', '.join(ORDERS)}")
    if order == "all":
        return Turn(True, "order all")
    if host_node is None:
        return Turn(True, "the head's node is unknown")
    if host_node == own_node:
        return Turn(True, "this node hosts the head")
    if not own_boot_id or host_boot_id != own_boot_id:
        return Turn(True, "the head runs on another machine")
    if not host_has_worker:
        return Turn(True, f"{host_node} runs the head only")
    if host_joined:
        return Turn(True, f"the worker on {host_node} joined head {head_job}")
    if waited >= max_wait:
        return Turn(True, f"waited {max_wait:.0f} s for the worker on {host_node}")
    return Turn(False, f"the worker on {host_node} (same machine) starts first")


def read_boot_id(path: Path = BOOT_ID_PATH) -> str:
    """This kernel's boot id; "" where there is none (then nobody waits)."""
    try:
        return path.read_text().strip()
    except OSError:
        return ""


class RejoinTurn:
    """Waits, on the start's own thread, until :func:`turn` says go.

    ``host_of(head_job)`` returns ``(host node, host boot id, host has a
    worker, host joined)``
    from the session directory; ``wanted()`` is False once the start was
    superseded (a stop or another head), which ends the wait at once.
    """

    def __init__(self, order: str, own_node: str, host_of: Callable[[str], tuple[str | None, str, bool, bool]],
                 log: Callable[..., None], *, max_wait: float = MAX_WAIT, boot_id: str | None = None):
        if order not in ORDERS:
            raise ValueError(f"rejoin order {order!r}: must be one of {', '.join(ORDERS)}")
        self.order = order
        self.own_node = own_node
        self.boot_id = read_boot_id() if boot_id is None else boot_id
        self.max_wait = max_wait
        self._host_of = host_of
        self._log = log

    def wait(self, head_job: str | None, wanted: Callable[[], bool]) -> bool:
        """True when this worker may start now, False when the start is no longer wanted."""
        if head_job is None or self.order == "all":
            return wanted()
        t0 = time.monotonic()
        logged: list[bool] = []

        def look() -> bool | None:
            if not wanted():
                return False
            host, host_boot, has_worker, joined = self._host_of(head_job)
            waited = time.monotonic() - t0
            decision = turn(self.order, own_node=self.own_node, own_boot_id=self.boot_id, head_job=head_job,
                            host_node=host, host_boot_id=host_boot, host_joined=joined, waited=waited,
                            host_has_worker=has_worker, max_wait=self.max_wait)
            if decision.go:
                if logged:
                    self._log("rejoin_turn", head_job=head_job, waited=f"{waited:.2f}s", why=decision.why)
                return True
            if not logged:
                self._log("rejoin_waits", head_job=head_job, why=decision.why)
                logged.append(True)
            return None

        # No timeout of its own: turn() says go once max_wait has passed.
        return bool(wait_for(look, timeout=None, interval=RECHECK, done=lambda v: v is not None))


def host_in(session: SessionDir) -> Callable[[str], tuple[str | None, str, bool, bool]]:
    """``host_of`` for :class:`RejoinTurn`, read from the session directory:
    the head's endpoint names its node and kernel, that node's published
    state says whether its own worker joined the head."""

    def host_of(head_job: str) -> tuple[str | None, str, bool, bool]:
        endpoint = session.read_head_endpoint(head_job)
        if endpoint is None:
            return None, "", True, False
        state = session.read_node_states(head_job).get(endpoint.host)
        has_worker = state is None or state.role == "worker"
        joined = (state is not None and state.role == "worker" and state.state is AgentState.JOINED
                  and state.head_job == head_job)
        return endpoint.host, endpoint.boot_id, has_worker, joined

    return host_of
