"""Run the agent with `python -m elastic_ray.agent`."""
from .cli import main

main()
