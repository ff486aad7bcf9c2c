"""Helpers for payload code running on a run's Ray cluster.

Kept apart from the agent and the coordinator: payloads import this inside
the driver, where Ray is already in use; nothing else in elastic-ray needs it.
"""

from .resources import wait_for_stable_ray_resources

__all__ = ["wait_for_stable_ray_resources"]
