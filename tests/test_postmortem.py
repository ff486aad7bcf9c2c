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
