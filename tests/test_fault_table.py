"""The fault matrix's pure parts: its figures from a payload trace, and the table block in docs/status.md."""

from __future__ import annotations

from types import SimpleNamespace

from integration.faults.harness import longest_stall, work_again
from integration.faults.table import BEGIN, END, render_table, replace_block


def _trace(tmp_path, lines):
    path = tmp_path / "trace.txt"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_a_stall_after_a_quick_first_commit_is_still_seen(tmp_path):
    # Units 4-7 were dispatched just after the fault (t=100); then nothing starts for 20 s.
    trace = _trace(tmp_path, [
        "start 0 99.0 a", "start 1 99.0 b", "commit 0 99.5", "commit 1 99.5",
        "start 4 100.1 a", "commit 4 100.6", "start 5 120.6 a", "commit 5 121.1", "garbage line",
    ])
    assert round(work_again(trace, 100.0), 1) == 0.6
    assert round(longest_stall(trace, 100.0), 1) == 20.5


def test_no_start_after_the_fault_gives_no_figures(tmp_path):
    trace = _trace(tmp_path, ["start 0 99.0 a", "commit 0 99.5"])
    assert work_again(trace, 100.0) is None and longest_stall(trace, 100.0) is None
    assert longest_stall(tmp_path / "missing.txt", 100.0) is None


def test_the_table_replaces_only_its_own_block():
    result = SimpleNamespace(name="x", title="t", work_again=1.0, stall=2.0, rejoined=None, rejoin_note="no drop",
                             redone=0, lost=0, duplicates=0, finished=True, jobs_left=[], procs_left=[],
                             status_excerpt="head 1 live", agent_excerpt="", ok=True, failures=[])
    table = render_table([result], command="python -m integration.faults", minutes=1.0)
    assert "| x | t | 1.0 s | 2.0 s | no drop | 0 | 0 | ✓ |" in table
    doc = "# Status\n\nkept\n"
    once = replace_block(doc, table)
    assert once.startswith(doc.rstrip("\n")) and BEGIN in once and END in once
    twice = replace_block(once, table.replace("1.0 s", "3.0 s"))
    assert twice.count(BEGIN) == 1 and "3.0 s" in twice and "kept" in twice


def test_the_status_line_shows_what_session_status_shows_not_the_agents_last_word():
    from integration.faults.harness import status_line

    status = {"head": {"job_id": "21", "heartbeat": "live"}, "jobs": [
        {"role": "worker", "job_id": "23", "state": "FAILED", "reason": "NonZeroExitCode",
         "nodes": [{"node": "gpub-1", "agent_state": "JOINED", "node_state": "ENDED"}]},
        {"role": "worker", "job_id": "24", "state": "RUNNING", "reason": "None",
         "nodes": [{"node": "gpub-1", "agent_state": "STARTING", "node_state": "STARTING"}]},
    ]}
    line = status_line(status)
    assert "worker 23 FAILED (NonZeroExitCode) [gpub-1:ENDED (agent said JOINED)]" in line
    assert "worker 24 RUNNING [gpub-1:STARTING]" in line
