"""Scaling a session by itself: the policy (what it may submit), the shapes
Ray asks for, and the decisions (pure; tested by table).

``from elastic_ray.autoscale import AutoscalePolicy, Pool`` is the contract of
issue 23; ``Session.autoscale(policy)`` turns it on. Everything in this room
is pure; the shell that reads Ray's demand, runs the decisions under a lease
in one supervising process and carries them out is ``coordinator/scaling``.
"""

from ..config.autoscale import AutoscalePolicy, Pool

__all__ = ["AutoscalePolicy", "Pool"]
