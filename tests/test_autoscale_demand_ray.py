"""The demand reader against a real Ray head: what a driver waits for reaches read_state.

A separate head (no CPUs, no GPUs of its own: the local scheduler's head allocation) and no
worker: four tasks asking for a GPU, a STRICT_SPREAD placement group of two GPU bundles and a
``request_resources`` of three CPUs all wait. A driver started by Session.run asks the head's
GCS for its cluster resource state (the call the autoscaler's reader makes) and prints it as
``MessageToDict`` gives it, with what ``request_resources`` left in the GCS's key-value store
(Ray's autoscaler v1, the default, keeps it there); the test reads both with ``read_state``.
"""

from __future__ import annotations

import json
import sys

import pytest

from elastic_ray import SlurmRunAllocationConfig
from elastic_ray.autoscale.demand import read_state
from elastic_ray.config.launcher import RayLauncher
from elastic_ray.coordinator.session import Session
from tests.helpers import wait_until

pytestmark = [pytest.mark.ray, pytest.mark.timeout(300)]

DRIVER = r'''
import json, sys, time
import ray
from google.protobuf.json_format import MessageToDict
from ray._raylet import GcsClient
from ray.autoscaler.v2.sdk import get_cluster_resource_state

ray.init(logging_level="ERROR", log_to_driver=False)

@ray.remote(num_gpus=1)
def needs_a_gpu():
    return 1

waiting = [needs_a_gpu.remote() for _ in range(4)]
group = ray.util.placement_group([{"GPU": 1}] * 2, strategy="STRICT_SPREAD")
from ray.autoscaler.sdk import request_resources
request_resources(bundles=[{"CPU": 1}] * 3)
gcs = GcsClient(address=ray.get_runtime_context().gcs_address)
wanted = ("pending_resource_requests", "pending_gang_resource_requests", "cluster_resource_constraints")
deadline = time.time() + 60
while True:
    state = MessageToDict(get_cluster_resource_state(gcs), preserving_proto_field_name=True)
    if all(state.get(k) for k in wanted[:2]) or time.time() > deadline:
        break
    time.sleep(0.5)
kv = gcs.internal_kv_get(b"autoscaler_resource_request", None)
print(json.dumps({"state": state, "requested": json.loads(kv) if kv else None}))
'''


def test_the_head_s_resource_state_tells_tasks_groups_and_requests(tmp_path, monkeypatch):
    monkeypatch.setenv("ELASTIC_AGENT_BACKOFF_BASE", "1")
    monkeypatch.setenv("ELASTIC_AGENT_POLL_INTERVAL", "0.5")
    session = Session.create(tmp_path / "s", scheduler="local", supervise=False,
                             head=SlurmRunAllocationConfig(partition="cpu", time_limit="30", mem="2G"),
                             launcher=RayLauncher(object_store_memory=100_000_000))
    try:
        session.wait_for_head(timeout=120)
        out = tmp_path / "state.json"
        with out.open("w") as handle, (tmp_path / "driver.err").open("w") as err:
            session.run([sys.executable, "-c", DRIVER], stdout=handle, stderr=err).wait(timeout=150)
        reply = json.loads(out.read_text().strip().splitlines()[-1])
        state = read_state(reply["state"], reply["requested"])
        assert state.demand.pending == ({"CPU": 1.0, "GPU": 1.0},) * 4, state   # a task asks a CPU too
        assert [(g.bundles, g.strategy) for g in state.demand.gangs] == [(({"GPU": 1.0},) * 2, "STRICT_SPREAD")]
        assert state.demand.constraints == ({"CPU": 1.0},) * 3
        assert len(state.nodes) == 1 and state.nodes[0].alive and len(state.nodes[0].node_id) == 56
    finally:
        session.teardown()
        wait_until(lambda: all(i.state.is_final for i in session.query().values()), timeout=60,
                   message="session jobs did not end after teardown")
