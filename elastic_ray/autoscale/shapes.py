"""Resource shapes in Ray's terms, and whether and how they fit onto nodes.

A shape is a mapping of Ray resource name to amount (``{"CPU": 1, "GPU": 1}``,
``{"accelerator:a40": 1}``): what a pending task, actor or placement-group
bundle asks for, or what one node of a pool offers. Everything here is pure
and tested by table (``tests/test_autoscale_shapes.py``).

Packing is first-fit decreasing: requests sorted by their largest share of a
node, each put on the first node with room, a new node opened when none has.
It is not optimal (packing by several resources at once is NP-hard) and may
ask for a node more than the best packing would; that is enough to decide
how many nodes to ask Slurm for, and Ray does its own placement once the
nodes are there.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from ..config.allocation import SlurmWorkerAllocationConfig

Shape = Mapping[str, float]

#: Amounts closer than this count as equal (Ray's fractional resources are
#: multiples of 1/10000).
EPSILON = 1e-4


def node_shape(config: SlurmWorkerAllocationConfig) -> dict[str, float]:
    """What one node of an allocation of ``config`` offers Ray: its CPUs (the
    task's ``cpus_per_task``, 1 if unset), its GPUs, and its ``ray_resources``.
    Memory is left out: Ray sizes it from the grant on the node itself."""
    shape = {"CPU": float(config.cpus_per_task or 1), "GPU": float(config.gpus_per_node or 0)}
    shape.update(config.ray_resources)
    return {name: amount for name, amount in shape.items() if amount > 0}


def clean(request: Shape) -> dict[str, float]:
    """The request without its zero amounts (a task asking ``{"CPU": 0}`` asks for nothing)."""
    return {name: float(amount) for name, amount in request.items() if amount > EPSILON}


def fits(request: Shape, capacity: Shape) -> bool:
    """Does ``capacity`` have room for all of ``request``? A resource the
    capacity does not name counts as none of it."""
    return all(capacity.get(name, 0.0) + EPSILON >= amount for name, amount in clean(request).items())


def take(capacity: Shape, request: Shape) -> dict[str, float]:
    """``capacity`` after ``request`` was put on it (the caller checked it fits)."""
    left = dict(capacity)
    for name, amount in clean(request).items():
        left[name] = left.get(name, 0.0) - amount
    return left


def size(request: Shape, node: Shape) -> float:
    """The request's largest share of one node (for sorting: biggest first)."""
    shares = [amount / node[name] for name, amount in clean(request).items() if node.get(name)]
    return max(shares, default=0.0)


def pack(requests: Sequence[Shape], free: Sequence[Shape]) -> tuple[list[int], list[dict[str, float]]]:
    """Put ``requests`` onto the ``free`` capacities (first fit, biggest first).

    Returns the indices of the requests that found room and what is left of
    each capacity. The requests that found none are the unserved ones.
    """
    left = [dict(c) for c in free]
    reference = _reference(free)
    order = sorted(range(len(requests)), key=lambda i: -size(requests[i], reference))
    placed = []
    for i in order:
        for j, capacity in enumerate(left):
            if fits(requests[i], capacity):
                left[j] = take(capacity, requests[i])
                placed.append(i)
                break
    return sorted(placed), left


def nodes_needed(requests: Sequence[Shape], node: Shape) -> int | None:
    """How many fresh nodes of shape ``node`` hold all ``requests`` (first
    fit decreasing); None when one of them fits no such node at all."""
    if any(not fits(r, node) for r in requests):
        return None
    opened: list[dict[str, float]] = []
    for request in sorted(requests, key=lambda r: -size(r, node)):
        for j, capacity in enumerate(opened):
            if fits(request, capacity):
                opened[j] = take(capacity, request)
                break
        else:
            opened.append(take(node, request))
    return len(opened)


def gang_nodes(bundles: Sequence[Shape], node: Shape, strategy: str) -> int | None:
    """Nodes of shape ``node`` a placement group needs all at once, by its
    strategy: STRICT_SPREAD one node a bundle, STRICT_PACK one node for all
    (None if they do not fit together), PACK and SPREAD as packed.
    None when a bundle fits no such node."""
    if any(not fits(b, node) for b in bundles):
        return None
    if strategy == "STRICT_SPREAD":
        return len(bundles)
    if strategy == "STRICT_PACK":
        total: dict[str, float] = {}
        for bundle in bundles:
            for name, amount in clean(bundle).items():
                total[name] = total.get(name, 0.0) + amount
        return 1 if fits(total, node) else None
    return nodes_needed(bundles, node)


def total(shapes: Iterable[Shape]) -> dict[str, float]:
    """The sum of ``shapes``, resource by resource."""
    out: dict[str, float] = {}
    for shape in shapes:
        for name, amount in clean(shape).items():
            out[name] = out.get(name, 0.0) + amount
    return out


def describe(shape: Shape) -> str:
    """``{CPU: 1, GPU: 1}``: a shape as the autoscaler's reasons print it."""
    items = ", ".join(f"{name}: {amount:g}" for name, amount in sorted(clean(shape).items()))
    return "{" + items + "}"


def _reference(free: Sequence[Shape]) -> dict[str, float]:
    """The largest amount of each resource over ``free``: the scale requests are sorted by."""
    out: dict[str, float] = {}
    for capacity in free:
        for name, amount in capacity.items():
            out[name] = max(out.get(name, 0.0), amount)
    return out
