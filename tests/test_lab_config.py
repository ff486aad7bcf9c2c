"""The Slurm lab's pure part (integration/labctl/config.py), without root and without a lab.

What the lab *is* (the knobs, the node layout, slurm.conf, gres.conf, cgroup.conf, the
/etc/hosts block, a node's boot script, the fingerprint that decides between repairing a
running lab and restarting it) is decided here by table; that the rendered lab then behaves
like a cluster is integration/test_lab.py's job, on the real lab.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from integration import labctl
from integration.labctl import config
from integration.labctl.config import (
    PRIVATE_DIRS,
    REPO,
    LabError,
    LabInfo,
    Node,
    Settings,
    choose_proctrack,
    compute_layout,
    fingerprint,
    gpu_device_paths,
    is_under,
    mariadb_install_argv,
    mariadbd_argv,
    node_boot_script,
    parse_gres,
    private_mounts,
    render_cgroup_conf,
    render_gres_conf,
    render_hosts_block,
    render_slurm_conf,
    render_slurmdbd_conf,
    settings_from_env,
    strip_hosts_block,
    with_hosts_block,
)

LAB = Path("/srv/lab")
PREFIX = {"ELASTIC_RAY_LAB_PYTHON_PREFIX": "/opt/python"}  # so the result does not depend on this venv


def settings(private_tmp: bool = True, lab_dir: Path = LAB, bridge: str = "erlab0") -> Settings:
    return Settings(lab_dir, "10.78.0", bridge, private_tmp)


def conf_lines(text: str, key: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith(f"{key}=")]


# --------------------------------------------------------------------------- settings_from_env


def test_the_defaults_are_the_documented_ones():
    s = settings_from_env(dict(PREFIX))
    assert s.lab_dir == REPO / ".lab"
    assert (s.subnet, s.bridge) == ("10.78.0", "erlab0")
    assert s.private_tmp == (not is_under(REPO, PRIVATE_DIRS))
    assert s.ctl_ip == "10.78.0.1"
    assert s.conf == REPO / ".lab" / "etc" / "slurm.conf"
    assert s.accounting and not settings_from_env({**PREFIX, "ELASTIC_RAY_LAB_ACCOUNTING": "0"}).accounting


def test_the_knobs_are_read_from_the_mapping_given_and_the_dir_normalised():
    env = {**PREFIX, "ELASTIC_RAY_LAB_DIR": "/srv/x/../lab/", "ELASTIC_RAY_LAB_SUBNET": "10.9.8",
           "ELASTIC_RAY_LAB_BRIDGE": "lab_b2", "ELASTIC_RAY_LAB_PRIVATE_TMP": "0"}
    assert settings_from_env(env) == Settings(Path("/srv/lab"), "10.9.8", "lab_b2", False, ())


@pytest.mark.parametrize("knob, value", [
    ("ELASTIC_RAY_LAB_DIR", "relative/lab"),
    ("ELASTIC_RAY_LAB_DIR", "/"),
    ("ELASTIC_RAY_LAB_DIR", "/srv/.."),
    ("ELASTIC_RAY_LAB_SUBNET", "10.78"),
    ("ELASTIC_RAY_LAB_SUBNET", "10.78.256"),
    ("ELASTIC_RAY_LAB_SUBNET", "10.78.0.1"),
    ("ELASTIC_RAY_LAB_SUBNET", "a.b.c"),
    ("ELASTIC_RAY_LAB_BRIDGE", "erlab0123456"),  # 12 characters: its veths would not fit in 15
    ("ELASTIC_RAY_LAB_BRIDGE", "0lab"),
    ("ELASTIC_RAY_LAB_BRIDGE", "er-lab"),
    ("ELASTIC_RAY_LAB_PRIVATE_TMP", "yes"),
    ("ELASTIC_RAY_LAB_ACCOUNTING", "on"),
])
def test_a_bad_knob_is_refused_by_name(knob, value):
    with pytest.raises(LabError, match=knob):
        settings_from_env({**PREFIX, "ELASTIC_RAY_LAB_DIR": "/srv/lab", knob: value})


@pytest.mark.parametrize("prefix", ["/tmp/venv", "/var/tmp/py", "/dev/shm/py"])
def test_private_tmp_goes_off_with_a_note_when_the_jobs_python_would_be_hidden(prefix):
    s = settings_from_env({"ELASTIC_RAY_LAB_DIR": "/srv/lab", "ELASTIC_RAY_LAB_PYTHON_PREFIX": prefix})
    assert not s.private_tmp
    assert len(s.notes) == 1 and "private /tmp turned OFF" in s.notes[0] and prefix in s.notes[0]


def test_a_lab_dir_under_tmp_needs_private_tmp_off():
    env = {**PREFIX, "ELASTIC_RAY_LAB_DIR": "/tmp/lab"}
    if is_under(REPO, PRIVATE_DIRS):  # a checkout under /tmp has turned private tmp off already
        assert not settings_from_env(env).private_tmp
    else:
        with pytest.raises(LabError, match="ELASTIC_RAY_LAB_PRIVATE_TMP=0"):
            settings_from_env(env)
    assert settings_from_env({**env, "ELASTIC_RAY_LAB_PRIVATE_TMP": "0"}).lab_dir == Path("/tmp/lab")


def test_is_under_resolves_links_and_does_not_match_a_prefix_of_a_name(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    assert is_under(tmp_path / "link" / "x", [str(tmp_path / "real")])
    assert is_under(tmp_path / "real", [str(tmp_path / "real") + "/"])
    assert not is_under("/tmpfoo/x", ["/tmp"])
    assert not is_under("/srv/lab", PRIVATE_DIRS)


# --------------------------------------------------------------------------- layout


def test_four_nodes_are_the_layout_the_tests_are_written_for():
    assert compute_layout(4, "10.78.0") == [
        Node("cpu-1", "10.78.0.11", "cpu", None),
        Node("cpu-2", "10.78.0.12", "cpu", None),
        Node("gpua-1", "10.78.0.13", "gpu-a", "gpu:a40:4"),
        Node("gpub-1", "10.78.0.14", "gpu-b", "gpu:h100:2"),
    ]


@pytest.mark.parametrize("n, names", [
    (1, ["cpu-1"]),
    (2, ["cpu-1", "gpua-1"]),
    (5, ["cpu-1", "cpu-2", "gpua-1", "gpua-2", "gpub-1"]),
    (6, ["cpu-1", "cpu-2", "gpua-1", "gpua-2", "gpub-1", "gpub-2"]),
])
def test_nodes_are_dealt_round_robin_then_grouped_with_addresses_in_that_order(n, names):
    layout = compute_layout(n, "10.1.2")
    assert [node.name for node in layout] == names
    assert [node.ip for node in layout] == [f"10.1.2.{10 + k}" for k in range(1, n + 1)]


@pytest.mark.parametrize("n", [0, -1, 201])
def test_a_node_count_out_of_range_is_refused(n):
    with pytest.raises(LabError, match="node count"):
        compute_layout(n, "10.78.0")


def test_interface_names_fit_in_15_characters_with_the_longest_bridge():
    s = settings(bridge="b" * 11)
    assert len(s.veth(200)) == 15
    assert s.netns("gpua-1") == "bbbbbbbbbbb-gpua-1"


# --------------------------------------------------------------------------- slurm.conf


def test_slurm_conf_names_the_controller_the_paths_and_every_node():
    s = settings()
    text = render_slurm_conf(s, compute_layout(4, s.subnet), "linuxproc")
    assert conf_lines(text, "SlurmctldHost") == ["SlurmctldHost=slurmctl(10.78.0.1)"]
    assert conf_lines(text, "ProctrackType") == ["ProctrackType=proctrack/linuxproc"]
    assert conf_lines(text, "AuthInfo") == [f"AuthInfo=socket={LAB}/munge/munge.socket,cred_expire=30"]
    assert conf_lines(text, "StateSaveLocation") == [f"StateSaveLocation={LAB}/state/ctld"]
    assert conf_lines(text, "SlurmdSpoolDir") == [f"SlurmdSpoolDir={LAB}/state/spool/%n"]
    assert conf_lines(text, "NodeName") == [
        "NodeName=cpu-1 NodeAddr=10.78.0.11 NodeHostname=cpu-1 CPUs=4 RealMemory=8192 State=UNKNOWN",
        "NodeName=cpu-2 NodeAddr=10.78.0.12 NodeHostname=cpu-2 CPUs=4 RealMemory=8192 State=UNKNOWN",
        "NodeName=gpua-1 NodeAddr=10.78.0.13 NodeHostname=gpua-1 CPUs=4 RealMemory=8192 Gres=gpu:a40:4 State=UNKNOWN",
        "NodeName=gpub-1 NodeAddr=10.78.0.14 NodeHostname=gpub-1 CPUs=4 RealMemory=8192 Gres=gpu:h100:2 State=UNKNOWN",
    ]
    assert conf_lines(text, "PartitionName") == [
        "PartitionName=cpu Nodes=cpu-1,cpu-2 Default=YES MaxTime=INFINITE State=UP",
        "PartitionName=gpu-a Nodes=gpua-1 Default=NO MaxTime=INFINITE State=UP",
        "PartitionName=gpu-b Nodes=gpub-1 Default=NO MaxTime=INFINITE State=UP",
    ]
    assert text.endswith("\n")


def test_slurm_conf_sets_each_key_once_and_only_partitions_that_have_nodes():
    text = render_slurm_conf(settings(), compute_layout(1, "10.78.0"), "cgroup")
    keys = [line.split("=", 1)[0] for line in text.splitlines() if line and not line.startswith("#")]
    assert len(keys) == len(set(keys))  # one node, one partition: no key twice
    assert conf_lines(text, "PartitionName") == ["PartitionName=cpu Nodes=cpu-1 Default=YES MaxTime=INFINITE State=UP"]
    assert conf_lines(text, "ProctrackType") == ["ProctrackType=proctrack/cgroup"]


def test_slurm_conf_keeps_its_first_line_so_a_running_lab_is_repaired_not_restarted():
    # The text is part of the fingerprint: a change makes the next `up` restart a running lab.
    text = render_slurm_conf(settings(), compute_layout(4, "10.78.0"), "cgroup")
    assert text.splitlines()[0] == "# Generated by integration/labctl.py -- edits are lost on the next `lab up`."


# --------------------------------------------------------------------------- accounting


def test_with_accounting_slurmctld_reports_to_slurmdbd_at_the_controller_with_our_munged():
    text = render_slurm_conf(settings(), compute_layout(4, "10.78.0"), "cgroup")
    assert conf_lines(text, "AccountingStorageType") == ["AccountingStorageType=accounting_storage/slurmdbd"]
    assert conf_lines(text, "AccountingStorageHost") == ["AccountingStorageHost=slurmctl"]
    assert conf_lines(text, "AccountingStoragePort") == ["AccountingStoragePort=6819"]
    # Clients authenticate to slurmdbd through this socket, not through AuthInfo's.
    assert conf_lines(text, "AccountingStoragePass") == [f"AccountingStoragePass={LAB}/munge/munge.socket"]
    assert conf_lines(text, "AccountingStorageTRES") == ["AccountingStorageTRES=gres/gpu"]
    assert conf_lines(text, "JobAcctGatherType") == ["JobAcctGatherType=jobacct_gather/linux"]


def test_without_accounting_the_lab_keeps_none():
    s = Settings(LAB, "10.78.0", "erlab0", True, (), False)
    text = render_slurm_conf(s, compute_layout(4, "10.78.0"), "cgroup")
    assert conf_lines(text, "AccountingStorageType") == ["AccountingStorageType=accounting_storage/none"]
    assert conf_lines(text, "JobAcctGatherType") == ["JobAcctGatherType=jobacct_gather/none"]
    assert not conf_lines(text, "AccountingStorageHost") and not conf_lines(text, "AccountingStoragePass")


def test_slurmdbd_conf_uses_our_munged_root_and_the_database_by_socket_without_a_password():
    text = render_slurmdbd_conf(settings())
    assert conf_lines(text, "AuthInfo") == [f"AuthInfo=socket={LAB}/munge/munge.socket"]
    assert conf_lines(text, "SlurmUser") == ["SlurmUser=root"]
    assert conf_lines(text, "DbdPort") == ["DbdPort=6819"]
    assert conf_lines(text, "PidFile") == [f"PidFile={LAB}/pid/slurmdbd.pid"]
    assert conf_lines(text, "StorageType") == ["StorageType=accounting_storage/mysql"]
    assert conf_lines(text, "StorageHost") == ["StorageHost=localhost"]   # = the socket in $MYSQL_UNIX_PORT
    assert not conf_lines(text, "StoragePass") and not conf_lines(text, "StoragePort")
    assert settings().dbd_conf == LAB / "etc" / "slurmdbd.conf"   # next to slurm.conf: slurmdbd has no -f


def test_mariadb_reads_no_my_cnf_listens_on_no_tcp_port_and_keeps_its_data_in_the_lab():
    s = settings()
    for argv in (mariadb_install_argv(s), mariadbd_argv(s)):
        assert argv[1] == "--no-defaults"          # must come first, or the machine's my.cnf is read
        assert "--skip-networking" in argv and f"--socket={LAB}/state/mariadb/mariadb.sock" in argv
        assert f"--datadir={LAB}/state/mariadb/data" in argv
    assert f"--pid-file={LAB}/pid/mariadbd.pid" in mariadbd_argv(s)
    assert "--auth-root-authentication-method=socket" in mariadb_install_argv(s)


def test_the_fingerprint_changes_when_accounting_is_turned_off():
    layout = compute_layout(4, "10.78.0")
    on, off = settings(), Settings(LAB, "10.78.0", "erlab0", True, (), False)
    files = {"slurm.conf": render_slurm_conf(on, layout, "cgroup"), "slurmdbd.conf": render_slurmdbd_conf(on)}
    assert fingerprint(files, on) != fingerprint({"slurm.conf": render_slurm_conf(off, layout, "cgroup")}, off)


# --------------------------------------------------------------------------- gres.conf, cgroup.conf


def test_parse_gres_splits_name_type_and_count():
    assert parse_gres("gpu:a40:4") == ("gpu", "a40", 4)
    with pytest.raises(ValueError):
        parse_gres("gpu:4")


def test_gres_conf_lists_the_fake_devices_of_the_gpu_nodes_only():
    s = settings()
    layout = compute_layout(5, s.subnet)
    assert render_gres_conf(s, layout).splitlines() == [
        "AutoDetect=off",
        f"NodeName=gpua-1 Name=gpu Type=a40 File={LAB}/dev/gpua-1/nvidia[0-3]",
        f"NodeName=gpua-2 Name=gpu Type=a40 File={LAB}/dev/gpua-2/nvidia[0-3]",
        f"NodeName=gpub-1 Name=gpu Type=h100 File={LAB}/dev/gpub-1/nvidia[0-1]",
    ]
    by_name = {n.name: n for n in layout}
    assert gpu_device_paths(s, by_name["cpu-1"]) == []
    assert gpu_device_paths(s, by_name["gpub-1"]) == [LAB / "dev" / "gpub-1" / "nvidia0",
                                                       LAB / "dev" / "gpub-1" / "nvidia1"]


def test_cgroup_conf_tracks_and_constrains_nothing():
    lines = render_cgroup_conf().splitlines()
    assert "CgroupPlugin=cgroup/v1" in lines and "CgroupAutomount=no" in lines
    assert {"ConstrainCores=no", "ConstrainRAMSpace=no", "ConstrainDevices=no"} <= set(lines)
    assert not [line for line in lines if line.startswith("Constrain") and not line.endswith("=no")]


# --------------------------------------------------------------------------- proctrack


V1 = """\
sysfs /sys sysfs rw,nosuid,nodev,noexec,relatime 0 0
tmpfs /sys/fs/cgroup tmpfs ro,nosuid,nodev,noexec,mode=755 0 0
cgroup /sys/fs/cgroup/cpu,cpuacct cgroup rw,nosuid,nodev,noexec,relatime,cpu,cpuacct 0 0
cgroup /sys/fs/cgroup/freezer cgroup rw,nosuid,nodev,noexec,relatime,freezer 0 0
"""
V2 = """\
sysfs /sys sysfs rw,nosuid,nodev,noexec,relatime 0 0
cgroup2 /sys/fs/cgroup cgroup2 rw,nosuid,nodev,noexec,relatime,nsdelegate,memory_recursiveprot 0 0
"""
V1_WITHOUT_FREEZER = "cgroup /sys/fs/cgroup/memory cgroup rw,nosuid,nodev,noexec,relatime,memory 0 0\n"
FREEZER_AS_A_NAME_ONLY = "tmpfs /sys/fs/freezer tmpfs rw,freezer 0 0\nbroken line\n\n"


@pytest.mark.parametrize("mounts, expected", [
    (V1, "cgroup"),
    (V2, "linuxproc"),
    (V1_WITHOUT_FREEZER, "linuxproc"),
    (FREEZER_AS_A_NAME_ONLY, "linuxproc"),
    ("", "linuxproc"),
])
def test_proctrack_cgroup_only_with_a_cgroup_v1_freezer(mounts, expected):
    assert choose_proctrack(mounts) == expected


# --------------------------------------------------------------------------- /etc/hosts block


HOSTS = "127.0.0.1 localhost\n::1 localhost ip6-localhost\n"


def test_the_hosts_block_names_the_controller_and_every_node_between_markers():
    s = settings()
    block = render_hosts_block(s.hosts_tag, s.ctl_ip, compute_layout(2, s.subnet))
    assert block.splitlines() == [
        f"# >>> elastic-ray-lab {LAB} >>>",
        "10.78.0.1 slurmctl",
        "10.78.0.11 cpu-1",
        "10.78.0.12 gpua-1",
        f"# <<< elastic-ray-lab {LAB} <<<",
    ]


@pytest.mark.parametrize("base", [HOSTS, HOSTS.rstrip("\n"), ""])
def test_the_hosts_block_is_inserted_once_and_stripped_back_to_the_original(base):
    s = settings()
    block = render_hosts_block(s.hosts_tag, s.ctl_ip, compute_layout(4, s.subnet))
    once = with_hosts_block(base, s.hosts_tag, block)
    assert once.endswith(block) and once.startswith(base)
    assert with_hosts_block(once, s.hosts_tag, block) == once  # `up` twice: still one block
    assert strip_hosts_block(once, s.hosts_tag) == (base + "\n" if base and not base.endswith("\n") else base)


def test_a_new_layout_replaces_the_block_and_another_labs_block_stays():
    mine, other = settings(), settings(lab_dir=Path("/srv/other"))
    theirs = render_hosts_block(other.hosts_tag, other.ctl_ip, compute_layout(1, other.subnet))
    text = with_hosts_block(HOSTS + theirs, mine.hosts_tag,
                            render_hosts_block(mine.hosts_tag, mine.ctl_ip, compute_layout(4, mine.subnet)))
    bigger = render_hosts_block(mine.hosts_tag, mine.ctl_ip, compute_layout(6, mine.subnet))
    text = with_hosts_block(text, mine.hosts_tag, bigger)
    assert text == HOSTS + theirs + bigger
    assert strip_hosts_block(text, mine.hosts_tag) == HOSTS + theirs


# --------------------------------------------------------------------------- a node's boot


def test_a_node_boots_with_its_hostname_its_private_dirs_then_slurmd():
    s = settings(lab_dir=Path("/srv/my lab"))
    node = compute_layout(4, s.subnet)[1]
    assert node_boot_script(s, node).splitlines() == [
        "set -e",
        "echo cpu-2 > /proc/sys/kernel/hostname",
        "mount --bind '/srv/my lab/nodes/cpu-2/tmp' /tmp",
        "mount --bind '/srv/my lab/nodes/cpu-2/var_tmp' /var/tmp",
        "mount --bind '/srv/my lab/nodes/cpu-2/shm' /dev/shm",
        "exec slurmd -f '/srv/my lab/etc/slurm.conf'",
    ]
    assert [dst for _, dst in private_mounts(s, "cpu-2")] == list(PRIVATE_DIRS)


def test_without_private_tmp_a_node_mounts_nothing():
    s = settings(private_tmp=False)
    script = node_boot_script(s, compute_layout(1, s.subnet)[0])
    assert "mount" not in script and script.endswith(f"exec slurmd -f {LAB}/etc/slurm.conf")


def test_the_export_line_quotes_the_conf_path():
    info = LabInfo(LAB, Path("/srv/my lab/etc/slurm.conf"), [], True, LAB / "shared")
    assert info.export_line == "export SLURM_CONF='/srv/my lab/etc/slurm.conf'"


# --------------------------------------------------------------------------- fingerprint


def rendered(s: Settings, n: int = 4) -> dict[str, str]:
    layout = compute_layout(n, s.subnet)
    return {"slurm.conf": render_slurm_conf(s, layout, "cgroup"), "gres.conf": render_gres_conf(s, layout),
            "cgroup.conf": render_cgroup_conf()}


def test_the_fingerprint_is_stable_for_the_same_config_in_any_order():
    s = settings()
    files = rendered(s)
    assert fingerprint(files, s) == fingerprint(dict(reversed(list(files.items()))), s)
    assert fingerprint(rendered(settings()), settings()) == fingerprint(files, s)
    assert len(fingerprint(files, s)) == 16


def test_the_fingerprint_changes_with_any_file_the_layout_private_tmp_or_the_bridge():
    s = settings()
    files = rendered(s)
    base = fingerprint(files, s)
    changed = [
        fingerprint({**files, "cgroup.conf": files["cgroup.conf"] + "ConstrainSwapSpace=no\n"}, s),
        fingerprint({**files, "extra.conf": ""}, s),
        fingerprint(rendered(s, 5), s),
        fingerprint(files, settings(private_tmp=False)),
        fingerprint(files, settings(bridge="erlab1")),
    ]
    assert base not in changed and len(set(changed)) == len(changed)


# --------------------------------------------------------------------------- the package


EFFECTS = {"subprocess", "shutil", "signal", "glob", "socket", "threading", "stat", "json", "time"}


def test_config_is_pure_it_imports_no_effect_and_no_other_lab_module():
    tree = ast.parse(Path(config.__file__).read_text())
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            imported.add("." if node.level else (node.module or "").split(".")[0])
    assert not imported & EFFECTS and "." not in imported, sorted(imported)


def test_the_package_keeps_every_name_its_importers_use():
    """`labctl.X` anywhere in integration/ or bench/ (fixtures, the fault matrix, benches)."""
    used = set()
    for path in [*REPO.joinpath("integration").rglob("*.py"), REPO / "integration" / "lab",
                 *REPO.joinpath("bench").rglob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "labctl":
                used.add(node.attr)
    assert {"up", "down", "is_up", "nodes", "DEFAULT_NODES", "slurmd_pid", "pid_alive"} <= used
    assert not sorted(name for name in used if not hasattr(labctl, name))


def test_the_package_step_forbids_service_starts_and_leaves_a_policy_it_did_not_write(tmp_path):
    from integration.labctl import packages

    policy = tmp_path / "policy-rc.d"
    assert packages._no_services(policy) and policy.read_text().rstrip().endswith("exit 101")
    assert policy.stat().st_mode & 0o777 == 0o755
    policy.write_text("#!/bin/sh\nexit 0\n")           # one the machine had: used as it is
    assert not packages._no_services(policy) and policy.read_text() == "#!/bin/sh\nexit 0\n"
    assert {"slurmdbd", "mariadb-server"} <= set(packages.ACCOUNTING_PACKAGES)


# --------------------------------------------------------------------------- Slurm 24.11 (issue 25)

ROOT24 = Path("/srv/trixie")


def s24(private_tmp: bool = True) -> Settings:
    from dataclasses import replace
    return replace(settings(private_tmp), slurm="24.11", slurm_root=ROOT24)


def test_the_slurm_version_is_a_knob_and_22_05_stays_the_default():
    assert settings_from_env(dict(PREFIX)).slurm == "22.05" and not settings_from_env(dict(PREFIX)).swaps_usr
    s = settings_from_env({**PREFIX, "ELASTIC_RAY_LAB_SLURM": "24.11", "ELASTIC_RAY_LAB_SLURM_ROOT": "/srv/r/"})
    assert (s.slurm, s.slurm_root, s.swaps_usr) == ("24.11", Path("/srv/r"), True)
    assert settings_from_env({**PREFIX, "ELASTIC_RAY_LAB_SLURM": "24.11"}).slurm_root == config.DEFAULT_SLURM_ROOT


@pytest.mark.parametrize("env, named", [
    ({"ELASTIC_RAY_LAB_SLURM": "23.02"}, "ELASTIC_RAY_LAB_SLURM"),
    ({"ELASTIC_RAY_LAB_SLURM": "24.11", "ELASTIC_RAY_LAB_SLURM_ROOT": "relative/root"}, "ELASTIC_RAY_LAB_SLURM_ROOT"),
    ({"ELASTIC_RAY_LAB_SLURM": "24.11", "ELASTIC_RAY_LAB_SLURM_ROOT": "/"}, "ELASTIC_RAY_LAB_SLURM_ROOT"),
    ({"ELASTIC_RAY_LAB_SLURM": "24.11", "ELASTIC_RAY_LAB_SLURM_ROOT": "/tmp/root"}, "ELASTIC_RAY_LAB_SLURM_ROOT"),
])
def test_a_bad_slurm_knob_is_refused_by_name(env, named):
    with pytest.raises(LabError, match=named):
        settings_from_env({**PREFIX, **env})


def test_24_11_leaves_out_only_the_lines_it_refuses():
    layout = compute_layout(4, "10.78.0")
    old, new = render_slurm_conf(settings(), layout, "cgroup"), render_slurm_conf(s24(), layout, "cgroup")
    assert conf_lines(old, "TaskPlugin") == ["TaskPlugin=task/none"] and not conf_lines(new, "TaskPlugin")
    assert [ln for ln in old.splitlines() if not ln.startswith("TaskPlugin=")] == new.splitlines()
    old_cg, new_cg = render_cgroup_conf(), render_cgroup_conf("24.11")
    assert conf_lines(old_cg, "CgroupAutomount") == ["CgroupAutomount=no"] and not conf_lines(new_cg, "CgroupAutomount")
    assert [ln for ln in old_cg.splitlines() if not ln.startswith("CgroupAutomount=")] == new_cg.splitlines()


def test_a_24_11_node_swaps_usr_before_anything_else_runs():
    node = compute_layout(4, "10.78.0")[0]
    old, new = node_boot_script(settings(), node).splitlines(), node_boot_script(s24(), node).splitlines()
    assert new[:3] == ["set -e", f"mount --bind {ROOT24}/usr /usr", f"mount --bind {ROOT24}/etc/ld.so.cache /etc/ld.so.cache"]
    assert [old[0], *old[1:]] == [new[0], *new[3:]]          # the rest is 22.05's script
    assert not any("/usr" in line for line in old)


@pytest.mark.parametrize("slurm, hostname, expected", [
    ("22.05", None, ["munged", "--x"]),
    ("22.05", "slurmctl", ["unshare", "--uts", "sh", "-c", 'echo slurmctl > /proc/sys/kernel/hostname && exec "$@"',
                           "sh", "munged", "--x"]),
    ("24.11", None, ["unshare", "--mount", "--propagation", "private", "sh", "-c",
                     f'mount --bind {ROOT24}/usr /usr && mount --bind {ROOT24}/etc/ld.so.cache /etc/ld.so.cache '
                     '&& exec "$@"', "sh", "munged", "--x"]),
])
def test_a_daemon_starts_in_the_namespaces_its_version_needs(slurm, hostname, expected):
    s = s24() if slurm == "24.11" else settings()
    assert config.daemon_argv(s, ["munged", "--x"], hostname=hostname) == expected


def test_24_11_clients_come_from_the_root_through_a_wrapper_that_cannot_loop():
    import subprocess
    text = config.render_client_wrapper(s24())
    assert f"root={ROOT24}" in text and '"/usr/bin/$name"' in text   # absolute: bin/ first on PATH cannot loop
    assert subprocess.run(["sh", "-n"], input=text, text=True).returncode == 0
    assert config.export_lines(Path("/l/etc/slurm.conf"), None) == "export SLURM_CONF=/l/etc/slurm.conf"
    assert config.export_lines(Path("/l/etc/slurm.conf"), Path("/l/bin")).splitlines() == [
        "export SLURM_CONF=/l/etc/slurm.conf", 'export PATH=/l/bin:"$PATH"']


def test_the_24_11_clients_are_first_on_the_lab_s_own_path(monkeypatch):
    from integration.labctl.daemons import daemon_env
    monkeypatch.setenv("PATH", f"/usr/bin:{LAB}/bin:/bin")
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    assert daemon_env(settings())["PATH"] == f"/usr/bin:{LAB}/bin:/bin"
    env = daemon_env(s24())
    assert env["PATH"] == f"{LAB}/bin:/usr/bin:/bin" and "SLURM_JOB_ID" not in env


def test_switching_the_slurm_version_restarts_the_lab_and_22_05_keeps_its_fingerprint():
    from dataclasses import replace
    files = {"slurm.conf": "x"}
    assert fingerprint(files, settings()) == fingerprint(files, replace(settings(), slurm_root=Path("/elsewhere")))
    assert fingerprint(files, settings()) != fingerprint(files, s24())
    assert fingerprint(files, s24()) != fingerprint(files, replace(s24(), slurm_root=Path("/elsewhere")))


@pytest.mark.parametrize("slurm", ["22.05", "24.11"])
def test_enforced_limits_turn_on_task_cgroup_and_the_memory_limit_only(slurm):
    from dataclasses import replace
    base = s24() if slurm == "24.11" else settings()
    layout = compute_layout(4, "10.78.0")
    free, limited = render_slurm_conf(base, layout, "cgroup"), render_slurm_conf(replace(base, limits=True), layout, "cgroup")
    assert conf_lines(limited, "TaskPlugin") == ["TaskPlugin=task/cgroup"]
    assert [ln for ln in free.splitlines() if not ln.startswith("TaskPlugin=")] == \
        [ln for ln in limited.splitlines() if not ln.startswith("TaskPlugin=")]
    cg = render_cgroup_conf(slurm, limits=True)
    assert conf_lines(cg, "ConstrainRAMSpace") == ["ConstrainRAMSpace=yes"]
    assert conf_lines(cg, "ConstrainCores") == ["ConstrainCores=no"]     # the nodes' CPUs are fiction
    assert conf_lines(cg, "AllowedSwapSpace") == ["AllowedSwapSpace=0"]
    assert render_cgroup_conf(slurm) == render_cgroup_conf(slurm, limits=False)
    assert settings_from_env({**PREFIX, "ELASTIC_RAY_LAB_LIMITS": "1"}).limits
    with pytest.raises(LabError, match="ELASTIC_RAY_LAB_LIMITS"):
        settings_from_env({**PREFIX, "ELASTIC_RAY_LAB_LIMITS": "yes"})


def test_the_memory_controller_is_looked_for_in_cgroup_v1_mounts():
    mounts = ("cgroup /sys/fs/cgroup/memory cgroup rw,relatime,memory 0 0\n"
              "cgroup2 /sys/fs/cgroup/unified cgroup2 rw,relatime 0 0\n")
    assert config.has_v1_controller(mounts, "memory") and not config.has_v1_controller(mounts, "freezer")
    assert not config.has_v1_controller("cgroup2 /sys/fs/cgroup cgroup2 rw,memory 0 0\n", "memory")


def test_a_knob_left_unset_keeps_the_running_lab_s_choice_and_a_lab_brought_down_chose_nothing(tmp_path):
    import json
    from dataclasses import replace
    from integration.labctl.lifecycle import running_settings
    s = replace(settings(lab_dir=tmp_path), slurm_root=ROOT24)
    assert running_settings(s, env={}) == s                        # no lab on record: as given
    (tmp_path / "lab.json").write_text(json.dumps({"slurm": "24.11", "slurm_root": "/srv/other", "limits": True}))
    assert running_settings(s, env={}) == s                        # recorded, but brought down (no PID dir)
    s.pid_dir.mkdir()                                              # up, or crashed: not brought down
    kept = running_settings(s, env={})
    assert (kept.slurm, kept.slurm_root, kept.limits) == ("24.11", Path("/srv/other"), True)
    # A knob that is set wins: `ELASTIC_RAY_LAB_SLURM=22.05 lab up` restarts the lab as 22.05.
    assert running_settings(s, env={"ELASTIC_RAY_LAB_SLURM": "22.05"}).slurm == "22.05"
    assert running_settings(s, env={"ELASTIC_RAY_LAB_LIMITS": "0"}).limits is False
    (tmp_path / "lab.json").write_text(json.dumps({"nodes": []}))   # a lab from before these fields
    assert running_settings(s, env={}) == s
