"""bench/agent_change.py reads the capacity bench's run lines and tabulates them (pure parts)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

import agent_change  # noqa: E402

OUT = """=== head-cancel: OK (43s)
run 1 off                driver ended=1.69  elected=3.69  host ready=3.58  host worker=7.33  other worker=9.56  task runs=7.70  work again=8.20
run 1 supervised         driver ended=1.11  elected=-  host ready=0.95  host worker=3.12  other worker=5.69  task runs=3.97  work again=4.54
"""


def test_the_run_lines_give_every_phase_of_each_mode_and_skip_missing_ones():
    runs = agent_change.parse_runs(OUT)
    assert set(runs) == {"off", "supervised"}
    assert runs["off"]["task runs"] == 7.70 and runs["off"]["host worker"] == 7.33
    assert "elected" not in runs["supervised"] and runs["supervised"]["work again"] == 4.54


def test_the_table_has_a_median_and_range_per_build():
    runs = agent_change.parse_runs(OUT)
    text = agent_change.table({"base": [runs["off"], {**runs["off"], "task runs": 9.0}], "this": [runs["off"]]}, "off")
    row = next(line for line in text.splitlines() if line.startswith("| task runs"))
    assert row == "| task runs | 8.35 (7.70-9.00) | 7.70 (7.70-7.70) |"
