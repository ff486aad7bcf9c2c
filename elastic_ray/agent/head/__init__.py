"""The run's head as one agent sees it: hosting it, following it, losing nodes.

``hosted`` (the hosted head's state machine and hand-over decisions, pure)
and ``hosted_head`` (its thread); ``head_watch`` (the followed head's
liveness, pure) and ``following`` (the pointer and heartbeat effects);
``rejoin_order`` (who restarts Ray first after the head moved);
``publishing`` (the heartbeat socket and the node file); ``node_gone``
(``mark_dead``: the head's side and a worker's report).
"""
