"""What Slurm does to this node's job, seen from the agent.

``slurmd_rules`` (when to ask the scheduler while the node's slurmd is gone,
and what its answer means, pure) and ``slurmd_watch`` (the look and the
lookup); ``walltime`` (when a head drains ahead of its walltime, pure) and
``signal_drain`` (the pre-walltime signal's scheduler lookup and drain).
"""
