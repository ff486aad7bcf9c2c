"""The head's life: who serves it, watching it, moving it.

``election`` (who becomes the next head, pure), ``assessment`` (the facts it
is given), ``claims`` (the one election claim), ``failover`` (replacing the
head: the election's effects),
``standby`` (the warm standby head), ``headwatch`` (the heartbeat
observation), ``nudges`` (telling agents that the head moved),
``supervise`` (a process's supervision of the head) and ``ready`` (waiting
for a ready head without electing).
"""
