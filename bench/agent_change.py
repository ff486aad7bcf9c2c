"""Before resolving a change to the agent's wakeups or start-up path: the
capacity after head loss and the idle agent's cost, of this tree against a
base commit, in one sitting (issue 26).

Prints figures; asserts nothing. Needs root and the Slurm lab (started here
if it is down, and stopped again):

    .venv/bin/python bench/agent_change.py --base 52aba06 [--rounds 5] [--idle-windows 5]

1. ``--base`` is checked out into a throw-away worktree with its own
   ``.venv`` (``scripts/bootstrap``); this tree runs as it is.
2. ``--rounds`` rounds of ``bench_head_capacity.py --runs 1 --orders
   host-first --modes off,supervised``, base then this tree in each round,
   both against the same lab: one table per mode, median (range) of every
   phase.
3. ``bench_idle_agent.py`` on this tree (``--idle-windows`` windows of 60 s):
   the idle CPU of a worker and a head agent. A change that buys reaction
   time with wakeups shows in both.

Why both at once: the idle agent was brought under 0.1 % of a core by
reading the head pointer only at beat wakeups and by writing the node file
at state changes only; the capacity figure moved 3.5 s in the same commits
(a joining worker's 2 s Ray pause, found only later). Each bench alone
looked fine. Hold the lab lock (``--lock``) so that nothing else runs.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PHASES = ("driver ended", "elected", "host ready", "host worker", "other worker", "task runs", "work again")
_RUN = re.compile(r"^run 1 (\w+)\s+(.*)$")
_PHASE = re.compile(r"([a-z][a-z ]*?)=(-|[0-9.]+)")


def parse_runs(output: str) -> dict[str, dict[str, float]]:
    """mode -> phase -> seconds, from the ``run 1 MODE phase=x ...`` lines of one capacity run."""
    found: dict[str, dict[str, float]] = {}
    for line in output.splitlines():
        m = _RUN.match(line.strip())
        if m:
            found[m.group(1)] = {k.strip(): float(v) for k, v in _PHASE.findall(m.group(2)) if v != "-"}
    return found


def table(samples: dict[str, list[dict[str, float]]], mode: str) -> str:
    builds = list(samples)
    lines = [f"mode {mode}: seconds after scancel, median (range) of {[len(samples[b]) for b in builds]} runs",
             "| phase | " + " | ".join(builds) + " |", "|---|" + "---|" * len(builds)]
    for phase in PHASES:
        cells = []
        for build in builds:
            xs = [run[phase] for run in samples[build] if phase in run]
            cells.append(f"{statistics.median(xs):.2f} ({min(xs):.2f}-{max(xs):.2f})" if xs else "-")
        lines.append(f"| {phase} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _run(cmd: list[str], cwd: Path, env: dict[str, str], lock: str) -> str:
    full = ["flock", lock, *cmd] if lock else cmd
    done = subprocess.run(full, cwd=cwd, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        print(done.stdout[-2000:], done.stderr[-2000:], sep="\n", file=sys.stderr)
    return done.stdout


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", required=True, help="the commit to compare against (e.g. main before the change)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--idle-windows", type=int, default=5, help="0: no idle bench")
    ap.add_argument("--lock", default="/tmp/elastic-lab.lock", help="flock file held around each bench ('' for none)")
    args = ap.parse_args(argv)
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")

    # Run as a script (bench/ first on sys.path), this needs the repository root for
    # `integration`, like the other benches; here and not at import, because
    # tests/test_bench_agent_change.py imports this module for its pure parts.
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    from integration import labctl  # the lab's own controller

    started = not labctl.is_up()
    if started:
        labctl.up(4)
    env = {**os.environ, "ELASTIC_RAY_LAB_DIR": str(labctl.settings_from_env().lab_dir)}
    work = Path(tempfile.mkdtemp(prefix="agent-change-", dir="/work" if Path("/work").is_dir() else None))
    base_tree = work / "base"
    try:
        subprocess.run(["git", "worktree", "add", "--detach", str(base_tree), args.base], cwd=REPO, check=True,
                       capture_output=True)
        subprocess.run(["bash", "scripts/bootstrap"], cwd=base_tree, check=True)
        trees = {f"base {args.base}": base_tree, "this tree": REPO}
        samples: dict[str, dict[str, list[dict[str, float]]]] = {"off": {}, "supervised": {}}
        for r in range(args.rounds):
            for name, tree in trees.items():
                out = _run([str(tree / ".venv/bin/python"), "bench/bench_head_capacity.py", "--runs", "1",
                            "--orders", "host-first", "--modes", "off,supervised"], tree, env, args.lock)
                runs = parse_runs(out)
                for mode, phases in runs.items():
                    samples.setdefault(mode, {}).setdefault(name, []).append(phases)
                print(f"round {r + 1} {name}: " + "; ".join(
                    f"{mode} task runs {ph.get('task runs', '-')}" for mode, ph in runs.items()), flush=True)
        for mode in ("off", "supervised"):
            if samples.get(mode):
                print("\n" + table(samples[mode], mode))
        if args.idle_windows > 0:
            print("\nidle agent, this tree:")
            print(_run([sys.executable, "bench/bench_idle_agent.py", "--windows", str(args.idle_windows)],
                       REPO, env, args.lock))
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(base_tree)], cwd=REPO, capture_output=True)
        shutil.rmtree(work, ignore_errors=True)
        if started:
            labctl.down()
    return 0


if __name__ == "__main__":
    sys.exit(main())
