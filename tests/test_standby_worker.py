"""``agent.head.standby_worker.wanted``: when the worker joined to this node's
standby head is kept and when it is dropped, by table (pure)."""

from __future__ import annotations

import pytest

from elastic_ray.agent.head.hosted import Goal, HostSettings, Hosting
from elastic_ray.agent.head.standby_worker import Verdict, wanted
from elastic_ray.protocol.disk.records import HostedHeadState as S

SETTINGS = HostSettings("7", "worker", 0, True, "random")


def hosting(state: S | None, goal: Goal = Goal.STANDBY) -> Hosting:
    return Hosting(SETTINGS, state=state, goal=goal)


ROWS = [
    # name, record, joined_own_head, leaving, ray_ended, verdict, why (part)
    ("standby-kept", hosting(S.STANDBY), False, False, False, Verdict.KEEP, ""),
    ("standby-being-promoted-kept", hosting(S.STANDBY, Goal.HEAD), False, False, False, Verdict.KEEP, ""),
    ("promoted-before-the-worker-followed-kept", hosting(S.READY, Goal.HEAD), False, False, False, Verdict.KEEP, ""),
    ("promoted-worker-joined-without-it-dropped", hosting(S.READY, Goal.HEAD), True, False, False, Verdict.DROP,
     "joined the head without it"),
    ("standby-being-dropped", hosting(S.STANDBY, Goal.NONE), False, False, False, Verdict.DROP, "being dropped"),
    ("standby-failed", hosting(S.FAILED), False, False, False, Verdict.DROP, "no standby"),
    ("no-standby", hosting(None), False, False, False, Verdict.DROP, "no standby"),
    ("a-new-start-under-way", hosting(S.STARTING), False, False, False, Verdict.DROP, "no standby"),
    ("leaving-drops-even-a-standby", hosting(S.STANDBY), False, True, False, Verdict.DROP, "leaving"),
    ("its-ray-ended", hosting(S.STANDBY), False, False, True, Verdict.DROP, "its Ray ended"),
    ("its-ray-ended-after-promotion", hosting(S.READY, Goal.HEAD), False, False, True, Verdict.DROP, "Ray ended"),
]


@pytest.mark.parametrize("name,record,joined,leaving,ended,verdict,why", ROWS, ids=[r[0] for r in ROWS])
def test_wanted(name, record, joined, leaving, ended, verdict, why):
    got, reason = wanted(record, joined_own_head=joined, leaving=leaving, ray_ended=ended)
    assert got is verdict
    assert why in reason
    assert (reason == "") == (verdict is Verdict.KEEP)
