"""Ray's cluster resource state turned into the autoscaler's demand (elastic_ray/autoscale/demand.py), by table.

The replies are written as ``MessageToDict(..., preserving_proto_field_name=True)`` gives them:
int64 fields as strings, zero values left out, node ids in base64.
"""

from __future__ import annotations

import base64

import pytest

from elastic_ray.autoscale.decide import Demand, Gang
from elastic_ray.autoscale.demand import MAX_PER_SHAPE, StateError, grew, read_state


def req(resources, **extra):
    return {"resources_bundle": resources, **extra}


NODE = base64.b64encode(bytes.fromhex("ab" * 28)).decode()


def test_a_reply_with_every_kind_of_demand():
    state = read_state({
        "pending_resource_requests": [
            {"request": req({"GPU": 1.0}), "count": "4"},
            {"request": req({"CPU": 1.0, "node:10.0.0.5": 0.001}), "count": "2"},       # pinned: skipped
            {"request": req({"CPU_group_0_abc": 1.0}), "count": "1"},                   # a group's bundle
            {"request": req({"CPU": 0.0}), "count": "3"},                               # asks for nothing
        ],
        "pending_gang_resource_requests": [
            {"requests": [req({"GPU": 2.0}, placement_constraints=[{"anti_affinity": {"label_name": "_PG_1",
                                                                                       "label_value": "x"}}])] * 2,
             "details": "3c4e5fe71be8f3d04d164ecb9f2f01000000:STRICT_SPREAD|PENDING"},   # as Ray 2.60 says it
            {"requests": [req({"GPU": 1.0}, placement_constraints=[{"affinity": {"label_name": "_PG_2"}}])] * 2},
            {"requests": [req({"CPU": 1.0})] * 3},
        ],
        "cluster_resource_constraints": [{"resource_requests": [{"request": req({"CPU": 1.0}), "count": "3"}]}],
        "node_states": [{"node_id": NODE, "total_resources": {"CPU": 2.0, "GPU": 2.0},
                         "available_resources": {"CPU": 2.0}, "idle_duration_ms": "42000", "status": "IDLE"},
                        {"node_id": NODE, "status": "DEAD"}],
    })
    d = state.demand
    assert d.pending == ({"GPU": 1.0},) * 4 + ({},) * 3
    assert d.gangs == (Gang(({"GPU": 2.0},) * 2, "STRICT_SPREAD", "3c4e5fe71be8"), Gang(({"GPU": 1.0},) * 2, "STRICT_PACK"),
                       Gang(({"CPU": 1.0},) * 3, "PACK"))
    assert d.constraints == ({"CPU": 1.0},) * 3
    assert state.skipped == 2
    first, dead = state.nodes
    assert first.node_id == "ab" * 28 and first.idle_seconds == 42.0 and first.alive
    assert first.total == {"CPU": 2.0, "GPU": 2.0} and first.available == {"CPU": 2.0}
    assert dead.alive is False and dead.idle_seconds == 0.0


def test_a_group_described_otherwise_keeps_its_description():
    state = read_state({"pending_gang_resource_requests": [{"requests": [req({"GPU": 1.0})], "details": "my group"}]})
    assert state.demand.gangs[0].name == "my group"


def test_an_empty_reply_is_no_demand_and_a_huge_count_is_capped():
    assert read_state({}).demand.pending == ()
    state = read_state({"pending_resource_requests": [{"request": req({"CPU": 1.0}), "count": "1000000"}]})
    assert len(state.demand.pending) == MAX_PER_SHAPE
    assert read_state({"pending_resource_requests": [{"request": req({"CPU": 1.0})}]}).demand.pending == ()


@pytest.mark.parametrize("data, where", [
    ([], "cluster resource state"),
    ({"pending_resource_requests": "x"}, "pending_resource_requests: not a list"),
    ({"pending_resource_requests": [{"count": "1"}]}, "pending_resource_requests[0].request: missing"),
    ({"pending_resource_requests": [{"request": req({"GPU": "1"}), "count": "1"}]},
     "pending_resource_requests[0].request.resources_bundle['GPU']"),
    ({"pending_resource_requests": [{"request": req({"GPU": 1.0}), "count": "-1"}]}, "count: '-1' is negative"),
    ({"pending_resource_requests": [{"request": req({"GPU": 1.0}), "count": "many"}]}, "count: 'many'"),
    ({"pending_gang_resource_requests": [{"requests": [7]}]}, "pending_gang_resource_requests[0].requests[0]"),
    ({"node_states": [{"idle_duration_ms": "soon"}]}, "node_states[0].idle_duration_ms"),
    ({"node_states": [{"node_id": "***"}]}, "node_states[0].node_id"),
    ({"node_states": [{"total_resources": [1]}]}, "node_states[0].total_resources"),
])
def test_a_reply_that_is_not_a_state_names_the_field(data, where):
    with pytest.raises(StateError) as caught:
        read_state(data)
    assert where in str(caught.value), caught.value


def test_request_resources_from_the_key_value_store_when_the_state_has_none():
    state = read_state({}, [{"CPU": 1}, {"CPU": 1}, {"GPU": 0, "CPU": 2}, {"node:1.2.3.4": 1}])
    assert state.demand.constraints == ({"CPU": 1.0}, {"CPU": 1.0}, {"CPU": 2.0})
    both = read_state({"cluster_resource_constraints": [{"resource_requests": [{"request": req({"GPU": 1.0}),
                                                                                 "count": "1"}]}]}, [{"CPU": 1}])
    assert both.demand.constraints == ({"GPU": 1.0},)
    with pytest.raises(StateError, match=r"autoscaler_resource_request\[0\]"):
        read_state({}, [{"CPU": "one"}])


# ------------------------------------------------------------ new demand between turns (grew)

_G2 = Gang(bundles=({"GPU": 1},) * 2, strategy="STRICT_SPREAD", name="g")


@pytest.mark.parametrize("before, now, expected", [
    pytest.param(None, Demand(), False, id="no-turn-yet-nothing-asked"),
    pytest.param(None, Demand(pending=({"GPU": 1},)), True, id="no-turn-yet-something-asked"),
    pytest.param(Demand(), Demand(), False, id="nothing-before-nothing-now"),
    pytest.param(Demand(), Demand(pending=({"GPU": 1},)), True, id="a-first-task"),
    pytest.param(Demand(pending=({"GPU": 1},)), Demand(pending=({"GPU": 1},)), False, id="the-same"),
    pytest.param(Demand(pending=({"GPU": 1},)), Demand(pending=({"GPU": 1},) * 2), True, id="one-more-of-a-shape"),
    pytest.param(Demand(pending=({"GPU": 1},) * 3), Demand(pending=({"GPU": 1},)), False, id="only-fewer"),
    pytest.param(Demand(pending=({"GPU": 1},)), Demand(pending=({"CPU": 1},)), True, id="another-shape"),
    pytest.param(Demand(pending=({"GPU": 1, "CPU": 1},)), Demand(pending=({"CPU": 1, "GPU": 1},)), False,
                 id="key-order-does-not-matter"),
    pytest.param(Demand(), Demand(gangs=(_G2,)), True, id="a-placement-group"),
    pytest.param(Demand(gangs=(_G2,)), Demand(gangs=(_G2,)), False, id="the-same-group"),
    pytest.param(Demand(), Demand(constraints=({"CPU": 1},) * 4), True, id="request-resources"),
    pytest.param(Demand(constraints=({"CPU": 1},) * 4), Demand(), False, id="request-resources-cleared"),
])
def test_new_demand_between_turns(before, now, expected):
    assert grew(before, now) is expected
