"""`session status` does not show a shared scheduler answer its own files contradict.

Seen on the lab right after `elastic-ray session create --wait`: the last
shared answer (4.8 s old, allowed up to 10 s) said the head job was PENDING,
so status showed `PENDING` and the live head agent as `GONE (job PENDING
(requeued))` next to a live heartbeat. The rule is pure; every case here.
"""

from __future__ import annotations

import itertools

import pytest

from elastic_ray.cli.status_model import answer_outdated
from elastic_ray.scheduler.base import JobInfo, JobState

from helpers import node_state

ASKED = 1_800_000_100.0


def _jobs(state: JobState) -> dict[str, JobInfo]:
    return {"5": JobInfo("5", "er-test", state)}


@pytest.mark.parametrize("state, written, other_job, expected", [
    (state, written, other, state is JobState.PENDING and written > ASKED and not other)
    for state, written, other in itertools.product(
        [JobState.PENDING, JobState.RUNNING, JobState.COMPLETED, JobState.CANCELLED],
        [ASKED - 5, ASKED, ASKED + 0.5, ASKED + 30],
        [False, True])
])
def test_only_a_queued_job_with_a_node_file_written_after_the_answer_outdates_it(state, written, other_job,
                                                                                  expected):
    nodes = {("6" if other_job else "5"): {"cpu-1": node_state("6" if other_job else "5", updated_at=written)}}
    assert answer_outdated(_jobs(state), nodes, ASKED) is expected


def test_no_nodes_or_no_jobs_never_outdate_an_answer():
    assert answer_outdated(_jobs(JobState.PENDING), {}, ASKED) is False
    assert answer_outdated({}, {"5": {"cpu-1": node_state("5", updated_at=ASKED + 1)}}, ASKED) is False


def test_one_fresh_node_among_stale_ones_is_enough():
    nodes = {"5": {"cpu-1": node_state("5", updated_at=ASKED - 1),
                   "cpu-2": node_state("5", node="cpu-2", updated_at=ASKED + 2)}}
    assert answer_outdated(_jobs(JobState.PENDING), nodes, ASKED) is True
