"""A run's history on the real Slurm lab: the event log its processes wrote, the usage it adds up to,
and its timeline drawn and opened in a real headless browser.

One run does what users do over a night: a head, a worker allocation added,
a second one added and removed, one that pends (Slurm says why) and is
cancelled, and the head lost and moved onto the first worker. Everything
is then read back as a user would: ``session events``, ``session usage``
(with ``--sacct``: the lab's real Slurm accounting, slurmdbd, against what
the test timed) and ``session timeline`` as real commands, the page opened
in chromium.
What it wrote is kept under ``.ci/artifacts/history-lab/`` (the events,
the usage, the page and its screenshot).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from elastic_ray import Session, SlurmRunAllocationConfig, SlurmWorkerAllocationConfig
from elastic_ray.agent.node.ray_load import read_gpu_load
from elastic_ray.config.launcher import RayLauncher
from elastic_ray.protocol.disk import event_log
from elastic_ray.protocol.disk.events import EventKind as K
from elastic_ray.protocol.disk.events import EventSource
from elastic_ray.protocol.disk.records import AgentState
from integration.slurm_helpers import end_session
from tests.browser import near, png_colours, run_chromium
from tests.helpers import wait_until

pytestmark = [pytest.mark.slurm, pytest.mark.ray, pytest.mark.timeout(600)]

REPO = Path(__file__).resolve().parents[1]
ARTIFACTS = REPO / ".ci" / "artifacts" / "history-lab"
HEAD = SlurmRunAllocationConfig(partition="cpu", time_limit="30", mem="1G", cpus_per_task=1)
CLI = Path(sys.executable).with_name("elastic-ray")
JOINED_BLUE = (0x3A, 0x86, 0xC8)


def _cli(*args: str) -> subprocess.CompletedProcess:
    out = subprocess.run([str(CLI), "session", *args], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, (args, out.stdout[-2000:], out.stderr[-2000:])
    return out


def _sacct_settled(path: Path, jobs: list[str]) -> dict | None:
    """`usage --sacct --json`'s sacct part once sacct has a record of every job and a final one of
    every ended job (slurmdbd hears of an end from slurmctld a little later); None until then."""
    section = json.loads(_cli("usage", "--sacct", "--json", str(path)).stdout)["sacct"]
    assert section["accounting"] is True and "error" not in section, section
    for row in section["jobs"].values():    # never a figure that is not one: no CPU time before the end
        assert row["final"] or row["cpu_seconds"] is None, row
    settled = not section["not_final"] and not (set(section["missing"]) & set(jobs))
    return section if settled else None


def _lab_accounting() -> bool:
    out = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True, timeout=30)
    return "accounting_storage/slurmdbd" in out.stdout


def _check_sacct(path: Path, first_head: str, a, b, big, *, t_create: float, t_head_ready: float,
                 t_cancel_head: float, t_add_b: float, t_joined_b: float, t_remove_b: float, t_b_ended: float) -> str:
    """`usage --sacct` against the story: sacct's real figures of each job (the lab's slurmdbd), or,
    on a lab started with ELASTIC_RAY_LAB_ACCOUNTING=0, the plain "no accounting" answer. Returns the table."""
    if not _lab_accounting():
        assert json.loads(_cli("usage", "--sacct", "--json", str(path)).stdout)["sacct"] == {"accounting": False, "jobs": {}}
        text = _cli("usage", "--sacct", str(path))
        assert "keeps no job accounting" in text.stderr
        return text.stdout
    ended = [first_head, b.job_id, big.job_id]
    sacct = wait_until(lambda: _sacct_settled(path, ended), timeout=60, interval=1.0,
                       message="sacct never had a final record of every ended job")
    jobs = sacct["jobs"]
    assert sorted(jobs) == sorted([first_head, a.job_id, b.job_id, big.job_id]) and sacct["missing"] == []
    head_row, a_row, b_row, big_row = (jobs[j] for j in (first_head, a.job_id, b.job_id, big.job_id))
    # State as the story ended each job: scancel -> CANCELLED, drained and removed -> COMPLETED.
    assert (head_row["state"], b_row["state"], big_row["state"]) == ("CANCELLED", "COMPLETED", "CANCELLED")
    assert a_row["state"] == "RUNNING" and not a_row["final"] and a_row["cpu_seconds"] is None   # live: no final figure
    # Elapsed (whole seconds in sacct) within what the test timed around each job's start and end.
    assert t_cancel_head - t_head_ready - 2 <= head_row["elapsed_seconds"] <= t_cancel_head - t_create + 2, head_row
    assert t_remove_b - t_joined_b - 2 <= b_row["elapsed_seconds"] <= t_b_ended - t_add_b + 2, b_row
    assert (big_row["elapsed_seconds"], big_row["nodes"], big_row["gpus"]) == (0, 0, 0)   # cancelled pending: held nothing
    # Nodes, CPUs and GPUs as submitted (HEAD: 1 CPU; a: 2 CPUs + 2 GPUs; b: 1 CPU + 1 GPU; one node each).
    assert (head_row["nodes"], head_row["cpus"], head_row["gpus"]) == (1, 1, 0)
    assert (a_row["nodes"], a_row["cpus"], a_row["gpus"]) == (1, 2, 2)
    assert (b_row["nodes"], b_row["cpus"], b_row["gpus"]) == (1, 1, 1)
    # The ended jobs that ran an agent and Ray used CPU, and sacct measured it.
    assert head_row["cpu_seconds"] > 0 and b_row["cpu_seconds"] > 0, (head_row, b_row)
    assert 0 < b_row["cpu_efficiency"] and b_row["gpu_hours"] == pytest.approx(b_row["elapsed_seconds"] / 3600, abs=1e-4)
    sacct_table = _cli("usage", "--sacct", str(path)).stdout
    assert "Slurm accounting (sacct)" in sacct_table and "RUNNING (so far)" in sacct_table
    return sacct_table


def _joined(session: Session, job: str, head: str) -> bool:
    return any(s.state is AgentState.JOINED and s.head_job == head for s in session.node_states(job).values())


@pytest.mark.slow
def test_a_night_s_run_told_by_its_events_usage_and_timeline(slurm_lab, monkeypatch, tmp_path):
    """Full tier (the whole night's story again, after the per-change parts).
    On every change: ``test_dagster_slurm::test_head_cancelled_mid_asset_seed_loop``
    reads a lab run's head move and node-hours back from its event log (the
    materialization's usage metadata), ``test_lab::test_accounting_answers_with_a_finished_job_s_figures``
    asks the lab's slurmdbd, and ``tests/test_history_timeline.py`` opens a
    timeline in a real headless browser."""
    monkeypatch.setenv("ELASTIC_AGENT_POLL_INTERVAL", "0.5")
    monkeypatch.setenv("ELASTIC_AGENT_GPU_SAMPLE_INTERVAL", "1")    # forwarded to every node's agent
    base = REPO / ".lab" / "test-work" / "history"
    base.mkdir(parents=True, exist_ok=True)
    t_create = time.time()
    session = Session.create(base / uuid.uuid4().hex[:8], scheduler="slurm", head=HEAD,
                             launcher=RayLauncher(object_store_memory=100_000_000), supervise=False)
    try:
        session.wait_for_head(timeout=120)
        t_head_ready = time.time()
        first_head = session.record().head_job
        a = session.add_worker_allocation(SlurmWorkerAllocationConfig(
            partition="gpu-a", num_nodes=1, gpus_per_node=2, cpus_per_task=2, mem="1G", time_limit="20"))
        t_add_b = time.time()
        b = session.add_worker_allocation(SlurmWorkerAllocationConfig(
            partition="gpu-b", num_nodes=1, gpus_per_node=1, cpus_per_task=1, mem="1G", time_limit="20"))
        if _lab_accounting():   # b just submitted: sacct has no record of it yet, or one that is not final
            early = json.loads(_cli("usage", "--sacct", "--json", str(session.path)).stdout)["sacct"]
            assert b.job_id in early["missing"] or not early["jobs"][b.job_id]["final"], early
            assert all(row["final"] or row["cpu_seconds"] is None for row in early["jobs"].values()), early
        assert list(session.wait_for_worker_allocation(a, timeout=180)) == ["gpua-1"]
        assert list(session.wait_for_worker_allocation(b, timeout=180)) == ["gpub-1"]
        t_joined_b = time.time()
        # All four GPUs of gpu-a while a holds two: it pends, and Slurm says why.
        big = session.add_worker_allocation(SlurmWorkerAllocationConfig(
            partition="gpu-a", num_nodes=1, gpus_per_node=4, cpus_per_task=1, mem="1G", time_limit="20"))
        wait_until(lambda: session.query([big.job_id])[big.job_id].reason not in ("", "None"), timeout=60,
                   message="Slurm gave the big allocation no reason to pend")
        assert session.remove_worker_allocation(big, drain_timeout=30) == "CANCELLED"
        # b holds its GPU a few samples long (one a second), counted from when its Ray's metrics page
        # first exports the GPU: Ray refreshes it every 10 s, so under CI's load that can come late
        # (a fixed 3 s once saw no sample at all: per-change red, 2026-12-02).
        (state_b,) = session.node_states(b.job_id).values()
        port_b = state_b.ports["metrics_export_port"]
        wait_until(lambda: read_gpu_load(port_b, host=state_b.node_ip) is not None, timeout=60,
                   message="b's metrics page to export its GPU")
        time.sleep(3)
        t_remove_b = time.time()
        assert session.remove_worker_allocation(b, drain_timeout=60) == "COMPLETED"
        t_removed_b = time.time()
        # remove_worker_allocation returns once b's agent published its end; Slurm ends the job (sacct's
        # End) a moment later, seconds under CI's load (+2.1 s over the slack once: per-change red).
        wait_until(lambda: session.query([b.job_id])[b.job_id].state.is_final, timeout=60, interval=0.2,
                   message="Slurm did not end b after its removal")
        t_b_ended = time.time()
        # The head is lost; the first worker allocation hosts the next one.
        t_cancel_head = time.time()
        subprocess.run(["scancel", first_head], check=True, timeout=30)
        head = session.replace_head(timeout=240)
        assert head.job_id == a.job_id
        wait_until(lambda: _joined(session, a.job_id, a.job_id), timeout=120,
                   message="the worker did not rejoin the head it hosts")

        # ------------------------------------------------ the events, as `session events --json` prints them
        doc = json.loads(_cli("events", "--json", str(session.path)).stdout)
        assert doc["skipped"] == {}
        reading = event_log.read(session.path)
        assert [e.to_dict() for e in reading.events] == doc["events"]
        events = reading.events
        C, A = EventSource.COORDINATOR, EventSource.AGENT

        def first(kind, job, by=None, node=None):
            found = [i for i, e in enumerate(events) if e.kind is kind and e.job == job
                     and (by is None or e.by is by) and (node is None or e.node == node)]
            assert found, f"no {kind.value} of job {job}: {[(e.kind.value, e.job, e.node) for e in events]}"
            return found[0]

        story_b = [first(K.SUBMITTED, b.job_id, C), first(K.STARTED, b.job_id, A, "gpub-1"),
                   first(K.NODE_JOINED, b.job_id, A, "gpub-1"), first(K.DRAIN_REQUESTED, b.job_id, C),
                   first(K.DRAIN_FINISHED, b.job_id, A, "gpub-1"), first(K.NODE_LEFT, b.job_id, A, "gpub-1"),
                   first(K.REMOVED, b.job_id, C)]
        assert story_b == sorted(story_b)
        assert events[story_b[-1]].details["state"] == "COMPLETED"
        pending = events[first(K.PENDING, big.job_id, C)]
        assert pending.reason not in (None, "", "None", "pending"), pending    # Slurm's own reason, e.g. Resources
        assert events[first(K.FAILED, first_head, C)].details["state"] in ("CANCELLED", "COMPLETING")
        assert events[first(K.REMOVED, big.job_id, C)].details["state"] == "CANCELLED"
        move = [first(K.ELECTION_STARTED, None), first(K.ELECTION_WON, a.job_id), first(K.HEAD_MOVED, a.job_id)]
        assert move == sorted(move) and events[move[0]].details["previous"] == first_head
        assert events[move[2]].details["previous"] == first_head
        rejoined = [i for i, e in enumerate(events) if e.kind is K.NODE_JOINED and e.job == a.job_id
                    and e.details.get("head_job") == a.job_id]
        assert rejoined and rejoined[0] > move[2], "a's node joined the head it hosts after the move"
        assert events[first(K.SUBMITTED, b.job_id)].details["partition"] == "gpu-b"

        # ------------------------------------------------ the usage, against what this test timed
        usage = json.loads(_cli("usage", "--json", str(session.path)).stdout)
        rows = {row["job"]: row for row in usage["allocations"]}
        seconds_b = rows[b.job_id]["node_hours"] * 3600
        # b's node was in the run at least from when the test saw it joined to when it asked for the
        # removal, and at most from its submission to the removal's return.
        assert t_remove_b - t_joined_b - 1 <= seconds_b <= t_removed_b - t_add_b + 1, (seconds_b, rows[b.job_id])
        assert rows[b.job_id]["gpu_hours_held"] == pytest.approx(rows[b.job_id]["node_hours"] * 1, abs=1e-4)
        idle_b = rows[b.job_id]["gpu_hours_idle"]
        assert idle_b is not None and 0 < idle_b <= rows[b.job_id]["gpu_hours_held"]   # no task asked for it
        assert rows[big.job_id]["node_hours"] == 0 and rows[a.job_id]["live"]
        assert rows[first_head]["node_hours"] > 0 and rows[first_head]["role"] == "head"
        assert rows[first_head]["ended_how"] == "failed" and not rows[first_head]["live"]
        assert rows[first_head]["nodes"] == 1 and not rows[first_head]["partial"]   # one stay, its start known
        table = _cli("usage", str(session.path)).stdout

        # ------------------------------------------------ Slurm's own accounting (slurmdbd), against the same story
        sacct_table = _check_sacct(session.path, first_head, a, b, big, t_create=t_create, t_head_ready=t_head_ready,
                                   t_cancel_head=t_cancel_head, t_add_b=t_add_b, t_joined_b=t_joined_b,
                                   t_remove_b=t_remove_b, t_b_ended=t_b_ended)

        # ------------------------------------------------ the timeline, drawn by the command, opened in chromium
        page = tmp_path / "run.html"
        _cli("timeline", str(session.path), "--output", str(page))
        dom = run_chromium(tmp_path / "profile", "--dump-dom", page.as_uri())
        assert dom.returncode == 0, dom.stderr.decode()[-2000:]
        text = dom.stdout.decode()
        allocations = text.split('<table id="allocations">', 1)[1].split("</table>", 1)[0]
        for job in (first_head, a.job_id, b.job_id, big.job_id):
            assert f"<td>{job}</td>" in allocations, job
        assert "head_moved" in text and "<svg" in text
        shot = tmp_path / "timeline.png"
        taken = run_chromium(tmp_path / "profile", f"--screenshot={shot}", "--window-size=1400,1000", page.as_uri())
        assert taken.returncode == 0 and shot.exists(), taken.stderr.decode()[-2000:]
        png = shot.read_bytes()
        colours = png_colours(png)
        assert len(colours) > 100 and near(colours, JOINED_BLUE), "the screenshot shows no joined bars"
    finally:
        if session.path.exists():
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            for name in ("events.jsonl",):
                if (session.path / name).exists():
                    shutil.copyfile(session.path / name, ARTIFACTS / name)
        end_session(session)
    (ARTIFACTS / "usage.txt").write_text(table)
    (ARTIFACTS / "usage-sacct.txt").write_text(sacct_table)
    shutil.copyfile(page, ARTIFACTS / "run.html")
    shutil.copyfile(shot, ARTIFACTS / "timeline.png")
