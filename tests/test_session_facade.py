"""Session, RemoteSession and the Dagster RunSession offer the same calls.

A payload loop written against one runs against the others: each of
``RunControl``'s methods exists on all three with the same parameter names
in the same order and the same defaults. An object may add parameters of its
own after them, with defaults, so a call written for the facade still works.
"""

from __future__ import annotations

import inspect

import pytest

from elastic_ray.coordinator.facade import RunControl
from elastic_ray.coordinator.session import Session
from elastic_ray.dagster.run_session import RunSession
from elastic_ray.remote.client import RemoteSession

METHODS = [name for name, value in vars(RunControl).items() if inspect.isfunction(value) and not name.startswith("_")]


def mismatches(facade: inspect.Signature, got: inspect.Signature) -> list[str]:
    """Where ``got`` breaks the facade's calls (pure: two signatures in, reasons out)."""
    want = [p for p in facade.parameters.values() if p.name != "self"]
    have = [p for p in got.parameters.values() if p.name != "self"]
    found = []
    for i, w in enumerate(want):
        if i >= len(have) or have[i].name != w.name:
            found.append(f"parameter {i + 1} should be {w.name!r}")
            continue
        h = have[i]
        if w.default is not inspect.Parameter.empty and h.default != w.default:
            found.append(f"{w.name} defaults to {h.default!r}, the facade says {w.default!r}")
        if w.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD and h.kind is not w.kind:
            found.append(f"{w.name} must be positional or keyword")
    for extra in have[len(want):]:
        if extra.default is inspect.Parameter.empty and extra.kind not in (inspect.Parameter.VAR_POSITIONAL,
                                                                           inspect.Parameter.VAR_KEYWORD):
            found.append(f"extra parameter {extra.name!r} has no default")
    return found


def test_the_facade_names_the_calls_a_payload_loop_uses():
    assert set(METHODS) >= {"add_worker_allocation", "wait_for_worker_allocation", "remove_worker_allocation",
                            "replace_head", "ready_head", "head_is_lost", "autoscale", "teardown", "close"}


@pytest.mark.parametrize("cls", [Session, RemoteSession, RunSession], ids=lambda c: c.__name__)
@pytest.mark.parametrize("method", METHODS)
def test_each_driver_offers_the_facade_call(cls, method):
    assert callable(getattr(cls, method, None)), f"{cls.__name__} has no {method}"
    broken = mismatches(inspect.signature(getattr(RunControl, method)), inspect.signature(getattr(cls, method)))
    assert not broken, f"{cls.__name__}.{method}: " + "; ".join(broken)


def _sig(text: str) -> inspect.Signature:
    namespace: dict = {}
    exec(f"def f{text}: pass", namespace)
    return inspect.signature(namespace["f"])


@pytest.mark.parametrize("got, reason", [
    ("(self, handle, timeout=600.0, progress=None)", "timeout defaults to 600.0"),
    ("(self, handle, progress=None, timeout=3600.0)", "parameter 2 should be 'timeout'"),
    ("(self, handle, timeout=3600.0)", "parameter 3 should be 'progress'"),
    ("(self, handle, timeout=3600.0, progress=None, *, must)", "extra parameter 'must' has no default"),
    ("(self, handle, *, timeout=3600.0, progress=None)", "timeout must be positional or keyword"),
])
def test_the_check_catches_each_kind_of_drift(got, reason):
    facade = _sig("(self, handle, timeout=3600.0, progress=None)")
    assert any(reason in m for m in mismatches(facade, _sig(got))), mismatches(facade, _sig(got))


def test_the_check_accepts_an_extra_keyword_with_a_default():
    facade = _sig("(self, handle, timeout=3600.0, progress=None)")
    assert mismatches(facade, _sig("(self, handle, timeout=3600.0, progress=None, *, poll=0.5)")) == []
