"""Hooks that let simulations and tests replace Ray itself, and nothing else.

A scale simulation (``bench/bench_scale.py``) runs hundreds of real agents on
one small machine. Real Ray nodes would not fit (a raylet alone costs more
than the agent), so the simulation puts a stand-in in place of ``ray start``
and of the short-lived GCS probe process; the agent's own code (its state
machine, the session directory, ZeroMQ, the heartbeat, the control channel)
runs unchanged.

Both hooks are environment variables, read when used, and off when unset or
empty. They are meant for simulations and tests only: with a stand-in the
agent reports Ray nodes that do not exist.

``ELASTIC_RAY_RAY_EXECUTABLE``
    The program run as ``<it> start ...`` instead of this environment's
    ``ray`` (``ray_args.build_ray_start``'s ``ray_executable``).
``ELASTIC_RAY_GCS_PROBE``
    The command (split like a shell would, no shell involved) run instead of
    ``python -m elastic_ray.agent.node.gcs_probe``; it gets the same ``op`` and
    options and must answer as the probe does (one JSON line on stdout).
"""

from __future__ import annotations

from collections.abc import Mapping

from ... import knobs

RAY_EXECUTABLE_ENV = knobs.RAY_EXECUTABLE.name
GCS_PROBE_ENV = knobs.GCS_PROBE.name


def ray_executable(environ: Mapping[str, str] | None = None) -> str | None:
    """The stand-in for ``ray`` named by ``$ELASTIC_RAY_RAY_EXECUTABLE``, or None (the real one)."""
    return knobs.RAY_EXECUTABLE.read(environ)


def gcs_probe_argv(environ: Mapping[str, str] | None = None) -> list[str] | None:
    """The stand-in probe command named by ``$ELASTIC_RAY_GCS_PROBE``, or None (the real probe).

    Raises ValueError naming the variable when it cannot be split (an
    unclosed quote), rather than running something else.
    """
    return knobs.GCS_PROBE.read(environ) or None
