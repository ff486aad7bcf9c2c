"""The shell that runs the autoscaler (issue 23): the pure decisions are
:mod:`elastic_ray.autoscale`'s; here is what reads their inputs, runs them
in one process of the run at a time, and carries their actions out.

``store`` (the policy file and the autoscaler's own state file), ``lease``
(which process runs it: pure rules over allocation.json's lease),
``view`` (the run as the decisions see it: pure), ``ray_demand`` (the
head's demand, read in a short-lived probe), ``estimates`` (Slurm's start
estimates, rate-limited per pool), ``act`` (the actions, through the
session's own calls) and ``runner`` (the loop beside the head supervisor).
"""
