"""The usage record both Dagster modes report (pure): built from a history, sent over the wire, checked by field."""

from __future__ import annotations

import json

import pytest

from elastic_ray.history.runs import build
from elastic_ray.history.summary import UsageSummary, read_summary, summarize
from elastic_ray.history.usage import usage
from elastic_ray.remote import wire
from tests.history_events import NOW, scenario, write_session

GOOD = {"node_hours": 1.5, "gpu_hours_held": 6.0, "gpu_hours_idle": 0.25, "head_moves": 2,
        "timeline": "/scratch/s/timeline.html"}


@pytest.mark.parametrize("record", [
    UsageSummary(node_hours=0.0, gpu_hours_held=0.0, gpu_hours_idle=None, head_moves=0),
    UsageSummary(node_hours=1.23456789, gpu_hours_held=9.87654321, gpu_hours_idle=0.5, head_moves=3,
                 timeline="/scratch/sessions/r1/timeline.html"),
    UsageSummary.from_dict(GOOD),
])
def test_the_record_comes_back_the_same_through_json(record):
    assert wire.usage_answer(json.loads(json.dumps(record.to_dict()))) == record


@pytest.mark.parametrize("change, field", [
    ({"node_hours": -1}, "usage.node_hours"),
    ({"node_hours": "1.5"}, "usage.node_hours"),
    ({"node_hours": None}, "usage.node_hours"),
    ({"node_hours": float("nan")}, "usage.node_hours"),
    ({"gpu_hours_held": True}, "usage.gpu_hours_held"),
    ({"gpu_hours_held": float("inf")}, "usage.gpu_hours_held"),
    ({"gpu_hours_idle": -0.1}, "usage.gpu_hours_idle"),
    ({"gpu_hours_idle": [1]}, "usage.gpu_hours_idle"),
    ({"head_moves": 1.5}, "usage.head_moves"),
    ({"head_moves": -1}, "usage.head_moves"),
    ({"head_moves": False}, "usage.head_moves"),
    ({"timeline": "timeline.html"}, "usage.timeline"),
    ({"timeline": 7}, "usage.timeline"),
])
def test_a_bad_field_is_named(change, field):
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        UsageSummary.from_dict({**GOOD, **change})
    with pytest.raises(wire.ProtocolError, match=f"answer to usage: {field}".replace(".", r"\.")):
        wire.usage_answer({**GOOD, **change})


@pytest.mark.parametrize("missing", ["node_hours", "gpu_hours_held", "head_moves"])
def test_a_missing_figure_is_named(missing):
    with pytest.raises(ValueError, match=f"usage.{missing}: missing"):
        UsageSummary.from_dict({k: v for k, v in GOOD.items() if k != missing})


@pytest.mark.parametrize("value", [None, [], "figures", 3])
def test_an_answer_that_is_no_object_is_refused(value):
    with pytest.raises(wire.ProtocolError, match="must be an object of figures"):
        wire.usage_answer(value)


def test_the_optional_figures_may_be_left_out():
    record = UsageSummary.from_dict({"node_hours": 1, "gpu_hours_held": 0, "head_moves": 0})
    assert record.gpu_hours_idle is None and record.timeline is None and isinstance(record.node_hours, float)


def test_summarize_counts_the_head_moves_and_keeps_the_run_s_figures():
    history = build(scenario(), NOW)
    figures = usage(history)
    record = summarize(history, figures)
    assert record.head_moves == 1        # the story's one election moved the head from 100 to 101
    assert (record.node_hours, record.gpu_hours_held, record.gpu_hours_idle) == (
        figures.node_hours, figures.gpu_hours_held, figures.gpu_hours_idle)
    assert record.timeline is None


def test_read_summary_draws_the_page_next_to_the_log(tmp_path):
    pytest.importorskip("matplotlib")
    session = write_session(tmp_path, scenario())
    record = read_summary(session)
    assert record.head_moves == 1 and record.node_hours > 0
    assert record.timeline == str(session / "timeline.html") and "<svg" in (session / "timeline.html").read_text()
