"""Ray on this node: the agent's side of one node's Ray processes.

``ray_args`` (the ``ray start`` arguments and ports, pure), ``ray_memory``
(what a node offers Ray), ``ray_node`` (one Ray node's processes),
``local_ray`` (this agent's Ray nodes: launch, stop, generations), ``join``
(when a node counts as joined, and when a head counts as registered),
``gcs`` and ``gcs_probe`` (GCS questions in a short-lived process, the one
file of the agent that imports Ray), ``proc_watch``, ``private_dirs`` (each
node's own temporary and spill directories), ``node_address``,
``health_check`` (the head GCS's detector of silent nodes, pure) and
``simulation`` (the hooks that put a stand-in in place of Ray).

Named ``node`` and not ``ray`` so that it never shadows ``elastic_ray.ray``
(the helpers for payload code).
"""
