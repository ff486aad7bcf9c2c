"""The fault matrix on the real lab: every scenario, one of each family on
every change.

Each scenario runs the committing payload through the seed's failover loop,
injects its fault mid-run and checks the invariants (see
``integration/faults/harness.py``): the payload finishes, every unit is
committed exactly once, teardown leaves no Slurm job and no process of the
session on any node, and the session's status showed the fault. The
scenarios marked ``ci`` run in the per-change tier: one per family whose
fault no other per-change test injects (COVERED_ELSEWHERE names those); the
others are ``slow`` (full tier: ``scripts/test --full``). The whole matrix
with its table: ``python -m integration.faults`` (docs/operations.md).
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


#: Families whose fault another per-change test injects on the lab, so
#: their scenarios are full tier only (docs/conventions.md, "Test tiers"):
#: family -> (module, test) that does it on every change.
COVERED_ELSEWHERE = {
    # a worker's raylet killed on the lab: restarts with growing delays, gives up
    "process": ("integration.test_agent_slurm", "test_raylet_kills_restart_with_growing_delays_then_the_node_gives_up"),
    # the head job cancelled mid-run, the seed's loop: elector-killed starts so;
    # the Dagster and SSH front ends run it on the lab as well
    "head": ("integration.test_dagster_slurm", "test_head_cancelled_mid_asset_seed_loop"),
    # a damaged allocation.json restored from its copies (local; the same code on any scheduler)
    "session-dir": ("tests.test_allocation_recovery", None),
    # its parts each run: a worker's network cut (node) and the head cancelled
    "combined": ("integration.test_faults_slurm", None),
}


def test_every_family_has_a_fast_scenario_or_a_test_elsewhere():
    """Every fault family is injected on every change: by its ``ci`` scenario
    (one per family at most), or by the per-change test named in
    COVERED_ELSEWHERE, which must exist and not be ``slow``."""
    import importlib

    families = {s.family for s in SCENARIOS}
    fast = [s.family for s in FAST]
    assert len(fast) == len(set(fast)), "one scenario per family on every change: the rest is the full tier's"
    assert set(fast) | set(COVERED_ELSEWHERE) == families, (sorted(families - set(fast) - set(COVERED_ELSEWHERE)))
    for family, (module, name) in COVERED_ELSEWHERE.items():
        mod = importlib.import_module(module)
        if name is not None:
            test = getattr(mod, name)
            assert not any(m.name == "slow" for m in getattr(test, "pytestmark", [])), (family, name)
    assert len({s.name for s in SCENARIOS}) == len(SCENARIOS)
