"""The job's OOM kills (agent.node.oom): parsing by table, the counter on a cgroup-shaped tree."""

from __future__ import annotations

from pathlib import Path

import pytest

from elastic_ray.agent.node.oom import JobCgroup, OomCounter, job_cgroup, job_path, memory_mounts, oom_kills
from elastic_ray.cli.status_model import node_shown_state
from elastic_ray.cli.status_view import oom_text
from elastic_ray.scheduler.base import JobInfo, JobState

V1_MOUNTS = """\
25 20 0:22 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755
30 25 0:27 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
31 25 0:28 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct
"""
V2_MOUNTS = "29 20 0:26 / /sys/fs/cgroup rw,nosuid shared:4 - cgroup2 cgroup2 rw,nsdelegate\n"
HYBRID = V1_MOUNTS + "32 25 0:29 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n"


@pytest.mark.parametrize("text, expected", [
    (V1_MOUNTS, {1: "/sys/fs/cgroup/memory"}),
    (V2_MOUNTS, {2: "/sys/fs/cgroup"}),
    (HYBRID, {1: "/sys/fs/cgroup/memory", 2: "/sys/fs/cgroup/unified"}),
    ("", {}),
    ("garbage without the separator\n", {}),
    ("31 25 0:28 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n", {}),
])
def test_the_memory_controller_is_found_by_version(text, expected):
    assert memory_mounts(text) == expected


@pytest.mark.parametrize("path, expected", [
    ("/slurm_n1/uid_0/job_12/step_batch", "/slurm_n1/uid_0/job_12"),
    ("/slurm/uid_1000/job_7", "/slurm/uid_1000/job_7"),
    ("/system.slice/slurmstepd.scope/job_31/step_0/user/task_0", "/system.slice/slurmstepd.scope/job_31"),
    ("/", None),
    ("/process_api/b75d8b77", None),
    ("/slurm/uid_0/job_/step_0", None),
    ("/slurm/uid_0/myjob_12", None),
])
def test_the_job_part_of_a_cgroup_path(path, expected):
    assert job_path(path) == expected


@pytest.mark.parametrize("cgroup, mounts, expected", [
    ("4:memory:/slurm_n1/uid_0/job_12/step_batch\n0::/\n", V1_MOUNTS,
     JobCgroup(1, Path("/sys/fs/cgroup/memory/slurm_n1/uid_0/job_12"))),
    ("0::/system.slice/slurmstepd.scope/job_31/step_0/user/task_0\n", V2_MOUNTS,
     JobCgroup(2, Path("/sys/fs/cgroup/system.slice/slurmstepd.scope/job_31"))),
    # a hybrid host enforces memory in v1
    ("4:memory:/slurm/uid_0/job_5/step_0\n0::/slurm/job_5\n", HYBRID,
     JobCgroup(1, Path("/sys/fs/cgroup/memory/slurm/uid_0/job_5"))),
    # memory controller shared with others on one line
    ("4:cpu,memory:/slurm/uid_0/job_5/step_0\n", V1_MOUNTS,
     JobCgroup(1, Path("/sys/fs/cgroup/memory/slurm/uid_0/job_5"))),
    # not in a job (no enforcement, or a cgroup namespace)
    ("4:memory:/process_api/abc\n0::/\n", V1_MOUNTS, None),
    ("0::/\n", V2_MOUNTS, None),
    # a job path but no mount to read it under
    ("4:memory:/slurm/uid_0/job_5/step_0\n", V2_MOUNTS, None),
])
def test_the_job_cgroup_of_this_process(cgroup, mounts, expected):
    assert job_cgroup(cgroup, mounts) == expected


@pytest.mark.parametrize("text, expected", [
    ("oom_kill_disable 0\nunder_oom 0\noom_kill 3\n", 3),
    ("low 0\nhigh 0\nmax 12\noom 2\noom_kill 2\noom_group_kill 0\n", 2),
    ("oom_kill_disable 0\nunder_oom 0\n", None),     # v1 before 4.13 does not count
    ("", None),
])
def test_the_kill_count_of_a_counter_file(text, expected):
    assert oom_kills(text) == expected


def _tree(tmp_path, version: int, counts: dict[str, int]):
    """A directory shaped like a memory hierarchy, and a proc dir naming it."""
    mount = tmp_path / "cg"
    name = "memory.oom_control" if version == 1 else "memory.events"
    for rel, n in counts.items():
        d = mount / rel
        d.mkdir(parents=True, exist_ok=True)
        (d / name).write_text(f"oom_kill_disable 0\nunder_oom 0\noom_kill {n}\n" if version == 1 else
                              f"low 0\nhigh 0\nmax 0\noom {n}\noom_kill {n}\n")
    proc = tmp_path / "proc"
    proc.mkdir()
    fstype = "cgroup cgroup rw,memory" if version == 1 else "cgroup2 cgroup2 rw"
    (proc / "mountinfo").write_text(f"30 25 0:27 / {mount} rw - {fstype}\n")
    line = "4:memory:" if version == 1 else "0::"
    (proc / "cgroup").write_text(f"{line}/slurm_n1/uid_0/job_12/step_batch\n")
    return mount, proc


def test_v1_counts_the_kills_of_the_job_and_every_step_below_it_and_logs_each_rise(tmp_path):
    mount, proc = _tree(tmp_path, 1, {"slurm_n1/uid_0/job_12": 1, "slurm_n1/uid_0/job_12/step_batch": 0,
                                      "slurm_n1/uid_0/job_12/step_0": 2, "slurm_n1/uid_0/job_99": 5,
                                      "slurm_n1/uid_0": 7})
    heard = []
    counter = OomCounter(lambda kills, new: heard.append(("oom_killed", kills, new)), proc_root=str(proc))
    assert counter.count() == 3                      # job_12 and its steps; not job_99, not the uid level
    assert counter.count() == 3
    assert heard == [("oom_killed", 3, 3)]
    (mount / "slurm_n1/uid_0/job_12/step_0/memory.oom_control").write_text("oom_kill_disable 0\noom_kill 4\n")
    assert counter.count() == 5
    assert heard[-1] == ("oom_killed", 5, 2)


def test_v2_reads_the_job_s_own_summed_counter(tmp_path):
    _mount, proc = _tree(tmp_path, 2, {"slurm_n1/uid_0/job_12": 2, "slurm_n1/uid_0/job_12/step_batch": 2})
    assert OomCounter(proc_root=str(proc)).count() == 2


def test_no_job_cgroup_means_unknown_and_nothing_is_read(tmp_path):
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "mountinfo").write_text(V1_MOUNTS)
    (proc / "cgroup").write_text("4:memory:/process_api/abc\n")
    counter = OomCounter(proc_root=str(proc))
    assert counter.job is None and counter.count() is None
    assert OomCounter(proc_root=str(tmp_path / "missing")).count() is None


def test_a_job_that_ended_out_of_memory_says_why():
    job = JobInfo(job_id="12", name="w", state=JobState.OUT_OF_MEMORY)
    assert node_shown_state("JOINED", job) == ("ENDED", "job OUT_OF_MEMORY")
    assert oom_text([{"oom_kills": None}], "OUT_OF_MEMORY") == "went over its memory grant (OOM killer)"
    assert oom_text([{"oom_kills": 1}], "OUT_OF_MEMORY").startswith("OOM killer ended 1 process ")
    assert oom_text([{"oom_kills": None}], "FAILED") == ""


@pytest.mark.parametrize("counts, expected", [
    ([None, None], ""),
    ([0, None], ""),
    ([1, 0], "OOM killer ended 1 process of this job (over its memory grant)"),
    ([2, 1], "OOM killer ended 3 processes of this job (over its memory grant)"),
])
def test_the_status_note_sums_the_nodes_counts(counts, expected):
    assert oom_text([{"oom_kills": c} for c in counts]) == expected
