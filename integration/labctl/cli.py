"""``lab up [N] | down | status | env``: the command line over lifecycle.py (integration/lab runs it)."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

from .config import DEFAULT_NODES, SLURM_VERSIONS, LabError, Settings, export_lines, settings_from_env
from .accounting import mariadbd_pid, slurmdbd_pid
from .daemons import ctld_pid, daemon_env, munged_pid, slurmd_pid
from .lifecycle import _running, down, load_state, running_settings, state_nodes, up
from .procs import pid_alive
from .report import log

EXIT_DOWN = 3  # `lab status` exit code when the lab is not running


def _print_layout(s: Settings) -> None:
    cp = subprocess.run(["sinfo", "-o", "%10P %5D %6t %5c %8m %14G %N"], capture_output=True,
                        text=True, env=daemon_env(s), stdin=subprocess.DEVNULL, timeout=30)
    sys.stdout.write(cp.stdout)


def _status(s: Settings) -> int:
    if not _running(s):
        print(f"lab: DOWN ({s.lab_dir})")
        return EXIT_DOWN
    state = load_state(s)
    layout = state_nodes(state)
    limits = "limits enforced" if (state or {}).get("limits") else "no limits"
    print(f"lab: UP ({s.lab_dir}, {len(layout)} nodes, Slurm {s.slurm}, {limits}, SLURM_CONF={s.conf})")
    _print_layout(s)
    env = daemon_env(s)
    cp = subprocess.run(["squeue", "-o", "%.8i %.9P %.16j %.9T %.10M %.5D %R"], capture_output=True,
                        text=True, env=env, stdin=subprocess.DEVNULL, timeout=30)
    sys.stdout.write(cp.stdout)
    daemons = {"munged": munged_pid(s)}
    if (state or {}).get("accounting") or pid_alive(mariadbd_pid(s)) or pid_alive(slurmdbd_pid(s)):
        daemons.update({"mariadbd": mariadbd_pid(s), "slurmdbd": slurmdbd_pid(s)})
    daemons["slurmctld"] = ctld_pid(s)
    daemons.update({f"slurmd@{n.name}": slurmd_pid(s, n.name) for n in layout})
    for name, pid in daemons.items():
        print(f"  {name:18} pid {pid or '-':>7}  {'alive' if pid_alive(pid) else 'DEAD'}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="lab", description="elastic-ray's multi-node Slurm lab")
    sub = parser.add_subparsers(dest="cmd", required=True)
    p_up = sub.add_parser("up", help="start or repair an N-node lab")
    p_up.add_argument("n", nargs="?", type=int, default=DEFAULT_NODES)
    p_up.add_argument("--slurm", choices=SLURM_VERSIONS, default=None,
                      help="the Slurm version to run (default: $ELASTIC_RAY_LAB_SLURM, else 22.05); "
                           "another version than the running lab's restarts it")
    p_up.add_argument("--limits", action="store_true", default=None,
                      help="enforce each job's memory with cgroups (task/cgroup; also "
                           "ELASTIC_RAY_LAB_LIMITS=1); a lab started otherwise is restarted")
    sub.add_parser("down", help="stop the lab and remove its traces")
    sub.add_parser("status", help="exit 0 when up, 3 when down")
    sub.add_parser("env", help="print the export SLURM_CONF=... line")
    args = parser.parse_args(argv)
    try:
        if args.cmd == "up" and args.slurm:
            os.environ["ELASTIC_RAY_LAB_SLURM"] = args.slurm
        if args.cmd == "up" and args.limits:
            os.environ["ELASTIC_RAY_LAB_LIMITS"] = "1"
        s = settings_from_env()
        if args.cmd != "up":
            s = running_settings(s)
        if args.cmd == "up":
            info = up(args.n)
            _print_layout(s)
            print(info.export_line)
        elif args.cmd == "down":
            down()
        elif args.cmd == "status":
            return _status(s)
        elif args.cmd == "env":
            print(export_lines(s.conf, s.bin_dir if s.swaps_usr else None))
        return 0
    except LabError as e:
        hint = f" (see {e.log_file})" if e.log_file and str(e.log_file) not in str(e) else ""
        log(f"ERROR: {e}{hint}")
        return 1
    except BrokenPipeError:  # e.g. `lab status | head`: the reader left, nothing to report
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0

