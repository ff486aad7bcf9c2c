"""The post-mortem a failed test leaves in CI's output (tests/postmortem.py)."""

from __future__ import annotations

from tests import postmortem


def test_story_tells_the_last_lines_of_each_session_log_oldest_first(tmp_path):
    logs = tmp_path / "session0" / "logs"
    logs.mkdir(parents=True)
    (tmp_path / "session0" / "local-scheduler").mkdir()
    (tmp_path / "session0" / "local-scheduler" / "scheduler.log").write_text("sched\n")
    (logs / "agent-1-cpu-1.log").write_text("".join(f"line {i}\n" for i in range(100)))
    (tmp_path / "session0" / "events.jsonl").write_text('{"kind":"submitted"}\n')
    (logs / "ray-1-cpu-1-head.log").write_text("not an agent log\n")
    text = postmortem.story(tmp_path)
    assert "session0/logs/agent-1-cpu-1.log" in text and "session0/events.jsonl" in text
    assert "line 99" in text and "line 75" in text and "line 74" not in text   # the last 25 lines
    assert "sched" in text and "not an agent log" not in text


def test_story_is_bounded_and_empty_without_logs(tmp_path, monkeypatch):
    # Another test's session may have left a thread in this process; its stack is not the point here.
    monkeypatch.setattr(postmortem, "_our_thread_stacks", lambda: "")
    assert postmortem.story(tmp_path) == ""
    monkeypatch.setattr(postmortem, "MAX_CHARS", 500)
    logs = tmp_path / "s" / "logs"
    logs.mkdir(parents=True)
    for n in range(5):
        (logs / f"agent-{n}-cpu-1.log").write_text("x" * 200 + "\n")
    text = postmortem.story(tmp_path)
    assert len(text) <= 500 + len("[...]\n") and text.startswith("[...]")


def test_story_shows_where_our_threads_are(tmp_path):
    import threading

    stop = threading.Event()
    thread = threading.Thread(target=stop.wait, name="elastic-ray-test-waiter", daemon=True)
    thread.start()
    try:
        text = postmortem.story(tmp_path)
    finally:
        stop.set()
        thread.join(5)
    assert "--- thread elastic-ray-test-waiter" in text and "wait" in text


def test_a_lab_test_s_story_takes_the_recent_session_logs_under_the_lab_s_shared_dir(tmp_path, monkeypatch):
    import os
    monkeypatch.setattr(postmortem, "_our_thread_stacks", lambda: "")
    lab = tmp_path / "shared"
    now = 1_800_000_000.0
    fresh = lab / "agent-slurm" / "ab12" / "session" / "logs"
    old = lab / "dagster" / "cd34" / "session" / "logs"
    for d in (fresh, old):
        d.mkdir(parents=True)
    (fresh / "agent-17-gpua-1.log").write_text("event=ray_start_failed\n")
    (fresh / "worker-17.out").write_text("srun: error: gpua-1\n")
    (old / "agent-3-cpu-1.log").write_text("an earlier test's agent\n")
    for path in (fresh / "agent-17-gpua-1.log", fresh / "worker-17.out"):
        os.utime(path, (now - 10, now - 10))
    os.utime(old / "agent-3-cpu-1.log", (now - 5000, now - 5000))
    text = postmortem.story(None, lab, now=now)
    assert "agent-slurm/ab12/session/logs/agent-17-gpua-1.log" in text and "ray_start_failed" in text
    assert "worker-17.out" in text and "srun: error" in text
    assert "an earlier test's agent" not in text
    assert postmortem.story(None, tmp_path / "no-lab", now=now) == ""
