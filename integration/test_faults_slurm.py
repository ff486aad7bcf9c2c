"""The fault matrix on the real lab: every scenario, one of each family on
every change.

Each scenario runs the committing payload through the seed's failover loop,
injects its fault mid-run and checks the invariants (see
``integration/faults/harness.py``): the payload finishes, every unit is
committed exactly once, teardown leaves no Slurm job and no process of the
session on any node, and the session's status showed the fault. The
scenarios marked ``ci`` (one per family) run in the per-change tier; the
others are ``slow`` (full tier: ``scripts/test --full``), as is the whole
matrix with its table (``python -m integration.faults``, docs/operations.md).
"""

from __future__ import annotations

import pytest

from integration.faults.harness import run_scenario
from integration.faults.scenarios import SCENARIOS

pytestmark = [pytest.mark.slurm, pytest.mark.ray, pytest.mark.timeout(900)]

FAST = [s for s in SCENARIOS if s.ci]
PARAMS = [pytest.param(s, id=s.name, marks=() if s.ci else (pytest.mark.slow,)) for s in SCENARIOS]


@pytest.mark.parametrize("scenario", PARAMS)
def test_fault_scenario_keeps_the_work(slurm_lab, scenario):
    result = run_scenario(scenario, slurm_lab.shared_dir("faults"))
    events = "\n".join(result.events)
    assert result.ok, f"{scenario.name}: " + "; ".join(result.failures) + f"\nevents:\n{events}"
    print(f"\n{scenario.name}: work again {result.work_again}, rejoined {result.rejoined or result.rejoin_note}, "
          f"redone {result.redone}, status: {result.status_excerpt}")


def test_every_family_has_a_fast_scenario():
    """One scenario of each family runs on every change; the combined family's
    parts (a network cut, the head cancelled) each do, so it is full tier only."""
    families = {s.family for s in SCENARIOS} - {"combined"}
    assert {s.family for s in FAST} == families, "the per-change subset must cover one fault of each family"
    assert len(FAST) == len(families), "one per family: the rest is the full tier's"
    assert len({s.name for s in SCENARIOS}) == len(SCENARIOS)
