"""Ray driver programs for the agent's lab tests (integration/test_agent_slurm.py).

A Ray driver must run on a node of the Ray cluster (it talks to a local
raylet), so the tests run this file inside the head's Slurm job with
``srun --jobid=<head job> --overlap``: exactly where a run's payload steps
run. It prints ONE JSON line on stdout (last line) and nothing else there.

Modes (``python lab_ray_driver.py MODE ARGS_JSON``):

``resources``   ``{"actors": [{"resource": name}, ...]}``: the cluster's
                resources and nodes, and for each entry the node an actor
                that asks for one unit of ``resource`` was placed on.
``drain``       ``{"node": X, "markers": DIR, "seconds": S}``: a task pinned
                to X (no retries) that runs S seconds; once it runs the
                driver writes ``long-started`` and waits for ``go`` (the
                test drains X in between); then it submits small tasks that
                prefer X (soft affinity) and reports where they ran and the
                long task's result.
``retry``       ``{"node": Y, "markers": DIR, "seconds": S, "max_retries": R}``:
                a task that prefers Y (soft affinity), runs S seconds and
                may be retried; every attempt appends its node to
                ``attempts``. Reports the result.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time


def _marker(directory: str, name: str, text: str = "") -> None:
    path = os.path.join(directory, name)
    with open(path + ".tmp", "w") as handle:
        handle.write(text)
    os.replace(path + ".tmp", path)


def main() -> int:
    mode, args = sys.argv[1], json.loads(sys.argv[2])
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    ray.init(logging_level="ERROR", log_to_driver=False)
    here = lambda: {"node_id": ray.get_runtime_context().get_node_id(), "host": socket.gethostname()}  # noqa: E731

    if mode == "resources":
        out = {"total": ray.cluster_resources(),
               "nodes": [{"node_id": n["NodeID"], "alive": n["Alive"], "resources": n["Resources"],
                          "ip": n["NodeManagerAddress"]} for n in ray.nodes() if n["Alive"]],
               "actors": []}

        @ray.remote(num_cpus=0)
        class Where:
            def where(self):
                return here()

        for spec in args.get("actors", []):
            actor = Where.options(resources={spec["resource"]: 1}).remote()
            out["actors"].append({"resource": spec["resource"], **ray.get(actor.where.remote(), timeout=60)})
            ray.kill(actor)
        print(json.dumps(out))
        return 0

    if mode == "drain":
        markers, seconds, target = args["markers"], float(args["seconds"]), args["node"]

        @ray.remote(num_cpus=1, max_retries=0)
        def long_task(markers: str, seconds: float):
            start = time.time()
            _marker(markers, "long-started", json.dumps({**here(), "at": start}))
            time.sleep(seconds)
            return {**here(), "started": start, "finished": time.time()}

        @ray.remote(num_cpus=1)
        def small_task():
            time.sleep(0.5)
            return here()

        ref = long_task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(target, soft=False)).remote(
            markers, seconds)
        deadline = time.time() + 120
        while not os.path.exists(os.path.join(markers, "go")):
            if time.time() > deadline:
                print(json.dumps({"error": "no go marker"}))
                return 1
            time.sleep(0.1)
        submitted = time.time()
        prefer_x = NodeAffinitySchedulingStrategy(target, soft=True)
        small = ray.get([small_task.options(scheduling_strategy=prefer_x).remote() for _ in range(6)], timeout=120)
        small_done = time.time()
        result = ray.get(ref, timeout=seconds + 120)
        print(json.dumps({"long": result, "small": small, "small_submitted": submitted, "small_done": small_done,
                          "long_done": time.time()}))
        return 0

    if mode == "retry":
        markers, seconds, target = args["markers"], float(args["seconds"]), args["node"]

        @ray.remote(num_cpus=1)
        def long_task(markers: str, seconds: float):
            start = time.time()
            with open(os.path.join(markers, "attempts"), "a") as handle:
                handle.write(json.dumps({**here(), "at": start}) + "\n")
            time.sleep(seconds)
            return {**here(), "started": start, "finished": time.time()}

        ref = long_task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(target, soft=True),
                                max_retries=int(args.get("max_retries", 2))).remote(markers, seconds)
        result = ray.get(ref, timeout=seconds * 3 + 120)
        print(json.dumps({"result": result, "done": time.time()}))
        return 0

    print(json.dumps({"error": f"unknown mode {mode}"}))
    return 2


if __name__ == "__main__":
    sys.exit(main())
