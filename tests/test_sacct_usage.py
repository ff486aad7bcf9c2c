"""sacct's usage figures: the parser (a table of sacct -P lines) and the record's arithmetic."""

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
    assert gpus.to_dict() == {"job": "81232", "state": "CANCELLED", "elapsed_seconds": 3600.0, "nodes": 2,
                              "gpus": 8, "node_hours": 2.0, "gpu_hours": 8.0, "cpu_efficiency": 0.625}


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
