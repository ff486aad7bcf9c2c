"""The lab's life: the state file, ``up`` (a fresh start, or a repair of the same layout),
``down``, and the questions tests ask (``is_up``, ``nodes``, ``lab_dir``, ``slurm_conf_path``)."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import time
from pathlib import Path
from typing import Mapping

from .config import (
    DEFAULT_NODES,
    LabError,
    LabInfo,
    Node,
    Settings,
    choose_proctrack,
    compute_layout,
    fingerprint,
    has_v1_controller,
    render_cgroup_conf,
    render_gres_conf,
    render_hosts_block,
    render_slurm_conf,
    render_slurmdbd_conf,
    settings_from_env,
    strip_hosts_block,
    with_hosts_block,
)
from .accounting import accounting_pids, start_mariadb, start_slurmdbd
from .daemons import (
    ctld_pid,
    ctld_pids,
    munged_pid,
    node_pids,
    remove_cgroups,
    start_munged,
    start_slurmctld,
    start_slurmd,
    wait_nodes,
)
from .files import link_etc_slurm, make_dirs, unlink_etc_slurm, write_client_wrappers, write_files
from .net import net_down, net_intact, net_up, netns_pids, rewrite_hosts
from .packages import ensure_packages, ensure_root
from .procs import _run, pid_alive, stop_pids
from .report import _since, log


def load_state(s: Settings) -> dict | None:
    try:
        return json.loads(s.state_file.read_text())
    except (OSError, ValueError):
        return None


def state_nodes(state: dict | None) -> list[Node]:
    return [Node(*row) for row in (state or {}).get("nodes", [])]


def running_settings(s: Settings, env: Mapping[str, str] | None = None) -> Settings:
    """``s`` with the Slurm version, root and limits of the lab its state file records, for each
    knob ``env`` (default: this process's environment) does not set: a shell (or a test, or a
    repair in the middle of a fault scenario) that did not say which Slurm talks to the running
    one with its clients, and ``up`` keeps it rather than restart it as the default.

    Only a lab that was not brought down counts (its PID directory is there: ``down`` removes it,
    a crash or a killed slurmctld does not). The state file outlives ``down`` on purpose, but a lab
    brought down chose nothing for the next one: after ``scripts/lab-variants`` (which ends on
    24.11) a plain ``lab up`` is the default lab again, not a silent 24.11 one."""
    env = os.environ if env is None else env
    state = (load_state(s) or {}) if s.pid_dir.is_dir() else {}
    changes: dict = {}
    if "ELASTIC_RAY_LAB_SLURM" not in env and state.get("slurm"):
        changes["slurm"] = state["slurm"]
        if "ELASTIC_RAY_LAB_SLURM_ROOT" not in env and state.get("slurm_root"):
            changes["slurm_root"] = Path(state["slurm_root"])
    if "ELASTIC_RAY_LAB_LIMITS" not in env and "limits" in state:
        changes["limits"] = bool(state["limits"])
    return dataclasses.replace(s, **changes) if changes else s


def require_root() -> None:
    if os.geteuid() != 0:
        raise LabError("the Slurm lab must run as root (namespaces, bridge, /etc/hosts)")


def lab_dir() -> Path:
    return settings_from_env().lab_dir


def slurm_conf_path() -> Path:
    return settings_from_env().conf


def _other_lab_dirs(s: Settings) -> list[str]:
    """Lab dirs named by the markers of other labs in /etc/hosts."""
    try:
        text = Path("/etc/hosts").read_text()
    except OSError:
        return []
    found = []
    for line in text.splitlines():
        if line.startswith("# >>> elastic-ray-lab "):
            where = line[len("# >>> elastic-ray-lab "):].rstrip(" >")
            if where != str(s.lab_dir) and where not in found:
                found.append(where)
    return found


def _lab_alive(s: Settings, *, namespaces: bool = True) -> bool:
    """Any process of the lab in s.lab_dir alive: its daemons (by their pid files) or, with
    ``namespaces``, anything in the network namespaces its state file names."""
    pids = node_pids(s, state_nodes(load_state(s)))[0] if namespaces else set()
    return bool(pids or ctld_pids(s) or any(accounting_pids(s)) or pid_alive(munged_pid(s)))


def _take_over_bridge(s: Settings, *, ours: bool) -> None:
    """The bridge exists but this lab dir has no record of it: it belongs to another checkout's lab.

    A live one is left alone (taking it down would kill someone else's cluster, and a second lab
    could not bind Slurm's fixed ports anyway). A dead one, whose every process is gone (what a
    killed session or CI run leaves: the bridge, the namespaces and the hosts block outlive their
    processes), is taken down by its own state file, so that this lab can start. ``ours``: this
    lab dir has a state file too (its own namespaces, same names, may be busy: they are not the
    other lab's sign of life).
    """
    owners = _other_lab_dirs(s)
    run_netns = Path("/run/netns")
    namespaces = sorted(p.name for p in run_netns.glob(f"{s.bridge}-*")) if run_netns.is_dir() else []
    alive = [o for o in owners if _lab_alive(dataclasses.replace(s, lab_dir=Path(o)), namespaces=not ours)]
    if alive or (not ours and any(netns_pids(ns) for ns in namespaces)):
        raise LabError(f"bridge {s.bridge} is in use by another lab ({', '.join(alive or owners) or 'unknown dir'}); "
                       f"stop it with ELASTIC_RAY_LAB_DIR=<that dir> integration/lab down, or reuse it by "
                       f"setting ELASTIC_RAY_LAB_DIR")
    log(f"up: bridge {s.bridge} was left by a lab none of whose processes is alive "
        f"({', '.join(owners) or 'no dir on record'}); taking it down first")
    for owner in owners:
        _down(dataclasses.replace(s, lab_dir=Path(owner)), quiet=True)
    # An owner whose state file is gone named no namespaces: the empty ones under our
    # bridge's prefix are its too.
    for ns in [] if ours else namespaces:
        if Path(run_netns / ns).exists():
            _run(["ip", "netns", "del", ns], check=False)
    net_down(s, [])


def _running(s: Settings) -> bool:
    return load_state(s) is not None and pid_alive(ctld_pid(s))


def is_up() -> bool:
    """True when this lab's slurmctld is alive (zombie-aware) and its layout is recorded."""
    try:
        return _running(settings_from_env())
    except LabError:
        return False


def nodes() -> list[Node]:
    """The running lab's nodes as (name, ip, partition, gres) tuples; [] when it is down."""
    s = settings_from_env()
    return state_nodes(load_state(s)) if _running(s) else []


def up(n: int = DEFAULT_NODES) -> LabInfo:
    """Bring up an n-node lab, or repair the running one if it has the same layout."""
    t0 = time.monotonic()
    s = running_settings(settings_from_env())   # a knob left unset keeps the running lab's choice
    require_root()
    for note in s.notes:
        log(note)
    s.log_dir.mkdir(parents=True, exist_ok=True)
    ensure_packages(s)
    ensure_root(s)

    layout = compute_layout(n, s.subnet)
    mounts = Path("/proc/mounts").read_text()
    proctrack = choose_proctrack(mounts)
    if s.limits and not (proctrack == "cgroup" and has_v1_controller(mounts, "memory")):
        raise LabError("ELASTIC_RAY_LAB_LIMITS=1 needs cgroup v1 (freezer and memory controllers mounted); "
                       "this machine has none, so limits cannot be enforced here")
    files = {
        "slurm.conf": render_slurm_conf(s, layout, proctrack),
        "gres.conf": render_gres_conf(s, layout),
        "cgroup.conf": render_cgroup_conf(s.slurm, s.limits),
    }
    if s.accounting:
        files["slurmdbd.conf"] = render_slurmdbd_conf(s)
    fp = fingerprint(files, s)
    info = LabInfo(s.lab_dir, s.conf, layout, s.private_tmp, s.shared_dir, notes=list(s.notes),
                   slurm=s.slurm, bin_dir=s.bin_dir if s.swaps_usr else None)

    state = load_state(s)
    if Path(f"/sys/class/net/{s.bridge}").exists() and (state is None or _other_lab_dirs(s)):
        # Before a repair: the namespaces of another lab on the same bridge have our names.
        _take_over_bridge(s, ours=state is not None)
        state = load_state(s)
    if state and state.get("fingerprint") == fp and net_intact(s, layout):
        repaired = _repair(s, layout)
        info.action = "repaired" if repaired else "up"
        what = f"restarted {', '.join(repaired)}" if repaired else "nothing to do"
        log(f"up: {n} nodes already running; {what} ({_since(t0)})")
        return info

    if state is not None or Path(f"/sys/class/net/{s.bridge}").exists():
        if _running(s):
            log("up: a lab with another layout or config is running; restarting it")
        _down(s, quiet=True)

    try:
        _fresh_start(s, layout, files, fp, proctrack)
    except BaseException:
        # Leave nothing half-started behind (a munged without a controller,
        # namespaces without nodes): undo, then report the original error.
        try:
            _down(s, quiet=True)
        except Exception as exc:  # noqa: BLE001 - the first error is the one to report
            log(f"up: cleanup after the failed start also failed: {exc}")
        raise
    info.action = "started"
    log(f"up: {n} nodes in {_since(t0)} (proctrack/{proctrack}, private tmp "
        f"{'on' if s.private_tmp else 'off'})")
    return info


def _fresh_start(s: Settings, layout: list[Node], files: dict[str, str], fp: str,
                 proctrack: str) -> None:
    # A fresh cluster forgets old jobs and node dirs, but keeps the munge key and the logs
    # (truncated, so that errors in them belong to this run).
    for sub in ("state", "pid", "nodes", "dev", "etc", "shared"):
        shutil.rmtree(s.lab_dir / sub, ignore_errors=True)
    make_dirs(s, layout)
    for logf in s.log_dir.glob("*.log"):
        if logf.name != "apt.log":
            logf.write_text("")
    write_files(s, files, layout)
    write_client_wrappers(s)
    # Written before anything is created, so that `down` can always find what to remove,
    # even if the knobs in the environment have changed since.
    s.state_file.write_text(json.dumps(
        {"fingerprint": fp, "bridge": s.bridge, "subnet": s.subnet, "proctrack": proctrack,
         "private_tmp": s.private_tmp, "accounting": s.accounting, "nodes": [list(n) for n in layout],
         "slurm": s.slurm, "slurm_root": str(s.slurm_root) if s.swaps_usr else None, "limits": s.limits},
        indent=1) + "\n")
    link_etc_slurm(s)
    block = render_hosts_block(s.hosts_tag, s.ctl_ip, layout)
    rewrite_hosts(lambda text: with_hosts_block(text, s.hosts_tag, block))
    net_up(s, layout)
    start_munged(s)
    if s.accounting:
        start_mariadb(s)
        start_slurmdbd(s)  # registers the cluster, which slurmctld then finds
    start_slurmctld(s)
    for node in layout:
        start_slurmd(s, node)
    wait_nodes(s, [n.name for n in layout], lambda st: st == "idle", "idle")


def _repair(s: Settings, layout: list[Node]) -> list[str]:
    """Restart whatever died (munged, slurmctld, single slurmds) without touching jobs.

    slurmctld recovers its jobs from StateSaveLocation, and a restarted slurmd reattaches to
    the slurmstepds of running jobs through its spool dir.
    """
    make_dirs(s, layout)
    write_client_wrappers(s)
    link_etc_slurm(s)
    block = render_hosts_block(s.hosts_tag, s.ctl_ip, layout)
    rewrite_hosts(lambda text: with_hosts_block(text, s.hosts_tag, block))
    restarted = []
    if start_munged(s):
        restarted.append("munged")
    if s.accounting:
        if start_mariadb(s):
            restarted.append("mariadbd")
        if start_slurmdbd(s):
            restarted.append("slurmdbd")
    ctld_restarted = start_slurmctld(s)
    if ctld_restarted:
        restarted.append("slurmctld")
    nodes_restarted = [n.name for n in layout if start_slurmd(s, n)]
    restarted += [f"slurmd@{n}" for n in nodes_restarted]
    # Nodes may be running jobs, so "idle" is too strict: wait until the restarted ones respond
    # (all of them after a slurmctld restart: it recovers every node as "unk" until it
    # re-registers).  A trailing '*' means "not responding"; an admin's plain "down" stays.
    to_wait = [n.name for n in layout] if ctld_restarted else nodes_restarted
    wait_nodes(s, to_wait, lambda st: not st.endswith("*") and st not in ("unk", "missing"),
               "responding")
    return restarted


def down() -> None:
    """Stop everything this lab started and remove its traces; harmless when already down."""
    s = settings_from_env()
    require_root()
    _down(s)


def _down(s: Settings, quiet: bool = False) -> None:
    t0 = time.monotonic()
    state = load_state(s) or {}
    layout = state_nodes(state)
    # Names of netns/bridge come from what was actually brought up, not from today's knobs.
    s = dataclasses.replace(s, bridge=state.get("bridge", s.bridge))
    # Nodes first, while slurmctld and munged still answer: a slurmd that is cleaning up a job
    # keeps retrying to report to a vanished controller for MessageTimeout (10 s).
    pids, slurmds = node_pids(s, layout)
    left = stop_pids(pids, slurmds) if pids else set()
    # Then the control side, each after the one that talks to it: slurmctld (it reports to
    # slurmdbd), slurmdbd (it writes to mariadbd), mariadbd, and munged last (all use it).
    for group in (ctld_pids(s), *accounting_pids(s), {p for p in (munged_pid(s),) if pid_alive(p)}):
        if group:
            left |= stop_pids(group, group)
            pids |= group
    net_down(s, layout)
    if os.path.exists("/etc/hosts"):
        rewrite_hosts(lambda text: strip_hosts_block(text, s.hosts_tag))
    remove_cgroups(layout)
    unlink_etc_slurm(s)
    for sub in ("state", "pid", "nodes", "shared"):
        shutil.rmtree(s.lab_dir / sub, ignore_errors=True)
    (s.munge_dir / "munged.pid").unlink(missing_ok=True)  # the key stays, the PID is history
    if left:
        raise LabError(f"down: processes still alive after SIGKILL: {sorted(left)}")
    if not quiet:
        log(f"down: stopped {len(pids)} processes in {_since(t0)} (logs kept in {s.log_dir})")
