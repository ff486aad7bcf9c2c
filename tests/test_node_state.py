"""NodeState: the record each agent publishes, and the protocol version rule.

Every key is checked for a wrong type and for being missing, so a damaged or
foreign node file is refused with its key named instead of surfacing as a
KeyError in the coordinator or the CLI.
"""

from __future__ import annotations

import json
import math
import re

import pytest

from elastic_ray.agent.head.hosted import HostedState
from elastic_ray.agent.machine import State
from elastic_ray.protocol.disk.records import GpuUsage
from elastic_ray.protocol.disk.records import (
    PROTOCOL_VERSION,
    AgentState,
    HostedHead,
    HostedHeadState,
    NewerProtocolError,
    NodeState,
    RequestCounts,
    Transition,
    check_protocol_version,
)
from tests.helpers import node_state

NOW = 1_800_000_000.0

# What the agent wrote before the record was typed; readers and `--json`
# outputs depend on these names.
KEYS_BEFORE_THE_RECORD = {
    "session", "job_id", "node", "node_ip", "node_index", "role", "state", "reason", "since", "head_job",
    "head_address", "node_id", "ports", "ray_pid", "raylet_pid", "temp_dir", "ray_address", "restarts",
    "failures", "max_restarts", "next_retry_at", "gave_up_on", "drain_deadline", "no_head_since",
    "rejoin_timeout", "started_at", "updated_at", "pid", "pid_create_time", "control", "requests",
    "hosted_head", "history", "handover_deadline", "transitions", "exited", "exit_code",
}


def full() -> NodeState:
    """A state with every optional field set, so each one is exercised."""
    return node_state(
        "21", "gpua-1", "DRAINING", node_index=1, reason="drain request", since=NOW - 5,
        head_job="20", head_address="10.0.0.1:6379", node_id="a" * 56,
        ports={"min_worker_port": 0, "node_manager_port": 41000},
        ray_pid=4242, raylet_pid=4243, temp_dir="/tmp/er/abc/1", ray_address="10.0.0.2:6379",
        restarts=2, failures=1, next_retry_at=NOW + 8, gave_up_on="19", drain_deadline=NOW + 300,
        no_head_since=NOW - 60, pid_create_time=NOW - 100.5,
        gpu_usage=GpuUsage(7200.0, 1800.0, 121, NOW - 3600, NOW - 5), oom_kills=2,
        requests=RequestCounts(accepted=7, rejected=2, rejected_by_reason={"bad_mac": 2}),
        hosted_head=HostedHead(HostedHeadState.READY, NOW - 30, address="10.0.0.2:6380"),
        history=("STARTING->JOINED: joined", "JOINED->DRAINING: drain request"),
        handover_deadline=NOW + 120,
        transitions=(Transition(NOW - 50, AgentState.STARTING, AgentState.JOINED, "joined"),
                     Transition(NOW - 5, AgentState.JOINED, AgentState.DRAINING, "drain request")),
        exited=True, exit_code=0)


# ----------------------------------------------------------------- round trip and shape

@pytest.mark.parametrize("state", [full(), node_state()], ids=["every-field", "defaults"])
def test_round_trip_through_json(state):
    text = json.dumps(state.to_dict())
    assert NodeState.from_dict(json.loads(text)) == state


def test_the_keys_on_disk_are_those_written_before_plus_the_version():
    data = full().to_dict()
    # gpu_usage and oom_kills came later: optional on read (an older agent's file has none), always written.
    assert set(data) == KEYS_BEFORE_THE_RECORD | {"protocol_version", "gpu_usage", "oom_kills"}
    assert data["protocol_version"] == PROTOCOL_VERSION
    assert data["state"] == "DRAINING" and data["hosted_head"] == {
        "state": "READY", "address": "10.0.0.2:6380", "at": NOW - 30}
    assert data["transitions"][1] == {"at": NOW - 5, "from": "JOINED", "to": "DRAINING", "reason": "drain request"}
    assert data["requests"] == {"accepted": 7, "rejected": 2, "rejected_by_reason": {"bad_mac": 2}}


@pytest.mark.parametrize("written", [
    {"state": "STARTING", "at": NOW},
    {"state": "READY", "address": "10.0.0.3:6379", "at": NOW},
    {"state": "FAILED", "reason": "the head did not start; see the Ray log", "at": NOW},
])
def test_hosted_head_blocks_keep_the_agents_shapes(written):
    assert HostedHead.from_dict(written).to_dict() == written


def test_agent_states_are_the_machines_states():
    # One enum each: the machine's states are the ones the node file carries.
    assert State is AgentState
    assert HostedState is HostedHeadState


def test_unknown_keys_are_ignored():
    # A compatible addition by a newer writer keeps the protocol version.
    data = {**full().to_dict(), "gpu_uuids": ["GPU-1"]}
    assert NodeState.from_dict(data) == full()


# ----------------------------------------------------------------- refusals

def _refused(data, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        NodeState.from_dict(data)


REQUIRED = sorted(KEYS_BEFORE_THE_RECORD)


@pytest.mark.parametrize("key", REQUIRED)
def test_every_key_is_required(key):
    data = full().to_dict()
    del data[key]
    _refused(data, f"missing key {re.escape(repr(key))}")


WRONG_TYPES = {
    # strings
    "session": 5, "job_id": 5, "node": 5, "node_ip": 5, "role": 5, "state": 5, "reason": 5, "control": 5,
    # strings or null
    "head_job": 5, "head_address": 5, "node_id": 5, "temp_dir": 5, "ray_address": 5, "gave_up_on": 5,
    # times
    "since": "soon", "rejoin_timeout": "600", "started_at": "soon", "updated_at": True,
    # times or null
    "next_retry_at": "soon", "drain_deadline": [], "no_head_since": "soon", "pid_create_time": "soon",
    "handover_deadline": False,
    # counts and ids
    "node_index": 0.5, "max_restarts": "3", "restarts": 1.5, "failures": True, "pid": "4242",
    # ids or null
    "ray_pid": "12", "raylet_pid": 1.5, "exit_code": "0",
    # containers and flags
    "ports": [], "requests": [], "hosted_head": "READY", "history": "x", "transitions": {}, "exited": 1,
    "protocol_version": "1", "gpu_usage": "12 GPU-hours", "oom_kills": 1.5,
}


def test_the_wrong_type_table_covers_every_key():
    assert set(WRONG_TYPES) == set(full().to_dict())


@pytest.mark.parametrize("key,value", sorted(WRONG_TYPES.items()), ids=sorted(WRONG_TYPES))
def test_a_wrong_type_is_refused_naming_the_key(key, value):
    _refused({**full().to_dict(), key: value}, re.escape(repr(key)))


@pytest.mark.parametrize("key", ["session", "job_id", "node", "role", "state", "since", "pid", "control",
                                 "node_index", "restarts", "ports", "requests", "history", "transitions",
                                 "exited"])
def test_null_is_refused_where_the_agent_always_writes_a_value(key):
    _refused({**full().to_dict(), key: None}, re.escape(repr(key)))


@pytest.mark.parametrize("changes,match", [
    ({"state": "SLEEPING"}, "'state': 'SLEEPING' is not one of WAITING_FOR_HEAD"),
    ({"role": "driver"}, "'role': 'driver' is not one of head, worker"),
    ({"job_id": "12; rm -rf /"}, "job_id='12; rm -rf /': is not a job id"),
    ({"head_job": "../7"}, "head_job='../7': is not a job id"),
    ({"gave_up_on": "x"}, "gave_up_on='x': is not a job id"),
    ({"node": ""}, "'node' must not be empty"),
    ({"pid": 0}, "'pid' must be a positive process id"),
    ({"ray_pid": -3}, "'ray_pid' must be a positive process id"),
    ({"restarts": -1}, "'restarts' must not be negative"),
    ({"node_index": -1}, "'node_index' must not be negative"),
    ({"since": math.inf}, "'since' must be finite"),
    ({"ports": {"gcs_port": 70000}}, r"ports\['gcs_port'\] is not a port number"),
    ({"ports": {"gcs_port": True}}, r"ports\['gcs_port'\] is not a port number"),
    ({"history": ["ok", 3]}, r"history\[1\] has type int"),
    ({"hosted_head": {"state": "UP", "at": NOW}}, "hosted_head: 'state': 'UP' is not one of STARTING"),
    ({"hosted_head": {"state": "READY"}}, "hosted_head: missing key 'at'"),
    ({"hosted_head": {"state": "READY", "at": NOW, "address": 6379}}, "hosted_head: 'address' has type int"),
    ({"transitions": [{"at": NOW, "from": "JOINED", "to": "GONE", "reason": ""}]},
     r"transitions\[0\]: 'to': 'GONE' is not one of"),
    ({"transitions": [5]}, r"transitions\[0\]: expected an object"),
    ({"requests": {"accepted": 1, "rejected": 0}}, "requests: missing key 'rejected_by_reason'"),
    ({"requests": {"accepted": 1, "rejected": 1, "rejected_by_reason": {"bad_mac": -1}}},
     r"requests: rejected_by_reason\['bad_mac'\] is not a count"),
])
def test_a_bad_value_is_refused_naming_where(changes, match):
    _refused({**full().to_dict(), **changes}, match)


@pytest.mark.parametrize("data", [[], "JOINED", None, 5])
def test_a_file_that_is_not_an_object_is_refused(data):
    _refused(data, "expected an object")


# ----------------------------------------------------------------- protocol version

def test_a_newer_major_version_is_refused_with_a_clear_message():
    data = {**full().to_dict(), "protocol_version": PROTOCOL_VERSION + 1}
    with pytest.raises(NewerProtocolError) as info:
        NodeState.from_dict(data)
    assert str(info.value) == (
        f"protocol_version {PROTOCOL_VERSION + 1}: written by a newer elastic-ray "
        f"(protocol {PROTOCOL_VERSION + 1}); this one speaks protocol {PROTOCOL_VERSION}; "
        "upgrade elastic-ray here to read it")


def test_an_equal_version_is_read_and_kept():
    assert NodeState.from_dict(full().to_dict()).protocol_version == PROTOCOL_VERSION


def test_a_file_from_before_the_version_field_reads_as_version_one():
    data = full().to_dict()
    del data["protocol_version"]
    state = NodeState.from_dict(data)
    assert state == full() and state.protocol_version == 1


def test_older_versions_pass_the_check_newer_ones_do_not(monkeypatch):
    # Only protocol 1 exists so far; pretend this code speaks 3 to see an
    # older record accepted by the shared check.
    import elastic_ray.protocol.disk.records as records

    monkeypatch.setattr(records, "PROTOCOL_VERSION", 3)
    assert [check_protocol_version({"protocol_version": v}) for v in (1, 2, 3)] == [1, 2, 3]
    with pytest.raises(NewerProtocolError, match="protocol 4.*speaks protocol 3"):
        check_protocol_version({"protocol_version": 4})


@pytest.mark.parametrize("version,match", [
    (0, "not a protocol version"), (-2, "not a protocol version"), (1.0, "has type float"),
    (True, "must not be a boolean"), (None, "has type NoneType"),
])
def test_a_version_that_is_no_version_is_refused(version, match):
    with pytest.raises(ValueError, match=match) as info:
        NodeState.from_dict({**full().to_dict(), "protocol_version": version})
    assert not isinstance(info.value, NewerProtocolError)  # damaged, not "upgrade"


def test_the_version_is_required_where_records_always_carried_it():
    with pytest.raises(ValueError, match="missing key 'protocol_version'"):
        check_protocol_version({})
    assert check_protocol_version({}, missing=1) == 1


def test_a_file_of_an_agent_before_gpu_usage_still_reads():
    data = full().to_dict()
    del data["gpu_usage"]
    assert NodeState.from_dict(data).gpu_usage is None
    assert NodeState.from_dict(full().to_dict()).gpu_usage == GpuUsage(7200.0, 1800.0, 121, NOW - 3600, NOW - 5)


def test_a_file_of_an_agent_before_oom_kills_still_reads_and_a_negative_count_is_refused():
    data = full().to_dict()
    del data["oom_kills"]
    assert NodeState.from_dict(data).oom_kills is None
    assert NodeState.from_dict({**data, "oom_kills": None}).oom_kills is None
    assert NodeState.from_dict(full().to_dict()).oom_kills == 2
    _refused({**data, "oom_kills": -1}, "'oom_kills' must not be negative")
