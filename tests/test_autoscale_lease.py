"""The autoscaler's lease (coordinator/scaling/lease.py), by table: pure rules over allocation.json."""

from __future__ import annotations

import pytest

from elastic_ray.coordinator.scaling import lease
from elastic_ray.coordinator.scaling.runner import rest_for
from elastic_ray.protocol.disk.records import AllocationRecord, ElectionClaim

A, B = "host-a:10:aaaa", "host-b:20:bbbb"
NOW = 1000.0


def held(by: str, since: float = 900.0, expires: float = NOW + 20) -> AllocationRecord:
    return AllocationRecord(generation=3, autoscaler=ElectionClaim(by, since, expires))


@pytest.mark.parametrize("record, holder, dead, expected_holder, expected_since", [
    (AllocationRecord(), A, None, A, NOW),                            # free: taken
    (held(A), A, None, A, 900.0),                                     # ours: renewed, since kept
    (held(B), A, None, B, 900.0),                                     # another's, live: refused
    (held(B, expires=NOW - 1), A, None, A, NOW),                      # another's, expired: taken
    (held(B, expires=NOW), A, None, A, NOW),                          # expiring this instant counts as expired
    (held(B), A, lambda who: who == B, A, NOW),                       # another's, its process gone: taken
    (held(B), A, lambda who: False, B, 900.0),                        # another's, its process alive: refused
])
def test_take(record, holder, dead, expected_holder, expected_since):
    after = lease.take(record, holder, NOW, period=45.0, holder_dead=dead)
    assert after.autoscaler.claimant == expected_holder and after.autoscaler.since == expected_since
    if expected_holder == holder:
        assert after.autoscaler.expires == NOW + 45.0 and lease.holds(after, holder, NOW)
    else:
        assert after is record, "a refusal returns the same record: update_allocation writes nothing"


@pytest.mark.parametrize("record, holder, expected", [
    (AllocationRecord(), A, True),                    # not held: take it
    (held(A, expires=NOW + 40), A, False),            # ours, plenty left: no write
    (held(A, expires=NOW + 30), A, True),             # ours, RENEW_WHEN_LEFT left: renew
    (held(B), A, True),                               # another's: try (take refuses while it lives)
    (held(A, expires=NOW - 1), A, True),              # ours but lapsed
])
def test_due(record, holder, expected):
    assert lease.due(record, holder, NOW) is expected


@pytest.mark.parametrize("record, holder, expected", [
    (AllocationRecord(), A, None),                       # none held: nothing to renew
    (held(A, expires=NOW + 40), A, NOW + 40 - lease.RENEW_WHEN_LEFT),
    (held(B, expires=NOW + 40), A, None),                # another's
])
def test_renew_at(record, holder, expected):
    assert lease.renew_at(record, holder) == expected


def test_release_leaves_another_s_lease_alone():
    assert lease.release(held(A), A).autoscaler is None
    other = held(B)
    assert lease.release(other, A) is other


@pytest.mark.parametrize("bad", [dict(holder=""), dict(period=0), dict(period=float("nan"))])
def test_take_refuses_a_bad_holder_or_period(bad):
    args = {"holder": A, "period": 45.0} | bad
    with pytest.raises(ValueError):
        lease.take(AllocationRecord(), args["holder"], NOW, period=args["period"])


def test_the_lease_survives_the_record_s_round_trip_and_is_absent_when_unset():
    record = held(A)
    assert AllocationRecord.from_dict(record.to_dict()).autoscaler == record.autoscaler
    assert "autoscaler" not in AllocationRecord().to_dict(), "a session that never scaled writes what it wrote before"
    with pytest.raises(ValueError, match="autoscaler"):
        AllocationRecord.from_dict({**AllocationRecord().to_dict(), "autoscaler": {"claimant": A, "since": 2.0,
                                                                                  "expires": 1.0}})


def test_a_holder_name_is_what_claimant_process_reads():
    from elastic_ray.coordinator.head.election import claimant_process
    assert claimant_process(lease.holder_name("cpu-1", 4242, "ab12cd34")) == ("cpu-1", 4242)


def test_a_takeover_on_another_host_happens_within_a_minute():
    # The holder renews when RENEW_WHEN_LEFT is left; dead right after a renewal, its lease lapses
    # LEASE_PERIOD later, and the next turn of another process (every few seconds) takes it.
    assert lease.LEASE_PERIOD + 10 <= 60 and lease.RENEW_WHEN_LEFT < lease.LEASE_PERIOD


# ------------------------------------------------------------ the loop's rest between turns (runner.rest_for)

@pytest.mark.parametrize("wake_at, renew_at, failed, expected", [
    (None, None, False, 5.0),                    # nothing due: the interval
    (NOW + 2, None, False, 2.05),                # a delay runs out in 2 s: just after it
    (NOW + 60, None, False, 5.0),                # later than the interval: the interval
    (NOW - 1, None, False, 0.05),                # already past: at once
    (None, NOW + 3, False, 3.05),                # the lease is due in 3 s
    (NOW + 4, NOW + 3, False, 3.05),             # the earlier of the two
    (None, NOW - 10, True, 5.0),                 # a renewal that failed: not again in a loop
    (NOW + 2, NOW - 10, True, 2.05),             # ...while a decision's delay still counts
])
def test_rest_between_turns(wake_at, renew_at, failed, expected):
    assert rest_for(5.0, NOW, wake_at, renew_at, failed) == pytest.approx(expected)
