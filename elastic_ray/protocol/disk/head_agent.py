"""Where to reach the agent that serves a head: one rule for both sides.

The coordinator (a failed allocation's nodes) and a worker agent (its own
node, just stopped) both send ``mark_dead`` to the agent that runs the head's
GCS. That agent wrote the head's endpoint (``jobs/<job>/head.json``: its node
and control port) and its own node file (``jobs/<job>/nodes/<node>.json``: its
exact control endpoint). Both layouts look the same here: a separate head's
agent and the first node of a worker allocation hosting the head each publish
both files under the head's job.
"""

from __future__ import annotations

from .session_dir import SessionDir


def head_control_endpoint(directory: SessionDir, head_job: str) -> str | None:
    """The control endpoint of the agent serving head ``head_job``, or None
    while the head is not published (not ready, or its files are damaged)."""
    endpoint = directory.read_head_endpoint(head_job)
    if endpoint is None:
        return None
    port = endpoint.ports.get("control")
    state = directory.read_node_states(head_job).get(endpoint.host)
    if state is not None and state.control and not state.exited and (
            port is None or state.control.rpartition(":")[2] == str(port)):
        return state.control
    if not port:
        return None
    host = endpoint.address.rpartition(":")[0]
    return f"tcp://{host}:{port}"


__all__ = ["head_control_endpoint"]
