"""When Slurm would start a new allocation of each pool: ``test_only``, at most once a minute a pool.

The decisions ask (a ``Probe`` action) whenever an estimate is missing or
older than their limit; this keeps the cost to the controller bounded
whatever they ask: a pool is asked again only :data:`PROBE_EVERY` seconds
after it was last asked, whether that ask answered or failed. On Slurm one
ask is one ``sbatch --test-only`` (the one place that runs it is
``scheduler/slurm.py``); on the local scheduler, its emulation.

Estimates are kept by the pool's config, so a changed policy does not
mistake one pool's answer for another's, and in the holder's state file
(``session status`` shows them).
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ...autoscale.records import Estimate
from ...config import SlurmWorkerAllocationConfig
from ...config.autoscale import AutoscalePolicy
from ...errors import ElasticRayError

log = logging.getLogger("elastic_ray.coordinator")

#: Seconds between two asks about one pool.
PROBE_EVERY = 60.0


def pool_key(config: SlurmWorkerAllocationConfig) -> str:
    return json.dumps(config.to_dict(), sort_keys=True)


@dataclass
class Estimates:
    """The answers so far (by pool config) and when each pool was last asked."""

    every: float = PROBE_EVERY
    known: dict[str, Estimate] = field(default_factory=dict)
    asked_at: dict[str, float] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)

    def may_ask(self, key: str, now: float) -> bool:
        """Pure: the rate limit."""
        last = self.asked_at.get(key)
        return last is None or now - last >= self.every or now < last

    def for_policy(self, policy: AutoscalePolicy) -> dict[int, Estimate]:
        """The decisions' view: pool index -> estimate."""
        out = {}
        for i, pool in enumerate(policy.pools):
            estimate = self.known.get(pool_key(pool.config))
            if estimate is not None:
                out[i] = estimate
        return out

    def ask(self, config: SlurmWorkerAllocationConfig, predict: Callable[[SlurmWorkerAllocationConfig], float],
            now: float, clock: Callable[[], float] = time.time) -> bool:
        """Ask about one pool when the rate limit allows; True when it asked.
        ``predict`` returns the expected start (epoch seconds; inf: no end in sight); the wait is
        counted from when it answered (``clock``), not from ``now``, the turn's start: a scheduler
        that says "now" a second into a slow turn must not read as "in a second"."""
        key = pool_key(config)
        if not self.may_ask(key, now):
            return False
        self.asked_at[key] = now
        try:
            start = predict(config)
        except ElasticRayError as exc:
            self.errors[key] = str(exc)[:300]
            self.known[key] = Estimate(None, now)
            log.warning("event=autoscale_estimate_failed partition=%s error=%s", config.partition, exc)
            return True
        self.errors.pop(key, None)
        self.known[key] = Estimate(None if math.isinf(start) else max(0.0, start - max(now, clock())), now)
        return True

    def to_dict(self, policy: AutoscalePolicy) -> dict[str, Any]:
        """For the state file: by pool index, what Slurm said and when."""
        out: dict[str, Any] = {}
        for i, pool in enumerate(policy.pools):
            key = pool_key(pool.config)
            if key in self.known:
                e = self.known[key]
                out[str(i)] = {"partition": pool.config.partition, "start_in": e.start_in, "asked_at": e.asked_at,
                               "error": self.errors.get(key)}
        return out

    def load(self, policy: AutoscalePolicy, stored: Mapping[str, Mapping[str, Any]]) -> None:
        """Take over a previous holder's answers (so a takeover does not ask again at once)."""
        for index, entry in stored.items():
            try:
                pool = policy.pools[int(index)]
                start_in, asked_at = entry.get("start_in"), float(entry["asked_at"])
            except (ValueError, KeyError, IndexError, TypeError):
                continue
            key = pool_key(pool.config)
            self.known[key] = Estimate(None if start_in is None else float(start_in), asked_at)
            self.asked_at[key] = asked_at


__all__ = ["Estimates", "PROBE_EVERY", "pool_key"]
