"""The autoscaler's loop: one thread beside the head supervisor of every supervising process.

Every process that supervises a session (``Session(supervise=True)``: the
run's supervisor, a Dagster step, the SSH mode's detached supervisor) runs
this thread; only the one that holds the lease (:mod:`.lease`) acts. Each
turn, every ``interval`` seconds, sooner when a delay of the last decision
runs out (its ``wake_at``), when the lease is due for renewal, or when a
look between turns (every ``poll`` seconds) finds the policy file changed
(one ``stat``) or, the lease held, something new asked of Ray (one call
through the same probe):

1. read the policy (:mod:`.store`); none: give the lease back and rest;
2. take or renew the lease; another live holder: rest;
3. read what the run holds (allocation.json, one scheduler answer, the
   agents' node files) and what Ray waits for and how idle its nodes are
   (:mod:`.ray_demand`, from whichever head ``ray_head`` names now, so the
   loop goes on across a head move);
4. decide (:func:`elastic_ray.autoscale.decide.decide`, pure); when it
   asks for start estimates that the rate limit allows (:mod:`.estimates`),
   ask and decide again with them;
5. act (:mod:`.act`) and write the state file; every action and every
   changed note is an event with its reason.

An error in a turn is logged once while it lasts (the supervisor's
``RepeatedError``) and kept in the state file; the next turn starts afresh.
"""

from __future__ import annotations

import logging
import math
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import replace

from ... import knobs
from ...autoscale.decide import decide
from ...autoscale.demand import grew
from ...autoscale.records import Cancel, Decision, Demand, Drain, Memory, Probe, Submit
from ...config.autoscale import AutoscalePolicy
from ...errors import CorruptFileError, ElasticRayError
from ...protocol.disk.records import AllocationRecord
from ...protocol.disk import event_log
from ...protocol.disk.events import EventKind, EventSource
from ..allocations.pacing import watch_max_age
from ..head.claims import holder_gone
from ..head.supervise import RepeatedError
from . import act, lease, store, view
from .estimates import PROBE_EVERY, Estimates, pool_key
from .ray_demand import DemandWatcher

log = logging.getLogger("elastic_ray.coordinator")

#: Seconds before a pool whose submission failed (sbatch refused it) is submitted to again.
SUBMIT_RETRY = PROBE_EVERY
#: A turn woken by a decision's ``wake_at`` comes this much after it, so the delay has run out.
WAKE_SLACK = 0.05


def rest_for(interval: float, now: float, wake_at: float | None, renew_at: float | None, failed: bool) -> float:
    """Pure: seconds until the next turn. ``interval``, or just after the decision's ``wake_at`` or the
    lease's ``renew_at`` when sooner (at once when already past); after a failed turn the renewal
    does not count, so a renewal that keeps failing is tried once an interval, not in a loop."""
    rest = interval
    for at in (wake_at, None if failed else renew_at):
        if at is not None:
            rest = min(rest, max(0.0, at - now) + WAKE_SLACK)
    return rest


class Autoscaler:
    """The loop of one process (see the module docstring). ``turn`` runs one turn (tests call it)."""

    def __init__(self, session: act.ScaledSession, interval: float | None = None,
                 clock: Callable[[], float] = time.time, poll: float | None = None):
        self.session = session
        self.interval = knobs.AUTOSCALE_INTERVAL.value() if interval is None else interval
        self.poll = knobs.AUTOSCALE_DEMAND_POLL.value() if poll is None else poll
        self._turn_demand: Demand | None = None   # what the last turn read of Ray's demand
        self._renew_at: float | None = None        # when the lease held must be renewed
        self._policy_stamp: tuple[int, int, int] | None = None   # the policy file as the last turn saw it
        self.clock = clock
        self.holder = lease.holder_name(socket.gethostname(), os.getpid(), uuid.uuid4().hex[:8])
        self.held = False
        self.state = store.ScalerState()
        self.memory = Memory()
        self.estimates = Estimates()
        self.demand = DemandWatcher()
        self.last_decision: Decision | None = None
        self._notes: tuple[str, ...] = ()
        self._submit_failed: dict[str, tuple[float, str]] = {}   # pool key -> when a submission failed, and why
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="elastic-ray-autoscaler", daemon=True)
        self._errors = RepeatedError(session.job_name)

    # ------------------------------------------------------------ thread
    def start(self) -> "Autoscaler":
        self._thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """End the loop and give the lease back, so another process takes over at once."""
        self._stop.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout)
        if self.held:
            self._release("released")
        self.demand.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            decision, failed = None, True
            try:
                decision, failed = self.turn(), False
            except (ElasticRayError, OSError) as exc:
                self._failed(str(exc))
            except Exception as exc:   # noqa: BLE001 - the loop must outlive a bug in one turn
                self._failed(f"{type(exc).__name__}: {exc}", trace=True)
            else:
                self._errors.cleared(time.monotonic())
            self._rest(decision, failed)

    def _rest(self, decision: Decision | None, failed: bool = False) -> None:
        """Until the next turn: ``interval``, or sooner when a delay of ``decision`` runs out
        (``wake_at``), the lease is due, or a look every ``poll`` s finds the policy file changed
        or (the lease held) new demand in Ray. After a failed turn only the policy file cuts the rest
        short: a renewal that failed (a full filesystem) is tried again a whole interval later, not
        in a loop."""
        end = time.monotonic() + rest_for(self.interval, self.clock(), decision.wake_at if decision else None,
                                          self._renew_at if self.held else None, failed)
        while True:
            left = end - time.monotonic()
            look = self.poll > 0 and left > self.poll
            if left <= 0 or self._stop.wait(self.poll if look else left):
                return
            if look and store.policy_stamp(self.session.path) != self._policy_stamp:
                return        # a policy set, changed or stopped (by any process): act on it now
            if look and not failed and self.held and self._turn_demand is not None and self._demand_grew():
                return

    def _demand_grew(self) -> bool:
        try:
            _, ray = self.demand.read(self.session)
        except (ElasticRayError, OSError):
            return False      # the turn will say what is wrong
        return grew(self._turn_demand, ray.demand)

    def _failed(self, text: str, trace: bool = False) -> None:
        self._errors.failed(f"autoscaler: {text}", time.monotonic(), trace=trace)
        if self.held:
            self.state = replace(self.state, error=text[:500], turn_at=self.clock())
            self._save(durable=False)

    # ------------------------------------------------------------ one turn
    def turn(self) -> Decision | None:
        """One turn; the decision acted on, or None when this process did not act."""
        self._policy_stamp = store.policy_stamp(self.session.path)
        try:
            stored = store.read_policy(self.session.path)
        except CorruptFileError as exc:
            raise ElasticRayError(f"the stored policy is unreadable, nothing done: {exc.reason}") from None
        policy = None if stored is None else stored.policy
        if policy is None:
            if self.held:
                self._release("released: no policy")
            return None
        record = self._hold()
        if record is None:
            return None
        now = self.clock()
        head, ray = self.demand.read(self.session)
        self._turn_demand = ray.demand
        jobs = self.session.query(max_age=watch_max_age())   # the shared answer: no more squeue than today
        live = [j for j, w in record.workers.items() if j in jobs and not jobs[j].state.is_final]
        nodes = {j: self.session.node_states(j) for j in live}
        tracked = {j: t for j, t in self.state.jobs.items() if j in live}
        allocations = view.allocations(policy, record, jobs, nodes, ray.nodes, tracked, head, now)

        decision = decide(policy, ray.demand, allocations, self.estimates.for_policy(policy), self.memory, now)
        asked = [self.estimates.ask(policy.pools[a.pool].config, act.predictor(self.session), now)
                 for a in decision.actions if isinstance(a, Probe)]
        if any(asked):
            decision = decide(policy, ray.demand, allocations, self.estimates.for_policy(policy), self.memory, now)
        self.memory = decision.memory
        failed: list[str] = []
        tracked = self._act(policy, decision, tracked, now, failed)
        if decision.notes != self._notes and decision.notes:
            act.note(self.session, "; ".join(decision.notes), decision.unserved)
        self._notes = decision.notes
        changed = tracked != dict(self.state.jobs)
        self.state = replace(self.state, holder=self.holder, turn_at=now, jobs=tracked,
                             estimates=self.estimates.to_dict(policy), unserved=decision.unserved,
                             notes=decision.notes, error="; ".join(failed)[:500] or None)
        self._save(durable=changed)
        self.last_decision = decision
        return decision

    def _act(self, policy: AutoscalePolicy, decision: Decision, tracked: dict, now: float,
             failed: list[str]) -> dict:
        """Carry the actions out; a failed one is logged, named in ``failed`` and the others go on."""
        for action in decision.actions:
            try:
                if isinstance(action, Submit):
                    key = pool_key(policy.pools[action.pool].config)
                    at, why = self._submit_failed.get(key, (-math.inf, ""))
                    if now - at < SUBMIT_RETRY:   # sbatch refused it a moment ago: not again every turn
                        name = policy.pools[action.pool].config.partition or f"pool {action.pool}"
                        failed.append(f"submit to {name} held back {SUBMIT_RETRY - (now - at):.0f} s more: "
                                      f"refused {now - at:.0f} s ago: {why}")
                        continue
                    self._submit_failed.pop(key, None)
                    try:
                        job, entry = act.do_submit(self.session, policy, action, now)
                    except (ElasticRayError, OSError) as exc:
                        self._submit_failed[key] = (now, str(exc)[:300])
                        act.refused(self.session, policy, action, exc, SUBMIT_RETRY)
                        raise
                    tracked[job] = entry
                    # Written at once: a crash before the turn's end must not lose whose job this is.
                    self.state = replace(self.state, jobs=dict(tracked))
                    self._save(durable=True)
                elif isinstance(action, (Cancel, Drain)):
                    job = action.job_id
                    ended = act.do_remove(self.session, action, tracked.get(job))
                    if ended is not None:
                        tracked[job] = ended
                else:
                    continue   # a Probe: asked before
            except (ElasticRayError, OSError, ValueError) as exc:
                log.warning("event=autoscale_action_failed session=%s action=%s error=%s",
                            self.session.job_name, type(action).__name__, exc)
                failed.append(f"{type(action).__name__.lower()} failed: {exc}")
                continue
            what = type(action).__name__.lower()
            log.info("event=autoscale_%s session=%s job=%s reason=%r", what, self.session.job_name, job, action.reason)
            recent = (*self.state.recent, {"at": now, "action": what, "job": job, "reason": action.reason})
            self.state = replace(self.state, recent=recent[-store.RECENT_KEPT:])
        return tracked

    # ------------------------------------------------------------ lease
    def _hold(self) -> AllocationRecord | None:
        """The record as this turn read (or wrote) it when this process holds the lease, else None."""
        record = self.session.record()
        now = self.clock()
        if self.held and not lease.due(record, self.holder, now):
            return record
        before = record.autoscaler   # live or lapsed: whoever held it last
        record = self.session.dir.update_allocation(
            lambda r: lease.take(r, self.holder, self.clock(), holder_dead=holder_gone))
        held = lease.holds(record, self.holder, self.clock())
        self._renew_at = lease.renew_at(record, self.holder)
        if held and not self.held:
            self._take_over(None if before is None or before.claimant == self.holder else before.claimant)
        elif self.held and not held:
            log.warning("event=autoscale_lease_lost session=%s holder=%s", self.session.job_name, self.holder)
            self.demand.close()
        self.held = held
        return record if held else None

    def _take_over(self, previous: str | None) -> None:
        """Start from the previous holder's state: its jobs stay the autoscaler's."""
        try:
            self.state = store.read_state(self.session.path) or store.ScalerState()
        except CorruptFileError as exc:
            log.warning("event=autoscale_state_unreadable session=%s error=%s", self.session.job_name, exc)
            self.state = store.ScalerState()
        stored = store.read_policy(self.session.path)
        if stored is not None and stored.policy is not None:
            self.estimates.load(stored.policy, self.state.estimates)
        self.memory = Memory()
        previous = previous or self.state.holder or None
        self.state = replace(self.state, holder=self.holder)
        reason = "taken" if previous is None else "taken over"
        event_log.emit(self.session.path, EventKind.AUTOSCALE_LEASE, EventSource.COORDINATOR, reason=reason,
                       holder=self.holder, previous=previous)
        log.info("event=autoscale_lease_taken session=%s holder=%s previous=%s", self.session.job_name,
                 self.holder, previous)

    def _release(self, why: str) -> None:
        try:
            self.session.dir.update_allocation(lambda r: lease.release(r, self.holder))
            event_log.emit(self.session.path, EventKind.AUTOSCALE_LEASE, EventSource.COORDINATOR, reason=why,
                           holder=self.holder)
        except (ElasticRayError, OSError) as exc:
            log.warning("event=autoscale_release_failed session=%s error=%s", self.session.job_name, exc)
        self.held = False
        self.demand.close()

    def _save(self, durable: bool) -> None:
        store.write_state(self.session.path, self.state, durable=durable)


__all__ = ["Autoscaler", "rest_for"]
