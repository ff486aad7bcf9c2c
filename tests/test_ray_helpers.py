"""elastic_ray.ray.wait_for_stable_ray_resources: arguments and the stability rule.

The rule is checked here with a scripted sequence of snapshots; the real
thing (a payload waiting for a worker allocation to join) runs in
tests/test_dagster_assets.py.
"""

import subprocess
import sys

import pytest

from elastic_ray.ray import wait_for_stable_ray_resources as wait


def script(*snapshots):
    seq = list(snapshots)
    calls = []

    def provider():
        calls.append(1)
        return seq[min(len(calls), len(seq)) - 1]
    provider.calls = calls
    return provider


@pytest.mark.parametrize("kwargs, name", [
    ({"minimum_resources": {}}, "minimum_resources"),
    ({"minimum_resources": [("GPU", 1)]}, "minimum_resources"),
    ({"minimum_resources": {"GPU": 0}}, "minimum_resources['GPU']"),
    ({"minimum_resources": {"GPU": float("nan")}}, "minimum_resources['GPU']"),
    ({"minimum_resources": {"": 1}}, "minimum_resources['']"),
    ({"minimum_resources": {"GPU": 1}, "stable_polls": 0}, "stable_polls"),
    ({"minimum_resources": {"GPU": 1}, "poll_interval_seconds": -1}, "poll_interval_seconds"),
    ({"minimum_resources": {"GPU": 1}, "timeout_seconds": 0}, "timeout_seconds"),
    ({"minimum_resources": {"GPU": 1}, "resource_provider": 3}, "resource_provider"),
])
def test_bad_arguments_name_the_argument(kwargs, name):
    with pytest.raises(ValueError) as err:
        wait(**kwargs)
    assert str(err.value).startswith(name)


def test_returns_after_consecutive_qualifying_polls_only():
    provider = script({"CPU": 4}, {"CPU": 1}, {"CPU": 4}, {"CPU": 4, "GPU": 1}, {"CPU": 0})
    seen = wait({"CPU": 4}, stable_polls=2, poll_interval_seconds=0.01, resource_provider=provider)
    assert seen == {"CPU": 4.0, "GPU": 1.0} and len(provider.calls) == 4


def test_timeout_says_what_was_seen_last():
    with pytest.raises(TimeoutError) as err:
        wait({"GPU": 4}, poll_interval_seconds=0.01, timeout_seconds=0.05, resource_provider=script({"GPU": 2}))
    assert "GPU" in str(err.value) and "2.0" in str(err.value)


def test_importing_it_does_not_import_ray():
    code = "import sys, elastic_ray.ray; assert 'ray' not in sys.modules and not any(m.startswith('ray.') for m in sys.modules)"
    subprocess.run([sys.executable, "-c", code], check=True)
