"""`python -m elastic_ray.cli`: the same as the `elastic-ray` command."""

from .main import main

main()
