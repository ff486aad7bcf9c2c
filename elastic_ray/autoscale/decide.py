"""The autoscaler's decisions: a pure function of what Ray wants, what the run
holds, what Slurm says about start times, the policy, and the time.

:func:`decide` returns the actions (submit to a pool, cancel a queued
submission, drain an allocation, ask Slurm when a pool would start) with the
reason of each, and the little it must remember for the next call. It does
no I/O: the shell that reads Ray's demand and the scheduler and carries the
actions out lives elsewhere, and this module is tested by table
(``tests/test_autoscale_decide.py``).

How it decides, in order:

1. **What is coming.** What running nodes have free in Ray now (Ray places
   a pending task there in a moment), then the nodes of the autoscaler's
   allocations that are queued in Slurm or starting, count as capacity on
   its way. Pending tasks and actors are put on it first (free room first,
   then starting allocations before queued ones, queued ones by their
   expected start), then placement groups (all bundles of a group or none),
   then ``request_resources`` bundles, which must fit on the run's whole
   capacity (running nodes included). What finds no room is the
   *unserved* demand.
2. **Grow.** Unserved demand that has waited ``demand_delay`` goes to the
   pools whose node shape can hold it, the one Slurm expects to start first
   (unknown estimates rank last, then the policy's order), within
   ``max_allocations``, ``backlog`` and ``max_nodes``. A shape no pool can
   ever hold is named in a note, once a call, and never submitted for.
   With ``race`` set and no start known, every pool that fits gets one.
3. **Cancel.** A queued submission that no demand was put on for
   ``cancel_delay`` (a raced one: at once) is cancelled, never below
   ``min_allocations``.
4. **Shed.** An allocation one of whose agents gave up on the current head
   (its node will not join it) counts for nothing and is drained. A running
   allocation whose nodes ran nothing for ``idle_timeout`` is drained,
   unless ``min_allocations`` or a ``request_resources`` bundle needs it. The one hosting the run's head
   (the head moved onto it) is never drained: that would only force an
   election and a new head allocation; it ends at its walltime like any head.
5. **Walltime.** A busy allocation within ``replace_before_walltime`` of its
   end gets one replacement of its pool; a replacement counts in place of
   the allocation it replaces against the bounds.

Hysteresis, so that flapping demand makes no submit/cancel loop: demand must
stay unserved ``demand_delay`` seconds before a submission, and a queued
submission must stay unneeded ``cancel_delay`` seconds before it is
cancelled (demand that comes back meanwhile finds it still queued). Idle is
measured by the nodes themselves (``idle_since``), so a task every few
minutes keeps an allocation.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from ..config.autoscale import AutoscalePolicy
from . import shapes
from .records import (Action, Allocation, Cancel, Decision, Demand, Drain, Estimate, Gang, Memory, Phase, Probe,
                      Submit)
from .shapes import Shape


#: Estimates older than this are asked again (with the shell's rate limit on top).
ESTIMATE_MAX_AGE = 60.0


@dataclass
class _Unit:
    """One piece of unserved demand: a task or actor, a gang, or a bundle."""

    shapes: tuple[Shape, ...]
    strategy: str | None = None    # a gang's; None for a single shape
    label: str = ""


def decide(policy: AutoscalePolicy, demand: Demand, allocations: Sequence[Allocation],
           estimates: Mapping[int, Estimate], memory: Memory, now: float) -> Decision:
    """The actions for this moment (see the module's docstring for the order)."""
    nodes_of = [shapes.node_shape(p.config) for p in policy.pools]
    mine = [a for a in allocations if a.pool is not None and a.phase.counts]
    notes: list[str] = []
    actions: list[Action] = []

    # 1. What is coming, and what it serves.
    coming = sorted((a for a in mine if a.phase in (Phase.QUEUED, Phase.STARTING)),
                    key=lambda a: (a.phase is not Phase.STARTING, _expected_start(a, estimates), a.job_id))
    units, used = _unserved(demand, coming, allocations)

    # 2. Grow.
    unserved_since = (memory.unserved_since or now) if units else None
    ranked = _rank(policy, estimates, now)
    budget = _Budget.of(policy, mine)
    if units or budget.total < policy.min_allocations:
        # Only a placement to make is worth a question to slurmctld.
        actions += [Probe(i) for i in ranked
                    if (e := estimates.get(i)) is None or now - e.asked_at > ESTIMATE_MAX_AGE]
    if units and now - unserved_since >= policy.demand_delay:
        actions += _grow(policy, units, nodes_of, ranked, estimates, budget, now - unserved_since, notes)
    elif units:
        notes.append(f"{len(units)} unserved, waiting {policy.demand_delay:g} s before submitting")

    # min_allocations: the floor is kept whatever the demand.
    short = policy.min_allocations - budget.total
    for _ in range(max(0, short)):
        pool = next((i for i in ranked if budget.room(policy, i)), None)
        if pool is None:
            break
        budget.add(policy, pool)
        actions.append(Submit(pool, f"below min_allocations={policy.min_allocations}: "
                                    f"submitted {_pool_name(policy, pool)}"))

    # 3. Cancel what is queued and no longer needed.
    unneeded: dict[str, float] = {}
    keep = budget.total
    for alloc in reversed(coming):     # the latest expected first
        if alloc.phase is not Phase.QUEUED or alloc.job_id in used or alloc.replaces is not None:
            continue
        since = memory.unneeded_since.get(alloc.job_id, now)
        unneeded[alloc.job_id] = since
        if keep <= policy.min_allocations:
            continue
        if alloc.raced or now - since >= policy.cancel_delay:
            keep -= 1
            why = "raced, and the demand is met" if alloc.raced else f"not needed for {now - since:.0f} s"
            actions.append(Cancel(alloc.job_id, f"queued {_pool_name(policy, alloc.pool)} job {alloc.job_id}: {why}"))

    # 4. Shed what gave up, and what sits idle.
    actions += [Drain(a.job_id, f"{_pool_name(policy, a.pool)} job {a.job_id} gave up ({a.why or 'no reason'}): "
                                "it counts for nothing; drained")
                for a in allocations if a.phase is Phase.GAVE_UP and a.pool is not None and not a.hosts_head]
    actions += _shed(policy, demand, allocations, mine, keep, now)

    # 5. Replace before the walltime.
    actions += _replace(policy, mine, now)

    acted = {a.job_id for a in actions if isinstance(a, (Cancel, Drain))} | \
        {a.replaces for a in actions if isinstance(a, Submit) and a.replaces}
    wake = _wake_at(policy, mine, unserved_since if units and not any(isinstance(a, Submit) for a in actions)
                    else None, {j: t for j, t in unneeded.items() if j not in acted}, acted, now)
    return Decision(tuple(actions), Memory(unserved_since, unneeded), tuple(notes), len(units), wake)


def _wake_at(policy: AutoscalePolicy, mine: Sequence[Allocation], waiting_since: float | None,
             unneeded: Mapping[str, float], acted: set[str], now: float) -> float | None:
    """The first moment a delay of this decision runs out: demand waiting ``demand_delay``, a queued
    job unneeded for ``cancel_delay``, a node idle for ``idle_timeout``, a busy allocation reaching
    ``replace_before_walltime`` of its end. The shell decides again then, not a whole turn later."""
    due = [t + policy.cancel_delay for t in unneeded.values()]
    if waiting_since is not None:
        due.append(waiting_since + policy.demand_delay)
    for a in mine:
        if a.phase is not Phase.RUNNING or a.job_id in acted:
            continue
        if a.idle_since is not None and not a.hosts_head:
            due.append(a.idle_since + policy.idle_timeout)
        if policy.replace_before_walltime > 0 and a.end_time is not None:
            due.append(a.end_time - policy.replace_before_walltime)
    later = [t for t in due if t > now]
    return min(later) if later else None


# ------------------------------------------------------------ 1. unserved demand

def _unserved(demand: Demand, coming: Sequence[Allocation],
              allocations: Sequence[Allocation]) -> tuple[list[_Unit], set[str]]:
    """The demand the free and coming capacity does not serve, and the coming jobs it used."""
    room = [dict(node) for a in allocations if a.phase is Phase.RUNNING for node in a.free]
    owners: list[str | None] = [None] * len(room) + [a.job_id for a in coming for _ in a.capacity]
    free = room + [dict(node) for a in coming for node in a.capacity]
    used: set[str] = set()
    units: list[_Unit] = []

    def place(unit: _Unit) -> bool:
        before = [dict(c) for c in free]
        if not _put(unit, free):
            return False
        used.update(o for j, c in enumerate(free) if c != before[j] and (o := owners[j]) is not None)
        return True

    reference = shapes.total(a.capacity[0] for a in coming if a.capacity) or {"CPU": 1.0}
    for shape in sorted((shapes.clean(s) for s in demand.pending), key=lambda s: -shapes.size(s, reference)):
        unit = _Unit((shape,), label=shapes.describe(shape))
        if shape and not place(unit):
            units.append(unit)
    for gang in demand.gangs:
        bundles = tuple(b for b in (shapes.clean(b) for b in gang.bundles) if b)
        unit = _Unit(bundles, gang.strategy, f"placement group {gang.name or '?'} ({len(bundles)} bundles, "
                                             f"{gang.strategy})")
        if bundles and not place(unit):
            units.append(unit)
    if demand.constraints:
        whole = [dict(n) for a in allocations if a.phase.counts for n in a.capacity]
        wanted = [shapes.clean(s) for s in demand.constraints]
        placed, _ = shapes.pack(wanted, whole)
        units += [_Unit((shape,), label=f"requested {shapes.describe(shape)}")
                  for i, shape in enumerate(wanted) if shape and i not in placed]
    return units, used


# ------------------------------------------------------------ 2. grow

def _rank(policy: AutoscalePolicy, estimates: Mapping[int, Estimate], now: float) -> list[int]:
    """Pools by expected start (unknown last), then by the policy's order."""
    def start(i: int) -> float:
        e = estimates.get(i)
        if e is None or e.start_in is None:
            return math.inf
        return max(0.0, e.asked_at + e.start_in - now)
    return sorted(range(len(policy.pools)), key=lambda i: (start(i), i))


@dataclass
class _Budget:
    """What the bounds leave: allocations per pool, queued per pool, nodes in all."""

    per_pool: dict[int, int]
    queued: dict[int, int]
    nodes: int
    total: int

    @classmethod
    def of(cls, policy: AutoscalePolicy, mine: Sequence[Allocation]) -> "_Budget":
        per_pool = {i: 0 for i in range(len(policy.pools))}
        queued = dict(per_pool)
        nodes = total = 0
        replaced = {a.replaces for a in mine if a.replaces}
        for a in mine:
            if a.job_id in replaced:
                continue   # its replacement counts in its place
            per_pool[a.pool] = per_pool.get(a.pool, 0) + 1   # type: ignore[index]
            if a.phase is Phase.QUEUED:
                queued[a.pool] = queued.get(a.pool, 0) + 1   # type: ignore[index]
            nodes += len(a.capacity)
            total += 1
        return cls(per_pool, queued, nodes, total)

    def room(self, policy: AutoscalePolicy, pool: int) -> bool:
        return self.bounded(policy, pool) and self.queued[pool] < policy.backlog

    def bounded(self, policy: AutoscalePolicy, pool: int) -> bool:
        """Room under the lasting bounds (max_allocations, max_nodes); the
        backlog is a passing one: it frees as soon as a submission starts."""
        p = policy.pools[pool]
        n = p.config.num_nodes or 1
        return (self.per_pool[pool] < p.max_allocations
                and (policy.max_nodes is None or self.nodes + n <= policy.max_nodes))

    def add(self, policy: AutoscalePolicy, pool: int, count: int = 1) -> None:
        self.per_pool[pool] += count
        self.queued[pool] += count
        self.nodes += count * (policy.pools[pool].config.num_nodes or 1)
        self.total += count

    def remove(self, policy: AutoscalePolicy, pool: int) -> None:
        """Take back one :meth:`add` (a trial that did not place its unit)."""
        self.add(policy, pool, -1)


def _grow(policy: AutoscalePolicy, units: list[_Unit], nodes_of: Sequence[Shape], ranked: Sequence[int],
          estimates: Mapping[int, Estimate], budget: _Budget, waited: float, notes: list[str]) -> list[Action]:
    """Submissions for the unserved units: each on the best pool that can hold
    it, in planned allocations first, a new one opened while the bounds allow."""
    planned: dict[int, list[dict[str, float]]] = {}
    opened: dict[int, int] = {}
    served: dict[int, list[str]] = {}
    blocked: list[str] = []
    waiting: list[str] = []
    for unit in units:
        candidates = [i for i in ranked if _holds(unit, nodes_of[i])]
        if not candidates:
            notes.append(f"{unit.label} fits no pool's node ({', '.join(shapes.describe(n) for n in nodes_of)}):"
                         " nothing is submitted for it")
            continue
        for pool in candidates:
            if _put(unit, planned.setdefault(pool, [])):
                served.setdefault(pool, []).append(unit.label)
                break
            trial = [dict(c) for c in planned[pool]]
            n = policy.pools[pool].config.num_nodes or 1
            extra = 0
            while budget.room(policy, pool):
                budget.add(policy, pool)
                extra += 1
                trial += [dict(nodes_of[pool]) for _ in range(n)]
                if _put(unit, trial):
                    break
            else:
                for _ in range(extra):
                    budget.remove(policy, pool)
                if budget.bounded(policy, pool):
                    # Only the backlog holds it back: it waits for this pool (the soonest that
                    # can hold it) rather than going to one expected later.
                    waiting.append(unit.label)
                    break
                continue
            planned[pool] = trial
            opened[pool] = opened.get(pool, 0) + extra
            served.setdefault(pool, []).append(unit.label)
            break
        else:
            blocked.append(unit.label)
    if waiting:
        notes.append(f"{len(waiting)} unserved wait for a queued submission to start (backlog "
                     f"{policy.backlog}): " + "; ".join(_counted(waiting)))
    if blocked:
        notes.append(f"{len(blocked)} unserved at the bounds (max_allocations, max_nodes): "
                     + "; ".join(_counted(blocked)))
    actions: list[Action] = []
    starts = "; ".join(_start_text(policy, i, estimates) for i in ranked)
    for pool in ranked:
        count = opened.get(pool, 0)
        for k in range(count):
            of = f" ({k + 1} of {count})" if count > 1 else ""
            actions.append(Submit(pool, f"{', '.join(_counted(served[pool]))} pending {waited:.0f} s; {starts}: "
                                        f"submitted {_pool_name(policy, pool)}{of}"))
    if policy.race and actions and all(_unknown(estimates.get(i)) for i in opened):
        # Every submission of a race is cancelled as soon as another one serves its demand.
        actions = [replace(a, raced=True) if isinstance(a, Submit) else a for a in actions]
        for pool in ranked:
            if pool in opened or not any(_holds(u, nodes_of[pool])
                                         for u in units):
                continue
            if budget.room(policy, pool):
                budget.add(policy, pool)
                actions.append(Submit(pool, f"race: no pool's start is known; {_pool_name(policy, pool)} "
                                            "as well, the first to start keeps the demand", raced=True))
    return actions


def _holds(unit: _Unit, node: Shape) -> bool:
    if unit.strategy is None:
        return shapes.fits(unit.shapes[0], node)
    return shapes.gang_nodes(unit.shapes, node, unit.strategy) is not None


def _put(unit: _Unit, capacity: list[dict[str, float]]) -> bool:
    """Place ``unit`` on ``capacity`` (in place); all or nothing."""
    trial = [dict(c) for c in capacity]
    taken: set[int] = set()
    for shape in unit.shapes:
        spread = unit.strategy == "STRICT_SPREAD"
        spot = next((j for j, c in enumerate(trial) if shapes.fits(shape, c) and not (spread and j in taken)), None)
        if spot is None:
            return False
        trial[spot] = shapes.take(trial[spot], shape)
        taken.add(spot)
    if unit.strategy == "STRICT_PACK" and len(taken) > 1:
        return False
    capacity[:] = trial
    return True


# ------------------------------------------------------------ 4. shed, 5. replace

def _shed(policy: AutoscalePolicy, demand: Demand, allocations: Sequence[Allocation],
          mine: Sequence[Allocation], keep: int, now: float) -> list[Action]:
    idle = [a for a in mine if a.phase is Phase.RUNNING and a.idle_since is not None
            and now - a.idle_since >= policy.idle_timeout]
    idle.sort(key=lambda a: (a.idle_since, a.job_id))
    actions: list[Action] = []
    gone: set[str] = set()
    for alloc in idle:
        if keep <= policy.min_allocations:
            break
        if alloc.hosts_head:
            continue   # the run's own head: draining it would only force an election
        if demand.constraints:
            rest = [dict(n) for a in allocations if a.phase.counts and a.job_id not in gone
                    and a.job_id != alloc.job_id for n in a.capacity]
            placed, _ = shapes.pack([shapes.clean(s) for s in demand.constraints], rest)
            if len(placed) < len([s for s in demand.constraints if shapes.clean(s)]):
                continue   # request_resources needs it
        gone.add(alloc.job_id)
        keep -= 1
        actions.append(Drain(alloc.job_id, f"{_pool_name(policy, alloc.pool)} job {alloc.job_id} idle for "
                                           f"{now - alloc.idle_since:.0f} s (idle_timeout "  # type: ignore[operator]
                                           f"{policy.idle_timeout:g} s): drained"))
    return actions


def _replace(policy: AutoscalePolicy, mine: Sequence[Allocation], now: float) -> list[Action]:
    if policy.replace_before_walltime <= 0:
        return []
    replaced = {a.replaces for a in mine if a.replaces}
    actions: list[Action] = []
    for alloc in mine:
        if alloc.phase is not Phase.RUNNING or alloc.end_time is None or alloc.job_id in replaced:
            continue
        busy = alloc.idle_since is None or now - alloc.idle_since < policy.idle_timeout
        left = alloc.end_time - now
        if busy and 0 < left <= policy.replace_before_walltime:
            actions.append(Submit(alloc.pool, f"{_pool_name(policy, alloc.pool)} job {alloc.job_id} is busy and "  # type: ignore[arg-type]
                                              f"ends in {left:.0f} s: a replacement submitted",
                                  replaces=alloc.job_id))
    return actions


# ------------------------------------------------------------ words

def _expected_start(alloc: Allocation, estimates: Mapping[int, Estimate]) -> float:
    e = estimates.get(alloc.pool) if alloc.pool is not None else None
    return alloc.submitted_at if e is None or e.start_in is None else e.asked_at + e.start_in


def _unknown(estimate: Estimate | None) -> bool:
    return estimate is None or estimate.start_in is None


def _pool_name(policy: AutoscalePolicy, pool: int | None) -> str:
    if pool is None:
        return "an allocation"
    return policy.pools[pool].config.partition or f"pool {pool}"


def _start_text(policy: AutoscalePolicy, pool: int, estimates: Mapping[int, Estimate]) -> str:
    e = estimates.get(pool)
    name = _pool_name(policy, pool)
    if e is None or e.start_in is None:
        return f"{name} start unknown"
    if e.start_in < 1:
        return f"{name} starts now"
    return f"{name} in ~{_duration(e.start_in)}"


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.0f} h"


def _counted(labels: Sequence[str]) -> list[str]:
    """``["2 x {GPU: 1}", "{CPU: 4}"]`` from the labels, in first-seen order."""
    counts: dict[str, int] = {}
    for label in labels:
        counts[label] = counts.get(label, 0) + 1
    return [f"{n} x {label}" if n > 1 else label for label, n in counts.items()]


__all__ = ["Action", "Allocation", "Cancel", "Decision", "Demand", "Drain", "Estimate", "Gang", "Memory",
           "Phase", "Probe", "Submit", "decide"]
