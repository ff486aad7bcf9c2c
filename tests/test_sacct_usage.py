"""sacct's usage figures: the parser (a table of sacct -P lines, some captured from the lab's
real sacct), the record's arithmetic, and what `session usage --sacct` says per job."""

from __future__ import annotations

import pytest

from elastic_ray.scheduler.slurm_parse import JobAccounting, parse_cpu_time, parse_usage_output, tres_count


@pytest.mark.parametrize("text, seconds", [
    ("00:00:01.500", 1.5), ("12:34", 754.0), ("01:02:03", 3723.0), ("2-03:00:00", 183600.0),
    ("", None), ("later", None), ("1:2:3:4", None), ("x-01:00", None),
])
def test_sacct_cpu_times(text, seconds):
    assert parse_cpu_time(text) == seconds


@pytest.mark.parametrize("tres, name, count", [
    ("billing=8,cpu=8,gres/gpu=2,mem=16G,node=1", "gres/gpu", 2),
    ("cpu=8,gres/gpu:a40=4,gres/gpu=4,node=2", "gres/gpu", 4),     # the typed entry does not count twice
    ("cpu=8,mem=16G,node=2", "gres/gpu", 0),
    ("cpu=8,mem=16G,node=2", "node", 2),
    ("", "gres/gpu", 0),
])
def test_tres_counts(tres, name, count):
    assert tres_count(tres, name) == count


def test_usage_lines_become_figures_and_odd_lines_are_left_out():
    out = "\n".join([
        "81231|7200|1|billing=2,cpu=2,mem=4G,node=1|01:30:00|14400|COMPLETED",
        "81232|3600|2|billing=16,cpu=16,gres/gpu=8,mem=64G,node=2|10:00:00|57600|CANCELLED by 1000",
        "81233|60|1|cpu=1,node=1||60|RUNNING",
        "81234|soon|1|cpu=1|00:01|60|FAILED",          # unreadable elapsed: left out
        "99999|60|1|cpu=1|00:01|60|COMPLETED",         # not asked about
        "81235|1|1",                                   # short line
    ])
    found = parse_usage_output(out, ["81231", "81232", "81233", "81234", "81235"])
    assert sorted(found) == ["81231", "81232", "81233"]
    head, gpus, live = found["81231"], found["81232"], found["81233"]
    assert (head.node_hours, head.gpu_hours, head.cpu_efficiency) == (2.0, 0.0, 0.375)   # 1.5 h of 4 h of CPU
    assert (gpus.state, gpus.node_hours, gpus.gpu_hours, gpus.cpu_efficiency) == ("CANCELLED", 2.0, 8.0, 0.625)
    assert live.cpu_seconds_used is None and live.cpu_efficiency is None
    assert gpus.to_dict() == {"job": "81232", "state": "CANCELLED", "final": True, "elapsed_seconds": 3600.0,
                              "nodes": 2, "cpus": 16, "gpus": 8, "node_hours": 2.0, "gpu_hours": 8.0,
                              "cpu_seconds": 36000.0, "cpu_efficiency": 0.625}


# Captured from the lab's sacct (Slurm 22.05.8, `sacct -n -P --format=<USAGE_FIELDS> --jobs=...`,
# no -X) for a batch job on gpu-a (-c 2 --gpus-per-node=2) that ran python in the batch step and in
# one srun step, and a `sleep` job cancelled while it ran. The job's own line sums its steps.
LAB_ENDED = """\
1|3|1|billing=2,cpu=2,gres/gpu=2,mem=512M,node=1|00:00.954|6|COMPLETED
1.batch|3|1|cpu=2,gres/gpu=2,mem=512M,node=1|00:00.585|6|COMPLETED
1.0|1|1|cpu=2,gres/gpu=2,mem=512M,node=1|00:00.368|2|COMPLETED
2|8|1|billing=1,cpu=1,mem=256M,node=1|00:00.003|8|CANCELLED by 0
2.batch|9|1|cpu=1,mem=256M,node=1|00:00.003|9|CANCELLED
"""


@pytest.mark.parametrize("stdout, job, expected", [
    # Over: the job's line, not its steps'; CPUs and GPUs as submitted; CPU time of all its steps.
    (LAB_ENDED, "1", dict(state="COMPLETED", final=True, elapsed_seconds=3.0, nodes=1, cpus=2, gpus=2,
                          cpu_seconds=0.954)),
    (LAB_ENDED, "2", dict(state="CANCELLED", final=True, elapsed_seconds=8.0, nodes=1, cpus=1, gpus=0,
                          cpu_seconds=0.003)),
    # The same job with -X: sacct prints TotalCPU 00:00:00 for every job (why we ask with the steps).
    ("1|3|1|billing=2,cpu=2,gres/gpu=2,mem=512M,node=1|00:00:00|6|COMPLETED\n", "1",
     dict(final=True, cpu_seconds=0.0)),
    # Cancelled while it pended (the lab's history test): NNodes is what it asked for, it held nothing.
    ("12|0|1||00:00:00|0|CANCELLED by 0\n", "12",
     dict(state="CANCELLED", final=True, elapsed_seconds=0.0, nodes=0, cpus=0, gpus=0, cpu_seconds=0.0)),
    # Running: elapsed up to now; TotalCPU holds only the steps that ended (1.0), not the job's figure.
    ("1|1|1|billing=2,cpu=2,gres/gpu=2,mem=512M,node=1|00:00.368|2|RUNNING\n"
     "1.batch|1|1|cpu=2,gres/gpu=2,mem=512M,node=1|00:00:00|2|RUNNING\n"
     "1.0|1|1|cpu=2,gres/gpu=2,mem=512M,node=1|00:00.368|2|COMPLETED\n", "1",
     dict(state="RUNNING", final=False, elapsed_seconds=1.0, nodes=1, cpus=2, cpu_seconds=None,
          cpu_efficiency=None)),
    # Seconds after the start slurmdbd still has the job as PENDING, with nothing allocated, while
    # its batch step already runs: not final, and nothing in it to take for a figure.
    ("1|0|0||00:00:00|0|PENDING\n1.batch|0|1|cpu=2,gres/gpu=2,mem=512M,node=1|00:00:00|0|RUNNING\n", "1",
     dict(state="PENDING", final=False, nodes=0, cpus=0, gpus=0, cpu_seconds=None)),
])
def test_lab_sacct_lines(stdout, job, expected):
    row = parse_usage_output(stdout, [job])[job].to_dict()
    assert {key: row[key] for key in expected} == expected


def test_a_job_sacct_has_not_heard_of_gives_no_line_and_no_record():
    # The lab's sacct for a job slurmdbd has no record of (yet): nothing on stdout, exit 0.
    assert parse_usage_output("", ["99"]) == {}


def test_no_cpu_time_allocated_is_no_efficiency():
    assert JobAccounting("1", "PENDING", 0.0, 0, 0, None, 0.0).cpu_efficiency is None


def test_usage_with_sacct_on_a_scheduler_without_accounting_says_so(tmp_path):
    import json
    import time
    import uuid

    from click.testing import CliRunner

    from elastic_ray.cli.main import main
    from elastic_ray.config.launcher import RayLauncher
    from elastic_ray.protocol.disk.records import SessionInfo
    from elastic_ray.protocol.disk.session_dir import SessionDir

    info = SessionInfo(session_id=uuid.uuid4().hex, job_name="er-sacct", created_at=time.time(),
                       scheduler={"kind": "local", "state_dir": str(tmp_path / "local-scheduler")},
                       head={"partition": "cpu", "time_limit": "10"}, launcher=RayLauncher().to_dict())
    path = SessionDir.create(tmp_path / "s", info).path
    result = CliRunner().invoke(main, ["session", "usage", "--sacct", "--json", str(path)])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["sacct"] == {"accounting": False, "jobs": {}}
    text = CliRunner().invoke(main, ["session", "usage", "--sacct", str(path)])
    assert text.exit_code == 0 and "keeps no job accounting" in text.stderr


# ---------------------------------------------------------------- what `session usage --sacct` says per job

def _usage(*rows):
    from elastic_ray.history.usage import AllocationUsage, RunUsage

    allocations = tuple(AllocationUsage(job=job, role="worker", partition="cpu", nodes=1, nodes_requested=1,
                                        gpus_per_node=0, node_hours=0.1, gpu_hours_held=0.0, gpu_hours_idle=None,
                                        ended_how=None if live else "removed", live=live, partial=False)
                        for job, live in rows)
    return RunUsage(allocations=allocations, node_hours=0.1 * len(rows), gpu_hours_held=0.0, gpu_hours_idle=None,
                    partial=False)


def _found(stdout, jobs):
    return {job: record.to_dict() for job, record in parse_usage_output(stdout, jobs).items()}


@pytest.mark.parametrize("answer, rows, expected, says", [
    # No accounting at all: one clear message, no per-job figures.
    (None, [("5", False)], {"accounting": False, "jobs": {}}, ["keeps no job accounting"]),
    # An ended job sacct has no line for yet, next to one it has: named, never given a figure.
    ("6|30|1|cpu=1,node=1|00:00:02|30|COMPLETED\n", [("6", False), ("7", False)],
     {"accounting": True, "missing": ["7"], "not_final": []}, ["no record of job 7"]),
    # The event log saw the job end, sacct still says RUNNING: not final, said so; a live one is fine.
    ("8|12|1|cpu=1,node=1|00:00:01|12|RUNNING\n9|40|1|cpu=1,node=1||40|RUNNING\n", [("8", False), ("9", True)],
     {"accounting": True, "missing": [], "not_final": ["8"]}, ["job 8 has ended but its record still says RUNNING"]),
])
def test_usage_sacct_names_each_job_it_has_no_final_figures_of(monkeypatch, capsys, answer, rows, expected, says):
    from elastic_ray.cli import history

    jobs = [job for job, _ in rows]
    monkeypatch.setattr(history, "slurm_accounting", lambda path, asked: None if answer is None else _found(answer, asked))
    section = history.sacct_section(None, _usage(*rows))
    assert {key: section[key] for key in expected} == expected
    assert sorted(section["jobs"]) == sorted(job for job in jobs if job not in section.get("missing", jobs))
    history.print_sacct(section)
    err = " ".join(capsys.readouterr().err.split())
    for text in says:
        assert text in err, err
    if answer is not None:
        for job in section["jobs"].values():
            assert job["final"] or job["cpu_seconds"] is None


def test_a_failed_sacct_is_reported_and_the_event_log_figures_stand(monkeypatch, capsys):
    from elastic_ray.cli import history
    from elastic_ray.errors import SchedulerError

    def fails(path, jobs):
        raise SchedulerError("sacct failed (exit 1): sacct: error: Problem talking to the database: Connection refused")

    monkeypatch.setattr(history, "slurm_accounting", fails)
    section = history.sacct_section(None, _usage(("5", False)))
    assert section["accounting"] and section["jobs"] == {} and "Connection refused" in section["error"]
    history.print_sacct(section)
    assert "could not read Slurm's accounting" in capsys.readouterr().err


# ---------------------------------------------------------------- the scheduler's sacct call

@pytest.mark.parametrize("answer, expected", [
    # The lab with ELASTIC_RAY_LAB_ACCOUNTING=0 (accounting_storage/none), captured: stderr, exit 1.
    (("", "Slurm accounting storage is disabled\n", 1), None),
    # The lab with accounting: the job's line and its steps' (LAB_ENDED above), exit 0.
    ((LAB_ENDED, "", 0), {"1": 0.954, "2": 0.003}),
    # Jobs slurmdbd has no record of (yet): nothing at all, exit 0.
    (("", "", 0), {}),
])
def test_accounting_asks_sacct_once_with_the_steps_and_knows_when_there_is_none(answer, expected):
    from tests.test_slurm_parsing import ScriptedSlurm

    slurm = ScriptedSlurm({"sacct": lambda argv: answer})
    found = slurm.accounting(["1", "2"])
    assert (None if found is None else {job: row.cpu_seconds_used for job, row in found.items()}) == expected
    argv = slurm.argvs[0]
    assert argv[0] == "sacct" and "-X" not in argv and "--jobs=1,2" in argv   # the job's line sums its steps
    if expected is None:                  # remembered: no second sacct for a cluster without accounting
        assert slurm.accounting(["3"]) is None and slurm.calls["sacct"] == 1
