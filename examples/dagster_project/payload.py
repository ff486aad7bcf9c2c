"""The example's payload: square numbers on the Ray cluster, report over Dagster Pipes."""

import argparse

import ray
from dagster_pipes import open_dagster_pipes

from elastic_ray.ray import wait_for_stable_ray_resources


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("count", type=int)
    parser.add_argument("--wait-cpus", type=float, default=0)
    args = parser.parse_args()
    with open_dagster_pipes() as pipes:
        ray.init(logging_level="ERROR", log_to_driver=False)
        if args.wait_cpus:
            wait_for_stable_ray_resources({"CPU": args.wait_cpus}, poll_interval_seconds=0.5, timeout_seconds=300)

        @ray.remote(num_cpus=1)
        def square(x: int) -> int:
            return x * x

        values = ray.get([square.remote(i) for i in range(args.count)])
        cpus = ray.cluster_resources().get("CPU", 0)
        pipes.log.info(f"{len(values)} squares on {cpus:g} CPUs")
        pipes.report_asset_materialization(metadata={"count": len(values), "sum": sum(values), "cpus": cpus})


if __name__ == "__main__":
    main()
