"""The jobs' life: a session's Slurm jobs from submission to removal.

``submit`` (job specs), ``jobs`` (submitting, querying, cancelling through the
scheduler) around ``ownership`` (whose jobs they are, pure); ``answers`` and
``pacing`` (the one scheduler answer a run's processes share, and the pace of
waits); ``removal`` (draining and cancelling a worker allocation);
``failures`` (worker allocations that ended unasked: recorded, reported,
resubmitted); ``lost_nodes`` (the Ray nodes of ended allocations, reported to
the head).
"""
