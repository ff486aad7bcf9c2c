"""The SSH mode's wire format (pure): requests, events, errors rebuilt as the same type."""

from __future__ import annotations

import json

import pytest

from elastic_ray import errors
from elastic_ray.coordinator.drivers import PayloadFailed
from elastic_ray.polling import WaitTimeout
from elastic_ray.remote import wire

SAMPLES = [
    errors.ConfigError("time_limit", "soon", "must be minutes or D-HH:MM:SS"),
    errors.SchedulerError("sbatch failed", argv=("sbatch", "x"), returncode=1, stderr="bad partition"),
    errors.SessionDirError("no session.json"),
    errors.CorruptFileError("/s/allocation.json", "not JSON"),
    errors.TeardownIncomplete(("12", "13"), ("scancel 14: refused",)),
    errors.UnsafePathError("/s/secret", "readable by others"),
    errors.AllocationFailed("head 5 ended FAILED", state="FAILED", job_id="5", log_path="/s/logs/head-5.out"),
    errors.SlurmAllocationEnded("head 7 is REPLACED", allocation_state="REPLACED", job_id="7"),
    errors.SlurmStepDrained("head 7 drains", job_id="7"),
    PayloadFailed(3, ["python", "x.py"]),
    PayloadFailed(1, ["python", "x.py"], step_state="OUT_OF_MEMORY", step="12.3"),
    WaitTimeout("head ready", 30.0, "PENDING"),
    TimeoutError("driver still running after 5s; stopped it"),
    ValueError("argv: must be a non-empty list of strings"),
    FileNotFoundError("payload_path: /x.py is not a file"),
]


def roundtrip(exc: BaseException) -> BaseException:
    line = wire.encode(wire.error_event(exc, "Traceback ..."))
    event = wire.decode(line)
    assert event is not None and event["ev"] == "error"
    return wire.rebuild_error(event)


@pytest.mark.parametrize("exc", SAMPLES, ids=lambda e: type(e).__name__)
def test_errors_come_back_as_the_same_type_with_the_same_attributes(exc):
    back = roundtrip(exc)
    assert type(back) is type(exc)
    assert str(back) == str(exc)
    assert {k: v for k, v in vars(back).items()} == {k: v for k, v in vars(exc).items() if not k.startswith("_")}


def test_a_failover_loop_catching_the_base_class_catches_a_rebuilt_drain():
    back = roundtrip(errors.SlurmStepDrained("head 7 drains", job_id="7"))
    with pytest.raises(errors.SlurmAllocationEnded) as caught:
        raise back
    assert caught.value.allocation_state == "DRAINING" and caught.value.job_id == "7"


def test_tuples_stay_tuples_and_unknown_values_become_their_repr():
    back = roundtrip(errors.TeardownIncomplete(("1",), ("e",)))
    assert back.cancelled == ("1",) and back.errors == ("e",)
    back = roundtrip(errors.ConfigError("launcher", object, "must be a RayLauncher"))
    assert back.field == "launcher" and back.value == repr(object)


def test_an_unknown_type_arrives_as_remote_error_with_the_traceback():
    class Strange(Exception):
        pass

    back = roundtrip(Strange("odd"))
    assert isinstance(back, wire.RemoteError)
    assert back.type_name == "Strange" and "odd" in str(back) and back.traceback == "Traceback ..."


def test_lines_without_the_mark_are_noise_and_marked_garbage_is_a_protocol_error():
    assert wire.decode(b"Welcome to the login node\n") is None
    assert wire.decode(b"") is None
    with pytest.raises(wire.ProtocolError, match="unreadable"):
        wire.decode((wire.MARK + "{not json").encode())
    with pytest.raises(wire.ProtocolError, match="not an event"):
        wire.decode((wire.MARK + "[1, 2]").encode())
    assert wire.decode(wire.encode({"ev": "out", "fd": 1, "data": "x\n"})) == {"ev": "out", "fd": 1, "data": "x\n"}


def test_requests_carry_schema_and_version_and_a_mismatch_is_refused():
    line = wire.request("head", {"path": "/s"}, "1.2.3")
    assert line.endswith(b"\n") and b"\n" not in line[:-1]
    req = json.loads(line)
    assert wire.check_request(req, "1.2.3") == ("head", {"path": "/s"})
    with pytest.raises(wire.RemoteVersionMismatch) as caught:
        wire.check_request(req, "1.2.4")
    assert caught.value.client_version == "1.2.3" and caught.value.cluster_version == "1.2.4"
    assert "install the same version" in str(caught.value)
    with pytest.raises(wire.RemoteVersionMismatch, match="wire"):
        wire.check_request({**req, "schema": "elastic-ray-remote/0"}, "1.2.3")
    with pytest.raises(wire.ProtocolError, match="op"):
        wire.check_request({**req, "op": 5}, "1.2.3")


def test_a_version_mismatch_error_survives_the_trip():
    back = roundtrip(wire.RemoteVersionMismatch("0.1.0", "0.2.0"))
    assert isinstance(back, wire.RemoteVersionMismatch) and back.cluster_version == "0.2.0"


# The names a client rebuilds, as they were before the public errors were
# gathered in elastic_ray.errors: gathering them must not change the wire.
REBUILT_NAMES = {
    "ElasticRayError", "ConfigError", "SchedulerError", "SessionDirError", "CorruptFileError", "TeardownIncomplete",
    "UnsafePathError", "AllocationFailed", "SlurmAllocationEnded", "SlurmStepDrained", "PayloadFailed", "WaitTimeout",
    "RemoteError", "RemoteVersionMismatch", "RemoteSetupError", "ProtocolError",
    "TimeoutError", "ValueError", "TypeError", "KeyError", "FileNotFoundError", "PermissionError", "FileExistsError",
    "NotADirectoryError", "OSError",
}


def test_the_rebuilt_types_are_the_ones_they_were():
    types = wire.error_types()
    assert set(types) == REBUILT_NAMES
    assert all(cls.__name__ == name for name, cls in types.items())


@pytest.mark.parametrize("exc", [
    errors.ControlTimeout("drain to tcp://h:1: no reply within 3 s"),
    errors.FrameRejected("skew", "timestamp off by +41.3 s"),
    errors.ProbeError("drain", "timeout", "killed"),
    errors.NewerProtocolError("protocol_version 9"),
    errors.SessionFileError("s.toml", "head.mem", "lots", "must be a memory size"),
], ids=lambda e: type(e).__name__)
def test_the_errors_a_call_never_rebuilt_still_arrive_as_remote_error(exc):
    back = roundtrip(exc)
    assert type(back) is wire.RemoteError
    assert back.type_name == type(exc).__name__ and str(exc) in str(back)
