"""The committing payload, speaking Dagster Pipes.

Run by ``ComputeResource.run(payload_path=<this file>, args=[COMMITS, TOTAL])``
(optionally ``--wait-cpus N`` to wait until the cluster offers N idle CPUs
first). It logs through Pipes and reports the asset's materialization with
how many units it committed, so the asset's metadata shows the run's work.
Needs ``dagster-pipes`` in the driver's environment, nothing else of Dagster.
"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    import ray
    from dagster_pipes import open_dagster_pipes

    from elastic_ray.demo.payload import commit_units
    from elastic_ray.ray import wait_for_stable_ray_resources

    parser = argparse.ArgumentParser(prog="pipes_payload")
    parser.add_argument("commits")
    parser.add_argument("total", type=int)
    parser.add_argument("--wait-cpus", type=float, default=0)
    args = parser.parse_args(argv)

    with open_dagster_pipes() as pipes:
        ray.init(logging_level="ERROR", log_to_driver=False)
        metadata: dict[str, object] = {}
        if args.wait_cpus:
            seen = wait_for_stable_ray_resources({"CPU": args.wait_cpus}, stable_polls=2,
                                                 poll_interval_seconds=0.5, timeout_seconds=180)
            pipes.log.info(f"cluster offers {seen.get('CPU', 0):g} idle CPUs")
            metadata["cpus_seen"] = float(seen.get("CPU", 0))
        counts = commit_units(args.commits, args.total, pipes.log.info)
        metadata.update(counts)
        metadata["total_cpus"] = float(ray.cluster_resources().get("CPU", 0))
        pipes.report_asset_materialization(metadata=metadata)
    return 0


if __name__ == "__main__":
    sys.exit(main())
