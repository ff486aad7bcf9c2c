"""The autoscaler's policy and the shapes it reasons with: pure, by table."""

from __future__ import annotations

import pytest

from elastic_ray import SlurmWorkerAllocationConfig as W
from elastic_ray.autoscale import AutoscalePolicy, Pool
from elastic_ray.autoscale import shapes
from elastic_ray.errors import ConfigError

A40 = W(partition="gpu-a", num_nodes=1, gpus_per_node=4, cpus_per_task=32, mem="200G", time_limit="08:00:00",
        ray_resources={"accelerator:a40": 1})
B = W(partition="gpu-b", num_nodes=1, gpus_per_node=2, time_limit="04:00:00")
TWO = W(partition="cpu", num_nodes=2, cpus_per_task=4)


def test_the_issue_s_example_builds_and_goes_to_a_dict_and_back():
    policy = AutoscalePolicy(pools=[Pool(A40, max_allocations=4), Pool(B, max_allocations=2)],
                             min_allocations=0, max_nodes=8, idle_timeout=300, backlog=1,
                             replace_before_walltime=900)
    assert isinstance(policy.pools, tuple)
    again = AutoscalePolicy.from_dict(policy.to_dict())
    assert again == policy
    assert again.pools[0].config.ray_resources == {"accelerator:a40": 1.0}


@pytest.mark.parametrize("kwargs, field", [
    pytest.param({"pools": []}, "pools", id="no-pools"),
    pytest.param({"pools": "gpu-a"}, "pools", id="pools-a-string"),
    pytest.param({"pools": [B]}, "pools[0]", id="a-config-not-a-pool"),
    pytest.param({"pools": [Pool(B)], "min_allocations": -1}, "min_allocations", id="min-negative"),
    pytest.param({"pools": [Pool(B, max_allocations=2)], "min_allocations": 3}, "min_allocations",
                 id="min-above-the-pools-max"),
    pytest.param({"pools": [Pool(TWO)], "max_nodes": 1}, "max_nodes", id="max-nodes-below-a-pool"),
    pytest.param({"pools": [Pool(B, max_allocations=3)], "min_allocations": 3, "max_nodes": 2}, "min_allocations",
                 id="min-needs-more-nodes-than-max"),
    pytest.param({"pools": [Pool(B)], "max_nodes": 0}, "max_nodes", id="max-nodes-zero"),
    pytest.param({"pools": [Pool(B)], "idle_timeout": 0}, "idle_timeout", id="idle-timeout-zero"),
    pytest.param({"pools": [Pool(B)], "idle_timeout": -5}, "idle_timeout", id="idle-timeout-negative"),
    pytest.param({"pools": [Pool(B)], "idle_timeout": float("inf")}, "idle_timeout", id="idle-timeout-inf"),
    pytest.param({"pools": [Pool(B)], "replace_before_walltime": -1}, "replace_before_walltime",
                 id="replace-negative"),
    pytest.param({"pools": [Pool(B)], "backlog": 0}, "backlog", id="backlog-zero"),
    pytest.param({"pools": [Pool(B)], "backlog": True}, "backlog", id="backlog-a-bool"),
    pytest.param({"pools": [Pool(B)], "demand_delay": "2"}, "demand_delay", id="delay-a-string"),
    pytest.param({"pools": [Pool(B)], "race": "yes"}, "race", id="race-not-a-bool"),
])
def test_a_bad_policy_is_refused_naming_its_field(kwargs, field):
    with pytest.raises(ConfigError) as caught:
        AutoscalePolicy(**kwargs)
    assert caught.value.field == field, caught.value


@pytest.mark.parametrize("kwargs, field", [
    pytest.param({"config": B, "max_allocations": 0}, "max_allocations", id="max-zero"),
    pytest.param({"config": B, "max_allocations": 1.5}, "max_allocations", id="max-a-float"),
    pytest.param({"config": {"partition": "gpu-b"}}, "config", id="config-a-dict"),
])
def test_a_bad_pool_is_refused_naming_its_field(kwargs, field):
    with pytest.raises(ConfigError) as caught:
        Pool(**kwargs)
    assert caught.value.field == field


@pytest.mark.parametrize("data, field", [
    pytest.param({"pools": [{"config": {"partition": "gpu-b"}}], "idle": 3}, "idle", id="unknown-key"),
    pytest.param({"pools": [{"config": {"partition": "gpu-b", "gpus": 2}}]}, "pools[0].config.gpus",
                 id="unknown-config-key"),
    pytest.param({"pools": [{"max_allocations": 2}]}, "pools[0].config", id="pool-without-config"),
    pytest.param({"pools": [{"config": {"partition": "gpu-b"}, "max_allocations": 0}]},
                 "pools[0].max_allocations", id="pool-max-zero"),
    pytest.param({"pools": [{"config": {"partition": "gpu b"}}]}, "pools[0].config.partition", id="bad-partition"),
    pytest.param({}, "pools", id="no-pools-key"),
    pytest.param([], "autoscale", id="not-a-table"),
])
def test_a_stored_policy_with_a_bad_value_names_where(data, field):
    with pytest.raises(ConfigError) as caught:
        AutoscalePolicy.from_dict(data)
    assert caught.value.field == field, caught.value


@pytest.mark.parametrize("config, shape", [
    pytest.param(A40, {"CPU": 32, "GPU": 4, "accelerator:a40": 1}, id="a40"),
    pytest.param(B, {"CPU": 1, "GPU": 2}, id="cpus-unset-one"),
    pytest.param(W(partition="cpu", cpus_per_task=8, gpus_per_node=0), {"CPU": 8}, id="no-gpus"),
])
def test_a_pool_s_node_shape(config, shape):
    assert shapes.node_shape(config) == shape


@pytest.mark.parametrize("request_, capacity, fits", [
    ({"GPU": 1}, {"CPU": 1, "GPU": 2}, True),
    ({"GPU": 3}, {"CPU": 1, "GPU": 2}, False),
    ({"accelerator:a40": 1}, {"CPU": 1, "GPU": 2}, False),
    ({"accelerator:a40": 0.5, "GPU": 1}, {"CPU": 32, "GPU": 4, "accelerator:a40": 1}, True),
    ({"CPU": 0}, {}, True),                                   # asks for nothing
    ({"CPU": 0.30000001}, {"CPU": 0.3}, True),                # within Ray's resolution
    ({}, {"CPU": 1}, True),
])
def test_fits(request_, capacity, fits):
    assert shapes.fits(request_, capacity) is fits


@pytest.mark.parametrize("requests, node, needed", [
    pytest.param([{"GPU": 1}] * 4, {"CPU": 1, "GPU": 2}, 2, id="four-gpus-on-two-gpu-nodes"),
    pytest.param([{"GPU": 1}] * 4, {"CPU": 32, "GPU": 4}, 1, id="four-on-one"),
    pytest.param([{"GPU": 2}, {"GPU": 1}, {"GPU": 1}, {"GPU": 2}], {"GPU": 3}, 2, id="biggest-first"),
    pytest.param([{"GPU": 5}], {"GPU": 4}, None, id="never-fits"),
    pytest.param([], {"CPU": 1}, 0, id="nothing"),
    pytest.param([{"CPU": 1, "GPU": 1}] * 3, {"CPU": 2, "GPU": 4}, 2, id="cpus-bind-first"),
])
def test_nodes_needed(requests, node, needed):
    assert shapes.nodes_needed(requests, node) == needed


@pytest.mark.parametrize("bundles, strategy, needed", [
    ([{"GPU": 1}, {"GPU": 1}], "STRICT_SPREAD", 2),
    ([{"GPU": 1}, {"GPU": 1}], "PACK", 1),
    ([{"GPU": 1}, {"GPU": 1}], "STRICT_PACK", 1),
    ([{"GPU": 2}, {"GPU": 1}], "STRICT_PACK", None),   # 3 GPUs on one 2-GPU node: never
    ([{"GPU": 2}, {"GPU": 1}], "SPREAD", 2),
    ([{"GPU": 3}], "PACK", None),
])
def test_gang_nodes(bundles, strategy, needed):
    assert shapes.gang_nodes(bundles, {"CPU": 1, "GPU": 2}, strategy) == needed


def test_pack_puts_what_fits_and_returns_the_rest():
    placed, left = shapes.pack([{"GPU": 1}, {"GPU": 2}, {"GPU": 1}], [{"GPU": 2}, {"GPU": 1}])
    assert placed == [0, 1]          # the 2-GPU one first, then one 1-GPU one; the last finds no room
    assert left == [{"GPU": 0.0}, {"GPU": 0.0}]
    assert shapes.describe({"GPU": 1, "CPU": 0, "accelerator:a40": 0.5}) == "{GPU: 1, accelerator:a40: 0.5}"
