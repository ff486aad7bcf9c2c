"""The demos and the canonical committing payload.

``main_demo`` is the main demo (``scripts/demo``, ``elastic-ray demo``): one
elastic Ray run from start to finish. ``allocations`` is the scheduler-only
demo (``elastic-ray demo --allocations-only``). ``payload`` is the canonical
payload that commits each unit of Ray work outside Ray exactly once; tests,
benches and docs run it as ``python -m elastic_ray.demo.payload``.
"""
