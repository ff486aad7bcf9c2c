"""Schedulers: the real Slurm CLI and an embedded local emulation."""

from .base import JobInfo, JobSpec, JobState, Scheduler

__all__ = ["JobInfo", "JobSpec", "JobState", "Scheduler"]
