"""What Slurm accounting costs the lab: `lab up 4` wall time and the added daemons' idle RSS.

Alternates ``ELASTIC_RAY_LAB_ACCOUNTING=0`` (the lab as it was: no slurmdbd, no MariaDB) and
``=1`` for ``--runs`` rounds each: a fresh ``integration/lab up 4`` timed from the command's
start to its exit, then, after ``--idle`` seconds with nothing submitted, the RSS of mariadbd,
slurmdbd and slurmctld from their pid files (``/proc/PID/status`` VmRSS), then ``lab down``
(timed too).
Prints each run, then the median and range per setting.  Must run as root with no lab up, in
the lab's lock::

    flock /tmp/elastic-lab.lock nice python3 bench/bench_lab_accounting.py --runs 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from integration import labctl  # noqa: E402
from integration.labctl import accounting  # noqa: E402


def rss_mib(pid: int | None) -> float | None:
    if not labctl.pid_alive(pid):
        return None
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return None


def one_run(on: bool, idle: float) -> dict[str, float | None]:
    env = dict(os.environ, ELASTIC_RAY_LAB_ACCOUNTING="1" if on else "0")
    t0 = time.monotonic()
    subprocess.run([sys.executable, str(REPO / "integration" / "lab"), "up", "4"], env=env, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    took = time.monotonic() - t0
    time.sleep(idle)
    s = labctl.settings_from_env(env)
    row = {"up_s": took, "mariadbd_mib": rss_mib(accounting.mariadbd_pid(s)),
           "slurmdbd_mib": rss_mib(accounting.slurmdbd_pid(s)), "slurmctld_mib": rss_mib(labctl.ctld_pid(s))}
    t0 = time.monotonic()
    subprocess.run([sys.executable, str(REPO / "integration" / "lab"), "down"], env=env, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    row["down_s"] = time.monotonic() - t0
    return row


def summary(values: list[float | None]) -> str:
    known = [v for v in values if v is not None]
    if not known:
        return "-"
    return f"{statistics.median(known):.2f} ({min(known):.2f}-{max(known):.2f})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--idle", type=float, default=20.0, help="seconds idle before the RSS is read")
    args = parser.parse_args()
    if labctl.is_up():
        print("a lab is up: take it down first", file=sys.stderr)
        return 1
    rows: dict[bool, list[dict[str, float | None]]] = {False: [], True: []}
    for i in range(args.runs):
        for on in ((False, True) if i % 2 == 0 else (True, False)):
            row = one_run(on, args.idle)
            rows[on].append(row)
            print(f"run {i + 1} accounting={'on ' if on else 'off'} " + " ".join(
                f"{k}={'-' if v is None else f'{v:.2f}'}" for k, v in row.items()), flush=True)
    for on in (False, True):
        print(f"accounting {'on ' if on else 'off'}: " + "  ".join(
            f"{key} {summary([r[key] for r in rows[on]])}" for key in rows[on][0]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
