"""What Ray waits for, read from the head's cluster resource state.

Ray's GCS keeps one ``ClusterResourceState`` (its autoscaler protocol,
``autoscaler.proto``) whatever autoscaler runs: the pending resource
requests of tasks and actors with their counts, the pending placement
groups (gang requests), the ``request_resources`` constraints, and every
node's total and available resources and how long it has been idle. The
process that asks the GCS turns the reply into plain data
(``google.protobuf.json_format.MessageToDict`` with the proto's field
names); :func:`read_state` turns that into the autoscaler's records. Pure,
tested by table on replies of that form (``tests/test_autoscale_demand.py``).

Left out of the demand, and counted in :attr:`RayState.skipped` instead:
requests pinned to one node (a ``node:<ip>`` resource: no new node can
serve them) and requests for a placement group's bundle (a
``..._group_...`` resource: the group itself is the demand). A shape asked
for more than ``MAX_PER_SHAPE`` times counts that many: no policy places
more at once, and a backlog of a million tasks must not cost a million
records.
"""

from __future__ import annotations

import base64
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .records import Demand, Gang
from .shapes import Shape

MAX_PER_SHAPE = 1024


@dataclass(frozen=True)
class RayNode:
    """One node in Ray's view: its resources, and for how long it ran nothing."""

    node_id: str               # hex, as Ray prints node ids
    total: Shape
    available: Shape
    idle_seconds: float        # 0 while it runs something
    alive: bool


@dataclass(frozen=True)
class RayState:
    demand: Demand
    nodes: tuple[RayNode, ...]
    skipped: int = 0           # requests left out (pinned to a node, or a group's bundle)


class StateError(ValueError):
    """The reply is not a cluster resource state; names the field."""


def read_state(data: Any, requested: Any = None) -> RayState:
    """The autoscaler's view of one reply (see the module docstring).

    ``requested``: what ``ray.autoscaler.sdk.request_resources`` left in the
    GCS's key-value store (``autoscaler_resource_request``, a JSON list of
    bundles), parsed. Ray writes it there, not into the state, unless its
    autoscaler v2 runs (measured on 2.60: the state's constraints stay
    empty); the state's own constraints win when it has any."""
    if not isinstance(data, Mapping):
        raise StateError(f"cluster resource state: {type(data).__name__} is not an object")
    skipped = 0
    pending: list[Shape] = []
    for i, entry in enumerate(_list(data, "pending_resource_requests")):
        where = f"pending_resource_requests[{i}]"
        shape, constraint = _request(_get(entry, "request", where), f"{where}.request")
        if shape is None:
            skipped += 1
            continue
        pending += [shape] * min(_count(entry, where), MAX_PER_SHAPE)
    gangs: list[Gang] = []
    for i, entry in enumerate(_list(data, "pending_gang_resource_requests")):
        where = f"pending_gang_resource_requests[{i}]"
        bundles, strategies = [], set()
        for j, request in enumerate(_seq(entry, "requests", where)):
            shape, constraint = _request(request, f"{where}.requests[{j}]")
            if shape is not None:
                bundles.append(shape)
                strategies.add(constraint)
        if bundles:
            strategy = "STRICT_SPREAD" if "anti_affinity" in strategies else (
                "STRICT_PACK" if "affinity" in strategies else "PACK")
            gangs.append(Gang(tuple(bundles), strategy, _group_name(entry.get("details", ""))))
    constraints: list[Shape] = []
    for i, entry in enumerate(_list(data, "cluster_resource_constraints")):
        where = f"cluster_resource_constraints[{i}]"
        for j, item in enumerate(_seq(entry, "resource_requests", where)):
            shape, _ = _request(_get(item, "request", f"{where}.resource_requests[{j}]"),
                                f"{where}.resource_requests[{j}].request")
            if shape is not None:
                constraints += [shape] * min(_count(item, f"{where}.resource_requests[{j}]"), MAX_PER_SHAPE)
    if not constraints and requested is not None:
        if isinstance(requested, (str, bytes)) or not isinstance(requested, Sequence):
            raise StateError("autoscaler_resource_request: not a list of bundles")
        for j, bundle in enumerate(requested):
            shape = _resources(bundle, f"autoscaler_resource_request[{j}]")
            if shape and not any(name.startswith("node:") for name in shape):
                constraints.append({k: v for k, v in shape.items() if v > 0})
    nodes = tuple(_node(n, f"node_states[{i}]") for i, n in enumerate(_list(data, "node_states")))
    return RayState(Demand(tuple(pending), tuple(gangs), tuple(constraints)), nodes, skipped)


def grew(before: Demand | None, now: Demand) -> bool:
    """Pure: does ``now`` ask for anything ``before`` did not (a shape more often, a new group or
    request)? The shell's quick look between turns decides at once when it does; demand that only
    shrank waits for the turn (nothing to submit for it)."""
    if before is None:
        return bool(now.pending or now.gangs or now.constraints)
    return any(_counts(getattr(now, part)) - _counts(getattr(before, part))
               for part in ("pending", "gangs", "constraints"))


def _counts(items: Sequence[Any]) -> Counter:
    def key(item: Any) -> Any:
        if isinstance(item, Gang):
            return (item.strategy, item.name, tuple(key(b) for b in item.bundles))
        return tuple(sorted(item.items()))
    return Counter(key(i) for i in items)


def _group_name(details: Any) -> str:
    """Ray describes a pending group as ``<group id hex>:<STRATEGY>|<STATE>``; the reasons show
    the id's first 12 digits (``ray list placement-groups`` finds it by them)."""
    text = str(details)
    head = text.split(":", 1)[0]
    if ":" in text and head and all(c in "0123456789abcdef" for c in head):
        return head[:12]
    return text[:80]


def _request(request: Any, where: str) -> tuple[dict[str, float] | None, str | None]:
    """(shape, "affinity"/"anti_affinity"/None); shape None when it is not demand for a new node."""
    if not isinstance(request, Mapping):
        raise StateError(f"{where}: not an object")
    shape = _resources(request.get("resources_bundle", {}), f"{where}.resources_bundle")
    if any(name.startswith("node:") or "_group_" in name for name in shape):
        return None, None
    constraint = None
    for item in request.get("placement_constraints", ()) or ():
        if isinstance(item, Mapping):
            constraint = "anti_affinity" if "anti_affinity" in item else ("affinity" if "affinity" in item
                                                                            else constraint)
    return {k: v for k, v in shape.items() if v > 0}, constraint


def _node(data: Any, where: str) -> RayNode:
    if not isinstance(data, Mapping):
        raise StateError(f"{where}: not an object")
    raw_id = data.get("node_id", "")
    try:
        node_id = base64.b64decode(raw_id, validate=True).hex() if raw_id else ""
    except (ValueError, TypeError):
        raise StateError(f"{where}.node_id: {raw_id!r} is not base64") from None
    idle = data.get("idle_duration_ms", 0)
    try:
        idle_ms = float(idle)   # an int64: a string in the JSON form
    except (TypeError, ValueError):
        raise StateError(f"{where}.idle_duration_ms: {idle!r} is not a number") from None
    if not math.isfinite(idle_ms) or idle_ms < 0:
        raise StateError(f"{where}.idle_duration_ms: {idle!r} is not a duration")
    status = str(data.get("status", "RUNNING"))
    return RayNode(node_id, _resources(data.get("total_resources", {}), f"{where}.total_resources"),
                   _resources(data.get("available_resources", {}), f"{where}.available_resources"),
                   idle_ms / 1000.0, status not in ("DEAD", "DRAINING"))


def _resources(data: Any, where: str) -> dict[str, float]:
    if not isinstance(data, Mapping):
        raise StateError(f"{where}: not an object of resource amounts")
    out = {}
    for name, amount in data.items():
        if isinstance(amount, bool) or not isinstance(amount, (int, float)) or not math.isfinite(amount):
            raise StateError(f"{where}[{name!r}]: {amount!r} is not an amount")
        out[str(name)] = float(amount)
    return out


def _count(entry: Mapping[str, Any], where: str) -> int:
    raw = entry.get("count", 0)   # proto3 leaves a zero out
    try:
        count = int(raw)   # an int64: a string in the JSON form
    except (TypeError, ValueError):
        raise StateError(f"{where}.count: {raw!r} is not a count") from None
    if count < 0:
        raise StateError(f"{where}.count: {raw!r} is negative")
    return count


def _list(data: Mapping[str, Any], name: str) -> Sequence[Any]:
    return _seq(data, name, "cluster resource state")


def _seq(data: Any, name: str, where: str) -> Sequence[Any]:
    if not isinstance(data, Mapping):
        raise StateError(f"{where}: not an object")
    value = data.get(name, [])
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise StateError(f"{where}.{name}: not a list")
    return value


def _get(data: Any, name: str, where: str) -> Any:
    if not isinstance(data, Mapping) or name not in data:
        raise StateError(f"{where}.{name}: missing")
    return data[name]
