"""scripts/durations: the slowest tests from junit reports, and the full tier's section in docs/status.md."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_loader = importlib.machinery.SourceFileLoader("durations", str(ROOT / "scripts" / "durations"))
_spec = importlib.util.spec_from_loader("durations", _loader)
durations = importlib.util.module_from_spec(_spec)
sys.modules["durations"] = durations   # its dataclasses look their module up
_loader.exec_module(durations)

REPORT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" errors="0" failures="1" skipped="1" tests="3" time="12.5">
<testcase classname="tests.test_polling" name="test_a" time="0.5"/>
<testcase classname="tests.test_polling" name="test_b" time="9.0"><failure message="x">x</failure></testcase>
<testcase classname="tests.test_polling" name="test_c" time="0.1"><skipped message="y">y</skipped></testcase>
</testsuite></testsuites>
"""


def test_the_table_lists_the_slowest_first_with_outcomes_and_the_steps_totals(tmp_path):
    report = tmp_path / "junit-local.xml"
    report.write_text(REPORT)
    step = durations.read_step(report)
    assert step.name == "local" and step.wall == 12.5
    assert (step.count("passed"), step.count("failed"), step.count("skipped")) == (1, 1, 1)
    text = durations.table([step], top=2)
    rows = [line for line in text.splitlines() if line.startswith("| 9.0") or line.startswith("| 0.5")]
    assert rows[0] == "| 9.0 | local | `tests/test_polling.py::test_b` (failed) |"
    assert "| local | 12 | 10 | 1 | 1 | 0 | 1 |" in text


def test_the_full_tier_section_is_added_once_then_replaced(tmp_path):
    report = tmp_path / "junit-lab.xml"
    report.write_text(REPORT)
    page = tmp_path / "status.md"
    page.write_text("# Status\n\ntext\n")
    steps = [durations.read_step(report)]
    durations.write_status(page, durations.status_section(steps, 0, 16, ["scripts/matrix --lowest: exit 0"]))
    durations.write_status(page, durations.status_section(steps, 1, 17, []))
    text = page.read_text()
    assert text.count(durations.BEGIN) == 1 and text.count(durations.END) == 1
    assert "**FAILED (exit 1)**, 17 min wall" in text and "**green**" not in text
    assert text.startswith("# Status\n\ntext\n")
