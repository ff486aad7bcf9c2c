"""Scaling a session by itself: the policy (what it may submit), the shapes
Ray asks for, and the decisions (pure; tested by table).

``from elastic_ray.autoscale import AutoscalePolicy, Pool`` is the contract of
issue 23. Work in progress: the decisions exist and are tested; the shell that
reads Ray's demand, runs them under a lease and carries them out does not yet,
so nothing scales by itself so far.
"""

from ..config.autoscale import AutoscalePolicy, Pool

__all__ = ["AutoscalePolicy", "Pool"]
