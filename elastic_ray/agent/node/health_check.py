"""How fast the head's GCS gives up on a silent Ray node (pure).

A node nobody reports gone (its network was cut, its host froze) stays ALIVE
in the GCS until the GCS's own health check gives up on it, and every task
meant for it waits. Ray's defaults (a check every 3 s, each given 10 s,
5 failures in a row) take 15-20 s for a killed raylet and about a minute
for an unreachable one. The head's ``ray start`` gets these instead:

==========================================  =======  ===========================================
Ray setting (env of the head's GCS)          ours     knob (agent environment)
==========================================  =======  ===========================================
``RAY_health_check_period_ms``               1000     ``ELASTIC_AGENT_HEALTH_CHECK_PERIOD_MS``
``RAY_health_check_timeout_ms``              1000     ``ELASTIC_AGENT_HEALTH_CHECK_TIMEOUT_MS``
``RAY_health_check_failure_threshold``       4        ``ELASTIC_AGENT_HEALTH_CHECK_FAILURE_THRESHOLD``
``RAY_health_check_initial_delay_ms``        3000     ``ELASTIC_AGENT_HEALTH_CHECK_INITIAL_DELAY_MS``
==========================================  =======  ===========================================

A killed raylet refuses the check at once: DEAD after about 4 failures x 1 s,
4-5 s. An unreachable one times out each check: 4 x (1 s + 1 s), about 8 s.
A raylet that stalls (a busy two-core node, a long GC) fails about one check
per 2 s of stall, so it must stall for some 7 s in a row before it is
declared dead: a 2 s hiccup costs one failure, which the next answer resets.

A value the user set for the head already (``RAY_health_check_*`` in the
launcher's env, or in the agent's own environment) wins over ours.
"""

from __future__ import annotations

from collections.abc import Mapping

from ... import knobs

#: Ray's setting -> our knob (its default is ours; see :mod:`elastic_ray.knobs`). Ray reads ``RAY_<name>`` at start.
SETTINGS: Mapping[str, knobs.Knob[int]] = {
    "health_check_period_ms": knobs.HEALTH_CHECK_PERIOD_MS,
    "health_check_timeout_ms": knobs.HEALTH_CHECK_TIMEOUT_MS,
    "health_check_failure_threshold": knobs.HEALTH_CHECK_FAILURE_THRESHOLD,
    "health_check_initial_delay_ms": knobs.HEALTH_CHECK_INITIAL_DELAY_MS,
}


def head_health_env(agent_env: Mapping[str, str], launcher_env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The ``RAY_health_check_*`` variables to add to the head's ``ray start``.

    Raises ValueError naming the knob when one is not a whole number >= 1
    (the threshold) or >= 100 ms (the times): a typo must not silently leave
    the GCS with Ray's slow defaults, nor make it declare every node dead.
    """
    launcher_env = launcher_env or {}
    env: dict[str, str] = {}
    for name, knob in SETTINGS.items():
        ray_name = f"RAY_{name}"
        if ray_name in launcher_env or ray_name in agent_env:
            continue   # the user's own setting reaches the GCS unchanged
        env[ray_name] = str(knob.read(agent_env))
    return env


__all__ = ["SETTINGS", "head_health_env"]
