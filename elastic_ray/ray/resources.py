"""Wait until the Ray cluster offers enough resources, steadily.

Worker allocations join a run's cluster while a payload runs, node by node,
and a node may appear and vanish again (a restarting raylet, a draining
allocation). A payload that sizes its work (an actor pool, a wave of tasks)
on a single look may size it on capacity that is gone a moment later, so it
waits for the capacity to hold over several consecutive polls.

This observes; it does not reserve. Launch the work that uses the capacity
right after it returns. Ray is imported only when no provider is given, so
this module costs nothing to import.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping

Provider = Callable[[], Mapping[str, float]]


def _check_minimum(minimum_resources: object) -> dict[str, float]:
    if not isinstance(minimum_resources, Mapping) or not minimum_resources:
        raise ValueError(f"minimum_resources={minimum_resources!r}: must be a non-empty mapping such as {{'GPU': 4}}")
    checked = {}
    for name, amount in minimum_resources.items():
        if not isinstance(name, str) or not name:
            raise ValueError(f"minimum_resources[{name!r}]: a resource name must be a non-empty string")
        if isinstance(amount, bool) or not isinstance(amount, (int, float)) or not math.isfinite(amount) \
                or amount <= 0:
            raise ValueError(f"minimum_resources[{name!r}]={amount!r}: must be a finite number above zero")
        checked[name] = float(amount)
    return checked


def _check_seconds(name: str, value: object, *, allow_none: bool) -> float | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name}={value!r}: must be a finite number of seconds above zero")
    return float(value)


def meets(snapshot: Mapping[str, float], minimum: Mapping[str, float]) -> bool:
    """Pure: does one snapshot offer at least ``minimum`` of every resource?"""
    return all(snapshot.get(name, 0.0) >= amount for name, amount in minimum.items())


def wait_for_stable_ray_resources(
    minimum_resources: Mapping[str, float],
    *,
    stable_polls: int = 2,
    poll_interval_seconds: float = 1.0,
    timeout_seconds: float | None = None,
    resource_provider: Provider | None = None,
) -> dict[str, float]:
    """Return Ray's available resources once they meet ``minimum_resources``
    on ``stable_polls`` consecutive polls, ``poll_interval_seconds`` apart.

    ``resource_provider`` defaults to ``ray.available_resources`` (idle
    capacity, so work already running is not counted twice); pass
    ``ray.cluster_resources`` to wait for total capacity instead.

    Raises ``ValueError`` naming the bad argument, and ``TimeoutError``
    after ``timeout_seconds`` (default: no limit) with the last snapshot.
    """
    minimum = _check_minimum(minimum_resources)
    if isinstance(stable_polls, bool) or not isinstance(stable_polls, int) or stable_polls < 1:
        raise ValueError(f"stable_polls={stable_polls!r}: must be a whole number of at least 1")
    interval = _check_seconds("poll_interval_seconds", poll_interval_seconds, allow_none=False)
    timeout = _check_seconds("timeout_seconds", timeout_seconds, allow_none=True)
    if resource_provider is None:
        import ray

        resource_provider = ray.available_resources
    elif not callable(resource_provider):
        raise ValueError(f"resource_provider={resource_provider!r}: must be callable, like ray.available_resources")

    deadline = None if timeout is None else time.monotonic() + timeout
    streak = 0
    last: dict[str, float] = {}
    while True:
        last = {str(k): float(v) for k, v in dict(resource_provider()).items()}
        streak = streak + 1 if meets(last, minimum) else 0
        if streak >= stable_polls:
            return last
        if deadline is not None and time.monotonic() + interval > deadline:
            seen = {name: last.get(name, 0.0) for name in minimum}
            raise TimeoutError(f"Ray did not offer {minimum} on {stable_polls} consecutive polls within "
                               f"{timeout:g}s; last seen {seen} ({streak} qualifying polls in a row)")
        time.sleep(interval)
