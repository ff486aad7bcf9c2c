"""A payload driver's environment (``coordinator.drivers.driver_environ``), by table: which layer wins."""

from __future__ import annotations

import pytest

from elastic_ray.config.launcher import RayLauncher
from elastic_ray.coordinator.drivers import driver_environ

KEEP = RayLauncher(network_keepalive_ms=2000).keepalive_env()
AUTH = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": "/s/ray_token"}
FIXED = {"RAY_ADDRESS": "10.0.0.1:6379", "RAY_USAGE_STATS_ENABLED": "0"}


@pytest.mark.parametrize("inherited, caller, key, wanted", [
    ({}, {}, "RAY_grpc_client_keepalive_time_ms", "2000"),                       # the run's setting
    ({"RAY_grpc_client_keepalive_time_ms": "9000"}, {}, "RAY_grpc_client_keepalive_time_ms", "9000"),   # user's shell
    ({}, {"RAY_grpc_keepalive_time_ms": "7000"}, "RAY_grpc_keepalive_time_ms", "7000"),                 # run(env=)
    ({"RAY_AUTH_MODE": "disabled"}, {}, "RAY_AUTH_MODE", "token"),               # the run's auth wins
    ({"RAY_AUTH_TOKEN": "stale"}, {}, "RAY_AUTH_TOKEN", None),                   # a stale token is dropped
    ({}, {"RAY_ADDRESS": "elsewhere:1"}, "RAY_ADDRESS", "10.0.0.1:6379"),        # the head's address wins
    ({"PATH": "/bin"}, {"OMP_NUM_THREADS": "1"}, "OMP_NUM_THREADS", "1"),
    ({"PATH": "/bin"}, {}, "PATH", "/bin"),
])
def test_which_layer_wins(inherited, caller, key, wanted):
    env = driver_environ(inherited, caller, keepalive=KEEP, auth=AUTH, fixed=FIXED)
    assert env.get(key) == wanted


def test_no_keepalive_when_the_run_turned_it_off():
    env = driver_environ({}, {}, keepalive=RayLauncher(network_keepalive_ms=None).keepalive_env(), auth=AUTH,
                         fixed=FIXED)
    assert not any("keepalive" in key for key in env)
